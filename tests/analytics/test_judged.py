"""Where a tier's SLO is judged: at its traces' entry by default, or at the services the spec names, each with its
own objective, on the traces whose entry is of the tier (deeper services see no header)."""

import random
from datetime import timedelta

import pytest

from sloscope.analytics.slo import find_incidents
from sloscope.slo_spec import parse_spec
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from tests.analytics.test_graph import T0, Traces, _mesh, _store

SPEC = """\
default_tier: standard
tiers:
  gold:
    latency: {percentile: 99, threshold_ms: 100}
    availability: 99.9
%s
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
"""


def _incidents(store, services: str = ""):
    spec = parse_spec(SPEC % services)
    return {(i.tier, i.service) for i in find_incidents(store, spec, T0, T0 + timedelta(minutes=15))}


@pytest.fixture
def slow_cart(tmp_path):
    """The entry (frontend, tier gold) calls cart, which sends no header (tier standard): from 10 min on, cart
    takes 300 ms."""
    with _store(tmp_path, cart_ms=300.0) as store:
        yield store


def test_by_default_the_entry_is_judged_and_a_deeper_service_is_not(slow_cart):
    assert _incidents(slow_cart) == {("gold", "frontend")}


def test_named_services_are_judged_in_the_entrys_tier_with_their_own_objectives(slow_cart):
    lenient = "    services:\n      frontend: {threshold_ms: 1000}\n      cart: {threshold_ms: 500}"
    assert _incidents(slow_cart, lenient) == set()
    strict = "    services:\n      cart: {threshold_ms: 150}"
    assert _incidents(slow_cart, strict) == {("gold", "cart")}


def test_a_services_own_availability_is_its_error_budget(tmp_path):
    with _store(tmp_path, cart_fails_every=10) as store:  # 10 % of requests fail, from cart up to the entry
        assert _incidents(store) == {("gold", "frontend")}
        assert _incidents(store, "    services:\n      frontend: {availability: 80}") == set()


def test_clickhouse_judges_the_same_requests(tmp_path, slow_cart):
    pytest.importorskip("chdb")
    strict = "    services:\n      cart: {threshold_ms: 150}"
    with open_store(f"chdb:///{tmp_path}/ch") as house:
        house.write(_mesh(cart_ms=300.0).frames())
        for services in ("", strict):
            assert _incidents(house, services) == _incidents(slow_cart, services)


def _slow_share(tmp_path, every: int):
    """frontend's traces as _mesh's, where from 10 min on one request in `every` waits 300 ms for cart."""
    traces, rng = Traces(), random.Random(11)
    for n in range(900 * 5):
        slowed = n >= 600 * 5 and n % every == 0
        traces.request(n + 1, T0 + timedelta(milliseconds=200 * n), 300.0 if slowed else 20.0, 0.5, rng=rng)
    store = Store(tmp_path / "share.duckdb")
    store.write(traces.frames())
    return store


def test_a_services_own_percentile_sets_its_allowance_and_its_measured_latency(tmp_path):
    """10 % of frontend's requests slowed: far more than p99 allows, what p90 does; judged at p99.5 with a 50 ms
    threshold, its incident's latency is its p99.5, one of the slowed requests."""
    with _slow_share(tmp_path, 10) as store:
        assert _incidents(store) == {("gold", "frontend")}
        assert _incidents(store, "    services:\n      frontend: {percentile: 90}") == set()
        spec = parse_spec(SPEC % "    services:\n      frontend: {percentile: 99.5, threshold_ms: 50}")
        (incident,) = find_incidents(store, spec, T0, T0 + timedelta(minutes=15))
    assert incident.sli["percentile"] == 99.5 and incident.sli["objective_ms"] == 50
    assert incident.sli["observed_ms"] > 250 and incident.sli["objective_slow_ratio"] == pytest.approx(0.005)
