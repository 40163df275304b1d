"""The one duration grammar (docs/slo-spec.md): what each former parser took is still taken, the rest is refused
with where the value was and what a duration looks like, and every configuration error is one ConfigError."""

import pytest

from sloscope.alerts.actions import ConfigError as RemediationConfigError
from sloscope.collectors.config import ConfigError as CollectorConfigError
from sloscope.sampling.config import ConfigError as SamplingConfigError
from sloscope.durations import format_duration, parse_duration
from sloscope.errors import ConfigError
from sloscope.slo_spec import SpecError, parse_spec


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("7d", 604800), ("2w", 1209600), ("250ms", 0.25),  # Prometheus
    ("90", 90), ("2.5", 2.5), ("1e3", 1000), (" 10 s ", 10), ("500ms", 0.5), (".5s", 0.5),  # the collector's
    ("20min", 1200), ("1.5h", 5400), ("1H30M", 5400), ("1h 30m", 5400), ("10min30s", 630),  # the simulator's
    (45, 45), (0.25, 0.25),  # YAML numbers: seconds
])
def test_every_form_the_three_parsers_took_is_one_grammar(text, seconds):
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["soon", "", "10 seconds", "-5s", "5m3", "1e400", "inf", True, None, [30],
                                   float("nan")])
def test_what_is_not_a_duration_is_named_with_where_it_was(value):
    with pytest.raises(ConfigError) as exc:
        parse_duration(value, "slo.yaml: window")
    message = str(exc.value)
    assert message.startswith("slo.yaml: window: expected a duration like ")
    assert f"{value!r} is not a duration" in message


def test_zero_and_below_are_refused():
    with pytest.raises(ConfigError, match="--every: expected a duration above zero; got '0s'"):
        parse_duration("0s", "--every")
    with pytest.raises(ConfigError, match=r"^expected a duration above zero; got -1$"):
        parse_duration(-1)


def test_the_spec_reads_the_same_grammar_and_says_spec_error():
    base = "default_tier: a\ntiers: {a: {latency: {percentile: 99, threshold_ms: 5}, availability: 99}}\n"
    spec = parse_spec(base + "window: 1w\nresolution: 1m30s\n", "s.yaml")
    assert (spec.window_s, spec.resolution_s) == (604800, 90)
    assert parse_spec(base + "window: 2592000\n", "s.yaml").window_s == 2592000
    with pytest.raises(SpecError, match="s.yaml: window: expected a duration"):
        parse_spec(base + "window: monthly\n", "s.yaml")


def test_each_configuration_error_is_caught_as_one():
    assert issubclass(SpecError, ConfigError) and issubclass(ConfigError, ValueError)
    assert CollectorConfigError is SamplingConfigError is RemediationConfigError is ConfigError


@pytest.mark.parametrize("seconds, text", [(600, "10m"), (5400, "1h30m"), (7 * 86400, "1w"), (90061, "1d1h1m1s"),
                                           (0.25, "250ms")])
def test_a_duration_is_written_in_the_grammar_and_reads_back(seconds, text):
    assert format_duration(seconds) == text and parse_duration(text) == seconds
