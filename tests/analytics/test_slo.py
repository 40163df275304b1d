import itertools
import math
from datetime import datetime, timedelta

import pytest

import numpy as np
import polars as pl

from sloscope.catalog import EVERY_NODE
from sloscope.analytics.significance import fleet_discoveries, poisson_critical_approx, poisson_tail
from sloscope.analytics import slo
from sloscope.analytics.slo import (MAX_BLOCK_WINDOWS, MIN_BLOCK_REQUESTS, _blocks, find_incidents, sli_windows,
                                    window_latencies)
from sloscope.analytics.store import Store
from sloscope.analytics.ingest import Ingestor
from sloscope.enrich.tiers import TierResolver
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


def _poisson_tail_by_summing(k, expected):
    return 1.0 - sum(math.exp(-expected) * expected ** j / math.factorial(j) for j in range(k))


@pytest.mark.parametrize("k,expected", [(2, 0.03), (5, 0.4), (7, 0.4), (12, 1.4), (40, 20.0), (3, 2.9)])
def test_poisson_tail_is_the_chance_of_that_many_bad_requests_at_the_objective(k, expected):
    assert poisson_tail(k, expected) == pytest.approx(_poisson_tail_by_summing(k, expected), rel=1e-9)


def test_poisson_tail_stays_finite_far_out_and_is_one_below_the_expected_count():
    assert 0.0 < poisson_tail(80, 1.0) < 1e-100
    assert poisson_tail(900, 1000.0) == 1.0 and poisson_tail(0, 3.0) == 1.0


@pytest.mark.parametrize("expected", [0.4, 1.0, 3.0, 10.0, 100.0, 1000.0])
def test_the_closed_form_critical_count_is_within_one_request_of_the_exact_one(expected):
    alpha = 1e-6
    exact = next(k for k in range(1, 10_000) if poisson_tail(k, expected) < alpha)
    approx = math.ceil(poisson_critical_approx(expected, alpha))
    assert exact <= approx <= exact + 1


def test_fleet_discoveries_hold_false_discoveries_across_all_tests_not_per_test():
    rng = np.random.default_rng(7)
    healthy = rng.random(100_000)
    assert (healthy < 1e-3).sum() > 50  # a per-window test at 0.1 % would report dozens of false violations
    assert not fleet_discoveries(healthy, 0.01).any()
    faulty = np.concatenate([healthy, np.full(30, 1e-7)])
    found = fleet_discoveries(faulty, 0.01)
    assert found[-30:].all() and found[:-30].sum() <= 1


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


def test_each_of_a_nodes_incidents_reports_its_own_sli(tmp_path):
    """A tier's incidents get their SLI from one query: two on the same service and node, apart, each its own."""
    spec = parse_spec(GOOD)
    lines = [
        _spans("n1", 0, 300, 100),
        _spans("n1", 300, 40, 1500, base=10_000),
        _spans("n1", 340, 200, 100, base=20_000),
        _spans("n1", 540, 40, 3000, base=30_000),
        _spans("n1", 580, 60, 100, base=40_000),
    ]
    with Store(tmp_path / "x.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files([write_lines(tmp_path / "s.jsonl", lines)])
        incidents = find_incidents(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert [i.node for i in incidents] == ["n1", "n1"]
    assert [i.sli["observed_ms"] for i in incidents] == [pytest.approx(1500, rel=0.01), pytest.approx(3000, rel=0.01)]
    assert [i.sli["observed_slow_ratio"] for i in incidents] == [1.0, 1.0]


def _lognormal_spans(node, start_s, seconds, rate, median_ms, sigma, seed, base, tier="gold"):
    rng = np.random.default_rng(seed)
    n = seconds * rate
    latencies = median_ms * np.exp(sigma * rng.standard_normal(n))
    return traces([span(f"{base + i:032x}", f"{base + i:016x}", T0 + start_s * S + i * S // rate, float(ms),
                        tier=[tier]) for i, ms in enumerate(latencies)], node=node)


def _load(tmp_path, spec, lines):
    store = Store(tmp_path / "x.duckdb")
    Ingestor(store, TierResolver.from_spec(spec)).ingest_files([write_lines(tmp_path / "s.jsonl", lines)])
    return store


def test_each_tier_counts_its_requests_slow_against_its_own_threshold(tmp_path):
    """One query answers every tier: 500 ms is slow for standard (200 ms) and not for gold (800 ms)."""
    spec = parse_spec(GOOD)
    spans = [span(f"{n:032x}", f"{n:016x}", T0 + n * S // 4, 500, tier=["gold" if n % 3 else "standard"])
             for n in range(240)]
    with _load(tmp_path, spec, [traces(spans, node="n1")]) as store:
        windows = sli_windows(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    gold, standard = windows["gold"], windows["standard"]
    assert gold["requests"].sum() == 160 and standard["requests"].sum() == 80
    assert gold["slow"].sum() == 0 and standard["slow"].sum() == 80
    assert standard["latency_p"].max() < 1e-6 < gold["latency_p"].min()


def test_a_healthy_lognormal_fleet_opens_no_incident_though_window_percentiles_cross_the_objective(tmp_path):
    """Tier gold, p99 <= 800 ms, median 400 ms and sigma 0.3: 0.1 % of requests are slower than 800 ms, well
    within the 1 % the percentile allows, but a 10 s window's p99 over 40 requests is nearly its maximum."""
    spec = parse_spec(GOOD)
    lines = [_lognormal_spans(f"n{k}", 0, 1800, 4, 400, 0.3, seed=k, base=k * 10**6) for k in range(5)]
    with _load(tmp_path, spec, lines) as store:
        windows = window_latencies(store, spec, spec.tiers["gold"], datetime(2000, 1, 1), datetime(2100, 1, 1))
        incidents = find_incidents(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert windows.filter(windows["latency_ms"] > 800).height >= 5  # what the eyeballed test paged on
    assert incidents == []


def test_a_fault_that_breaks_the_slo_is_found_within_30_s_among_a_healthy_fleet(tmp_path):
    spec = parse_spec(GOOD)
    lines = [_lognormal_spans(f"n{k}", 0, 1800, 4, 400, 0.3, seed=k, base=k * 10**6) for k in range(1, 5)]
    lines += [_lognormal_spans("n0", 0, 900, 4, 400, 0.3, seed=0, base=0),
              _lognormal_spans("n0", 900, 60, 4, 700, 0.3, seed=9, base=9 * 10**6),  # 32 % slower than 800 ms
              _lognormal_spans("n0", 960, 840, 4, 400, 0.3, seed=10, base=10 * 10**6)]
    with _load(tmp_path, spec, lines) as store:
        incidents = find_incidents(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert [(i.node, i.sli["kind"]) for i in incidents] == [("n0", "latency")]
    broke = datetime(2025, 11, 29, 10, 15)
    assert broke <= incidents[0].start and incidents[0].start + timedelta(seconds=20) <= broke + timedelta(seconds=30)
    assert incidents[0].sli["observed_slow_ratio"] > 0.2 and incidents[0].sli["objective_slow_ratio"] == 0.01


def test_sparse_windows_are_pooled_with_their_neighbours_before_they_are_judged(tmp_path):
    """At 0.2 requests/s a window holds two requests: alone, two slow ones out of two never reach p < 1e-4
    at a 1 % allowance... pooled over five windows, ten slow ones out of ten do."""
    spec = parse_spec(GOOD)
    lines = [_spans("n1", 0, 600, 100, rate=1), _spans("n1", 600, 60, 1500, rate=1, base=10_000)]
    sparse = [span(f"{50_000 + i:032x}", f"{50_000 + i:016x}", T0 + (600 + 5 * i) * S, 1500, tier=["gold"])
              for i in range(24)]
    lines.append(traces(sparse, node="n2"))
    with _load(tmp_path, spec, lines) as store:
        windows = sli_windows(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))["gold"]
        incidents = find_incidents(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))
    n2 = windows.filter(windows["node"] == "n2")
    assert n2["requests"].max() == 2 and n2["block"].n_unique() == 3  # 12 windows: 5 + 5 + 2
    assert n2["latency_p"].max() < 1e-6
    assert {i.node for i in incidents} == {"n1", "n2"}


def _pooled_one_by_one(windows: list[tuple[str, str, str, int, int]], step_us: int) -> list[int]:
    """The pooling rule stated plainly, window after window: (tier, service, node, start in µs, requests) -> test
    id."""
    ids, block, key, first, pooled = [], -1, None, 0, 0
    for tier, service, node, start, requests in windows:
        if (tier, service, node) != key or pooled >= MIN_BLOCK_REQUESTS or start >= first + step_us * MAX_BLOCK_WINDOWS:
            block, key, first, pooled = block + 1, (tier, service, node), start, 0
        pooled += requests
        ids.append(block)
    return ids


@pytest.mark.parametrize("seed", range(5))
def test_windows_are_pooled_as_the_rule_says_whatever_their_sizes_and_gaps(seed):
    rng = np.random.default_rng(seed)
    rows = []
    for tier, service, node in itertools.product(("gold", "standard"), ("a", "b"), ("n1", "n2", "n3")):
        start = 0
        for _ in range(400):
            start += int(rng.choice([1, 1, 1, 2, 7])) * 10_000_000  # some windows empty, a few long gaps
            rows.append((tier, service, node, start, int(rng.choice([0, 1, 3, 9, 10, 12, 40]))))
    frame = pl.DataFrame(rows, schema=["tier", "service", "node", "start_us", "requests"], orient="row").with_columns(
        window_start=pl.from_epoch("start_us", time_unit="us"))
    ids = _blocks(frame, 10.0)
    assert ids.tolist() == _pooled_one_by_one(rows, 10_000_000)
    assert len(set(ids.tolist())) < frame.height  # some windows were pooled


def _sparse(node, seconds, latency_ms, base):
    """A request every 5 s: two to a window, so that windows are pooled before they are judged."""
    return traces([span(f"{base + i:032x}", f"{base + i:016x}", T0 + 5 * i * S, latency_ms, tier=["gold"])
                   for i in range(seconds // 5)], node=node)


def test_keys_that_share_a_hash_are_still_tested_apart(tmp_path, monkeypatch):
    """Windows are put in order by the hash of their (tier, service, node): were every key's hash the same, the
    windows of each key must still be pooled and judged as their own."""
    spec = parse_spec(GOOD)
    lines = [_sparse("n1", 300, 1500, 0), _sparse("n2", 300, 100, 10_000), _sparse("n3", 200, 100, 20_000)]
    with _load(tmp_path, spec, lines) as store:
        def judged():
            windows = sli_windows(store, spec, datetime(2000, 1, 1), datetime(2100, 1, 1))["gold"]
            blocks = windows.group_by("node", "block").agg(pl.col("window_start").min(), pl.len())
            return blocks.drop("block").sort(pl.all()), find_incidents(store, spec, datetime(2000, 1, 1),
                                                                       datetime(2100, 1, 1))
        blocks, incidents = judged()
        monkeypatch.setattr(slo, "_key_hashes", lambda frame: pl.Series([7] * frame.height, dtype=pl.UInt64))
        colliding = judged()
    own = blocks.filter(pl.col("node") != EVERY_NODE)  # the nodes' windows together are larger
    assert own["len"].min() > 1 and [i.node for i in incidents] == ["n1"]
    assert colliding[0].equals(blocks) and colliding[1] == incidents
