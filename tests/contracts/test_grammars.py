"""The grammars every stage reads through floor 0: sizes (Kubernetes quantities of bytes), HOST:PORT, and RFC 3339
or relative times, each error naming where its value came from."""

import time
from datetime import datetime, timedelta, timezone

import pytest

from sloscope.addresses import address_text, parse_address
from sloscope.errors import ConfigError
from sloscope.sizes import parse_size, size_text
from sloscope.times import parse_rfc3339, parse_time, rfc3339, rfc3339_or_none


@pytest.mark.parametrize("text, expected", [
    ("268435456", 268435456), (268435456, 268435456), ("256MiB", 2**28), ("256Mi", 2**28), ("256mib", 2**28),
    ("256MB", 256_000_000), ("256M", 256_000_000), ("1.5GiB", 1_610_612_736), ("1.5Gi", 1_610_612_736),
    ("64k", 64_000), ("64K", 64_000), ("64KiB", 65_536), ("0.5KiB", 512), ("1e9", 10**9), (" 3 GB ", 3 * 10**9),
    ("2TiB", 2 * 2**40), ("1P", 10**15), ("1Ei", 2**60), ("512b", 512),
])
def test_sizes_read_binary_and_decimal_units_as_kubernetes_quantities_do(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, says", [
    ("1.3", "not a whole number of bytes"), ("0", "above zero"), ("0MiB", "above zero"), ("-1", "is not a size"),
    ("abc", "is not a size"), ("12 parsecs", "is not a size"), (True, "is not a size"), (None, "is not a size"),
    ("1m5", "is not a size"),
])
def test_a_size_that_is_not_one_names_where_it_came_from(text, says):
    with pytest.raises(ConfigError, match=f"^--max-inflight-bytes: .*{says}"):
        parse_size(text, "--max-inflight-bytes")


def test_a_bare_lower_case_m_is_refused_as_ambiguous():
    """Kubernetes reads 256m as 0.256: no byte count means milli, and guessing mega or mebi would be a guess."""
    with pytest.raises(ConfigError, match="^--queue-bytes: '256m' is ambiguous: Kubernetes reads m as milli"):
        parse_size("256m", "--queue-bytes")
    assert parse_size("256mb") == 256_000_000 and parse_size("256mi") == 2**28


@pytest.mark.parametrize("text", ["8Ei", "1e19", "9" * 20, 2**63, "1e9999999", "1" * 100])
def test_a_size_past_what_a_count_holds_is_refused_at_once(text):
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="^spool.max_bytes: "):
        parse_size(text, "spool.max_bytes")
    assert time.perf_counter() - started < 0.1  # a hostile exponent is refused by the grammar, never computed


@pytest.mark.parametrize("n", [1, 1000, 1024, 33_554_432, 3 * 2**30, 5 * 2**40 + 1024, 2**60])
def test_size_text_reads_back_as_the_same_size(n):
    assert parse_size(size_text(n)) == n


@pytest.mark.parametrize("text, expected", [
    ("0.0.0.0:4318", ("0.0.0.0", 4318)), (":4318", ("127.0.0.1", 4318)), ("[::1]:9465", ("::1", 9465)),
    ("[::]:0", ("::", 0)), ("localhost:65535", ("localhost", 65535)), (" 10.0.0.1:80 ", ("10.0.0.1", 80)),
    ("[::ffff:10.0.0.1]:80", ("::ffff:10.0.0.1", 80)), ("[FE80::1]:80", ("FE80::1", 80)), ("h:00080", ("h", 80)),
])
def test_addresses_default_to_loopback_and_read_ipv6_in_brackets(text, expected):
    assert parse_address(text) == expected
    assert parse_address(address_text(expected)) == expected


@pytest.mark.parametrize("text", [
    "4318", "host:", "host:port", "h:65536", "h:99999", "h:000080", "::1:80", "off", "", ":-1", ":+80", ": 80",
    # only ASCII digits are a port: str.isdigit takes a superscript (which int() then refuses) and other scripts'
    ":\u00b2", ":\u0663", "h:\uff18\uff10",
    # brackets hold an IPv6 address, and only one
    "[::1:80", "::1]:80", "a]:80", "[a:80", "[]:80", "[host]:80", "[[::1]]:80", "[::1]x:80",
    "two words:80", "a:b:80",
])
def test_an_address_that_is_not_one_names_where_it_came_from(text):
    with pytest.raises(ConfigError) as caught:
        parse_address(text, "--http")
    assert str(caught.value) == ("--http: expected HOST:PORT (like 127.0.0.1:4318, :4318 or [::1]:4318); "
                                 f"got {text.strip()!r}")


@pytest.mark.parametrize("text", ["off", "OFF", "Off", " oFf "])
def test_off_in_any_case_is_an_address_only_where_a_listener_may_be_off(text):
    assert parse_address(text, may_be_off=True) is None


@pytest.mark.parametrize("text", ["of", "none", "false", "no", "0", ":\u00b2"])
def test_off_has_one_word_and_the_error_says_it(text):
    with pytest.raises(ConfigError) as caught:
        parse_address(text, "collector.yaml:2: listen", may_be_off=True)
    assert str(caught.value) == ("collector.yaml:2: listen: expected HOST:PORT (like 127.0.0.1:4318, :4318 or "
                                 f"[::1]:4318) or off; got {text!r}")


@pytest.mark.parametrize("text, expected", [
    ("2026-12-07T10:30:00Z", datetime(2026, 12, 7, 10, 30)), ("2026-12-07t10:30:00z", datetime(2026, 12, 7, 10, 30)),
    ("2026-12-07 10:30:00", datetime(2026, 12, 7, 10, 30)), ("2026-12-07", datetime(2026, 12, 7)),
    ("2026-12-07T10:30:00.123456789+01:00", datetime(2026, 12, 7, 9, 30, 0, 123456)),
    ("2026-12-07T01:00:00-02:30", datetime(2026, 12, 7, 3, 30)),
])
def test_rfc3339_times_come_back_as_naive_utc(text, expected):
    assert parse_rfc3339(text) == expected == rfc3339_or_none(text)


@pytest.mark.parametrize("text, says", [
    ("yesterday", "expected an RFC 3339 time"), ("2026-02-30T00:00:00Z", "not a day and time of the calendar"),
    ("0001-01-01T00:00:00+01:00", "outside the years 1 to 9999"), ("2026-12-07T10:30Z", "expected an RFC 3339"),
    ("1700000000", "expected an RFC 3339"),
])
def test_a_time_that_is_not_one_names_where_it_came_from(text, says):
    for zone_required in (False, True):
        with pytest.raises(ConfigError, match=f"^alerts\\[0\\].startsAt: .*{says}"):
            parse_rfc3339(text, "alerts[0].startsAt", zone_required=zone_required)
    assert rfc3339_or_none(text) is None


@pytest.mark.parametrize("text", ["2026-12-07", "2026-12-07T10:30:00", "2026-12-07 10:30:00.5"])
def test_a_time_a_program_wrote_must_name_its_zone(text):
    parse_rfc3339(text)  # a user's shorthand, read as UTC
    with pytest.raises(ConfigError, match=f"^alerts\\[0\\].endsAt: '{text}' has no zone: expected an RFC 3339 time"):
        parse_rfc3339(text, "alerts[0].endsAt", zone_required=True)


@pytest.mark.parametrize("text", ["2026-12-07T10:30:00.123456789Z", "0001-01-01T00:00:00Z",
                                  "2026-12-07t11:30:00+01:00"])
def test_a_time_with_its_zone_reads_the_same_where_the_zone_is_required(text):
    assert parse_rfc3339(text, zone_required=True) == parse_rfc3339(text)


def test_relative_times_count_back_from_the_reference_and_errors_name_the_parameter():
    newest = datetime(2026, 12, 7, 12, 0)
    assert parse_time("1h30m", newest, "--since") == datetime(2026, 12, 7, 10, 30)
    assert parse_time("2026-12-07T11:00:00Z", None, "--since") == datetime(2026, 12, 7, 11)
    with pytest.raises(ConfigError, match="^query parameter since: 'soon' is neither an RFC 3339 time nor a "):
        parse_time("soon", newest, "query parameter since")
    with pytest.raises(ConfigError, match="^--at: expected a duration above zero"):
        parse_time("0s", newest, "--at")
    with pytest.raises(ConfigError, match="^--until: a relative time counts back from the newest stored request"):
        parse_time("5m", None, "--until")


def test_rfc3339_writes_what_it_reads():
    t = datetime(2026, 12, 7, 10, 30, 5)
    assert rfc3339(t) == "2026-12-07T10:30:05Z" and parse_rfc3339(rfc3339(t)) == t


@pytest.mark.parametrize("t, text", [
    (datetime(2026, 12, 7, 10, 30, 5), "2026-12-07T10:30:05Z"),
    (datetime(2026, 12, 7, 10, 30, 5, 500000), "2026-12-07T10:30:05.5Z"),
    (datetime(2026, 12, 7, 10, 30, 5, 123456), "2026-12-07T10:30:05.123456Z"),
    (datetime(2026, 12, 7, 11, 30, 5, 250000, tzinfo=timezone(timedelta(hours=1))), "2026-12-07T10:30:05.25Z"),
])
def test_rfc3339_writes_the_fraction_where_asked_and_reads_it_back(t, text):
    assert rfc3339(t, fraction=True) == text
    assert parse_rfc3339(text) == (t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t)
    assert rfc3339(t) == rfc3339(t.replace(microsecond=0), fraction=True)  # without it, whole seconds
