from datetime import datetime

import pytest

from analytics.slo import failures_needed, find_incidents
from analytics.store import Store
from analytics.ingest import Ingestor
from enrich.tiers import TierResolver
from sloscope.slo_spec import SpecError, load_spec, parse_spec
from tests.otlp_builders import span, traces, write_lines

GOOD = """
default_tier: standard
tiers:
  gold: {latency: {percentile: 99, threshold_ms: 800}, availability: 99.9}
  standard: {latency: {percentile: 95, threshold_ms: 200}, availability: 99.5}
window: 30d
resolution: 10s
"""


def test_the_built_in_spec_is_the_design_example():
    spec = load_spec(None)
    assert spec.default_tier == "standard" and spec.resolution_s == 10 and spec.window_s == 30 * 86400
    critical = spec.tiers["p99-latency-critical"]
    assert (critical.percentile, critical.threshold_ms) == (99, 800)
    assert critical.error_budget == pytest.approx(0.001)


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.replace("default_tier: standard", "default_tier: bronze"), "default_tier: 'bronze' is not one of"),
    (lambda s: s.replace("percentile: 99,", "percentile: 100,"), "tiers.gold.latency.percentile: expected a number in (0, 100)"),
    (lambda s: s.replace("threshold_ms: 800", "threshold_ms: fast"), "tiers.gold.latency.threshold_ms: expected a number"),
    (lambda s: s.replace("availability: 99.9", "availabilty: 99.9"), "tiers.gold: unknown key 'availabilty'"),
    (lambda s: s.replace("resolution: 10s", "resolution: ten"), "resolution: expected a duration"),
    (lambda s: s.replace("  gold:", "  Gold Tier:"), "tier names are lower-case"),
    (lambda s: s + "  broken: [", "not valid YAML"),
])
def test_bad_specs_name_file_key_and_expectation(tmp_path, edit, message):
    path = tmp_path / "slo.yaml"
    path.write_text(edit(GOOD))
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_a_missing_spec_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the SLO spec"):
        load_spec(tmp_path / "nope.yaml")


def test_failures_needed_tests_against_the_budget():
    assert failures_needed(30, 0.001) == 2  # one failure in 30 is not yet improbable at a 0.1 % budget
    assert failures_needed(1000, 0.005) > 5  # far above the expected 5 needed before it is a violation
    assert failures_needed(10, 0.5) > 5


T0 = 1_764_410_400_000_000_000
S = 1_000_000_000


def _spans(node, start_s, seconds, latency_ms, fail_every=0, rate=10, base=0):
    out = []
    for i in range(seconds * rate):
        n = base + i
        out.append(span(f"{n:032x}", f"{n:016x}", T0 + (start_s * S) + i * S // rate, latency_ms,
                        status=500 if fail_every and i % fail_every == 0 else 200, tier=["gold"]))
    return traces(out, node=node)


def test_violating_windows_merge_into_incidents_per_tier_service_node(tmp_path):
    spec = parse_spec(GOOD)
    lines = [
        _spans("n1", 0, 300, 100),  # healthy
        _spans("n1", 300, 40, 1500, base=10_000),  # 40 s slow: an incident
        _spans("n1", 340, 60, 100, base=20_000),
        _spans("n1", 400, 10, 1500, base=30_000),  # a single slow window: a blip, not an incident
        _spans("n1", 410, 60, 100, base=40_000),
        _spans("n2", 0, 470, 100, base=100_000),  # the other node stays healthy...
        _spans("n2", 200, 30, 100, fail_every=5, base=200_000),  # ...but for 30 s of 20 % errors
    ]
    with Store(tmp_path / "x.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files([write_lines(tmp_path / "s.jsonl", lines)])
        incidents = find_incidents(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert [(i.node, i.sli["kind"]) for i in incidents] == [("n2", "availability"), ("n1", "latency")]
    n2, n1 = incidents
    assert n1.start == datetime(2025, 11, 29, 10, 5, 0) and n1.end == datetime(2025, 11, 29, 10, 5, 40)
    assert n1.sli["observed_ms"] == pytest.approx(1500, rel=0.01) and n1.sli["objective_ms"] == 800
    assert n2.sli["observed_error_ratio"] == pytest.approx(0.1, abs=0.01)  # half the traffic failing 1 in 5
