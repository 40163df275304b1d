"""A tier judged over every node of its entry service: a fault deep in the mesh slows a few of the requests of each
of many entry replicas, too few on any one node to be judged there, and only the replicas together show it."""

import random
from datetime import timedelta

import pytest

from sloscope.analytics.rca import analyse, format_table
from sloscope.analytics.slo import find_incidents, sli_windows
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from sloscope.catalog import EVERY_NODE, UNKNOWN_NODE
from sloscope.dashboards.report import render
from sloscope.slo_spec import parse_spec
from tests.analytics.test_graph import T0, Traces

SPEC = parse_spec("""
default_tier: gold
tiers:
  gold: {latency: {percentile: 99, threshold_ms: 800}, availability: 99.9}
window: 30d
resolution: 10s
""")
REPLICAS = 13  # prime to the fault's spacing, so that every replica gets its share of the slowed requests
PER_SECOND = 20
FAULT_AT_S = 600


def _fleet(slow_every: int) -> Traces:
    """Fifteen minutes of frontend (on REPLICAS nodes) calling cart and catalog; from FAULT_AT_S on, one request in
    `slow_every` waits 1.5 s for cart (none where it is 0). A replica's node sees one slowed request in about 17
    of its 10 s windows, the replicas together ten in each."""
    traces, rng = Traces(), random.Random(5)
    for n in range(900 * PER_SECOND):
        slowed = slow_every and n >= FAULT_AT_S * PER_SECOND and n % slow_every == 0
        traces.request(n + 1, T0 + timedelta(seconds=n / PER_SECOND), 1500.0 if slowed else 20.0, 0.5, rng=rng)
    for row in traces.rows:
        if row["service"] == "frontend":
            replica = row["trace_lo"] % REPLICAS
            row.update(pod=f"frontend-{replica}", node=f"node-f{replica}")
    return traces


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    path = tmp_path_factory.mktemp("every") / "f.duckdb"
    with Store(path) as store:
        store.write(_fleet(20).frames())
    return path


def test_only_the_replicas_together_break_the_tier_and_its_culprit_is_deep(faulty):
    with Store(faulty) as store:
        incidents = find_incidents(store, SPEC, T0, T0 + timedelta(minutes=15))
        result = analyse(store, SPEC)
    assert [(i.tier, i.service, i.node) for i in incidents] == [("gold", "frontend", EVERY_NODE)]
    fault = T0 + timedelta(seconds=FAULT_AT_S)
    assert fault - timedelta(seconds=30) <= incidents[0].start <= fault + timedelta(seconds=60)
    assert incidents[0].sli["observed_slow_ratio"] == pytest.approx(0.05, abs=0.01)
    (incident,) = result["incidents"]
    culprit = incident["culprits"][0]
    assert (culprit["service"], culprit["node"], culprit["path"]) == ("cart", "node-b", ["frontend", "cart"])
    top = incident["causes"][0]
    assert (top["service"], top["node"], top["cause"]) == ("cart", "node-b", "application")
    assert "gold / frontend on every node" in format_table(result)


def test_a_healthy_fleet_of_replicas_has_no_incident(tmp_path):
    with Store(tmp_path / "h.duckdb") as store:
        store.write(_fleet(0).frames())
        assert find_incidents(store, SPEC, T0, T0 + timedelta(minutes=15)) == []


def test_a_fault_on_one_replica_stays_that_nodes_incident(tmp_path):
    """The replicas together see the slow node's requests too; its own incident says where, so it is the one."""
    traces = _fleet(0)
    for row in traces.rows:
        if row["node"] == "node-f3" and row["start_time"] >= T0 + timedelta(seconds=FAULT_AT_S):
            row["duration_ms"] += 1500.0
    with Store(tmp_path / "o.duckdb") as store:
        store.write(traces.frames())
        incidents = find_incidents(store, SPEC, T0, T0 + timedelta(minutes=15))
    assert [(i.service, i.node) for i in incidents] == [("frontend", "node-f3")]


def test_clickhouse_judges_every_node_alike(faulty, tmp_path):
    pytest.importorskip("chdb")
    with Store(faulty) as duck, open_store(f"chdb:///{tmp_path}/ch") as house:
        house.write(_fleet(20).frames())
        answers = [analyse(store, SPEC)["incidents"] for store in (duck, house)]
    assert [(i["node"], i["start"], i["sli"]) for i in answers[0]] == [(i["node"], i["start"], i["sli"])
                                                                       for i in answers[1]]
    assert answers[1][0]["culprits"][0]["service"] == "cart"


def test_the_report_charts_the_service_over_every_node(faulty):
    with Store(faulty) as store:
        html = render(store, SPEC)
    assert "SLI gold / frontend on every node: p99 latency" in html and "p99 on every node" in html


def test_requests_that_named_no_node_do_not_make_a_service_of_many_nodes(tmp_path):
    traces = _fleet(0)
    for row in traces.rows:
        if row["service"] == "frontend":
            row.update(node="node-f0" if row["trace_lo"] % 50 else UNKNOWN_NODE)
    with Store(tmp_path / "u.duckdb") as store:
        store.write(traces.frames())
        windows = sli_windows(store, SPEC, T0, T0 + timedelta(minutes=15))["gold"]
    assert EVERY_NODE not in windows["node"].to_list()
