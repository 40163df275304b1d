"""The mesh simulator (`sloscope simulate --mesh`): traces that are well-formed trees over pods spread on the nodes,
the tier header on the entry only, and each fault raising exactly what it should, checked span by span against
the healthy twin of the same seed (its requests are the same but for what the fault changes)."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import defaultdict
from datetime import datetime

import numpy as np
import pytest

from sloscope import catalog
from sloscope.simulator import faults, mesh
from sloscope.simulator.fleet import SimulationConfig, build_fleet, simulate
from tests.sim_reading import START, attrs, fold_tier, read_lines

ONSET, DURATION = 200, 100
SERVICE = "reranker"  # depth 3, one pod at up to 8 nodes: every request goes through the faulty pod
TIER_KEYS = {catalog.TIER_HEADER_ATTRIBUTE, catalog.TIER_ISTIO_TAG}


def _config(out, fault=None, **kw) -> SimulationConfig:
    base = dict(out=out, nodes=3, duration_s=330, seed=21, start=START, rate=3, mesh=True, compress=False,
                fault_at_s=ONSET, fault_duration_s=DURATION)
    if fault:
        base.update(fault=fault, fault_service=kw.pop("fault_service", SERVICE))
    return SimulationConfig(**{**base, **kw})


class Run:
    """A simulated mesh's spans, by id, with their resource."""

    def __init__(self, out, truth):
        self.out, self.truth = out, truth
        self.spans = {}
        for line in read_lines(out / "traces.jsonl"):
            for rs in line["resourceSpans"]:
                res = attrs(rs["resource"]["attributes"])
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        sp["res"], sp["attrs"] = res, attrs(sp.get("attributes"))
                        sp["t0"], sp["t1"] = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
                        assert sp["spanId"] not in self.spans
                        self.spans[sp["spanId"]] = sp
        self.children = defaultdict(list)
        for sp in self.spans.values():
            if "parentSpanId" in sp:
                self.children[sp["parentSpanId"]].append(sp)

    def service(self, sp) -> str:
        return sp["res"]["service.name"]

    def self_time(self, sp) -> int:
        """A SERVER span's own time: its duration less the union of its calls."""
        calls = sorted((c["t0"], c["t1"]) for c in self.children[sp["spanId"]] if c["kind"] == 3)
        busy, end = 0, None
        for a, b in calls:
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        return sp["t1"] - sp["t0"] - busy

    def gap(self, sp) -> int:
        """A non-entry SERVER span's network time: its CLIENT parent's duration less its own."""
        parent = self.spans[sp["parentSpanId"]]
        return (parent["t1"] - parent["t0"]) - (sp["t1"] - sp["t0"])

    def failed(self, sp) -> bool:
        return sp.get("status", {}).get("code") == 2

    def entry_start(self, sp) -> int:
        while "parentSpanId" in sp:
            sp = self.spans[sp["parentSpanId"]]
        return sp["t0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for kind in (None, "slow_handler", "exceptions", "network_latency", "cpu_contention"):
        path = tmp_path_factory.mktemp(kind or "healthy")
        truth = simulate(_config(path, kind))
        out[kind] = Run(path, truth)
    return out


def _ns(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()) * 10**9


def _window(truth) -> tuple[int, int]:
    """Requests that arrive here meet the fault at full effect."""
    f = truth.fault
    return _ns(f["sli_onset"]) + 10 * 10**9, _ns(f["end"]) - 5 * 10**9


# ------------------------------------------------------------------------------------------------ shape


def test_topology_pods_spread_over_nodes(runs):
    topo = runs[None].truth.to_dict()["topology"]
    assert topo["entry"] == "gateway" and max(s["depth"] for s in topo["services"]) >= 3
    assert {(e["caller"], e["callee"]) for e in topo["edges"]} >= {("gateway", "router"), ("retriever", "reranker"),
                                                                   ("llm", "kv-cache")}
    by_node = defaultdict(set)
    for s in topo["services"]:
        assert 1 <= len(s["pods"]) <= 2
        nodes = [p["node"] for p in topo["pods"] if p["service"] == s["name"]]
        assert len(set(nodes)) == len(nodes)  # a service's pods on different nodes
        for n in nodes:
            by_node[n].add(s["name"])
    assert set(by_node) == set(topo["nodes"]) and all(len(v) >= 2 for v in by_node.values())
    for p in topo["pods"]:
        assert re.fullmatch(re.escape(p["service"]) + r"-[a-z0-9]{10}-[a-z0-9]{5}", p["name"])
    pods = {sp["res"]["k8s.pod.name"]: sp["res"] for sp in runs[None].spans.values()}
    assert set(pods) == {p["name"] for p in topo["pods"]}
    for p in topo["pods"]:
        res = pods[p["name"]]
        assert res["service.name"] == p["service"] and res["k8s.node.name"] == p["node"]
        assert res["k8s.namespace.name"] == topo["namespace"]


def test_traces_are_well_formed_trees(runs):
    run = runs[None]
    topo = run.truth.to_dict()["topology"]
    address = {s["name"]: s["address"] for s in topo["services"]}
    kinds = defaultdict(int)
    traces = defaultdict(list)
    for sp in run.spans.values():
        kinds[sp["kind"]] += 1
        traces[sp["traceId"]].append(sp)
        assert sp["t1"] > sp["t0"]
        if "parentSpanId" not in sp:
            assert sp["kind"] == 2 and run.service(sp) == "gateway"
            continue
        parent = run.spans[sp["parentSpanId"]]  # every parent exists ...
        assert parent["traceId"] == sp["traceId"]  # ... in the same trace
        assert parent["t0"] <= sp["t0"] and sp["t1"] <= parent["t1"]  # and holds its child's time
        if sp["kind"] == 2:  # a callee's SERVER span under its caller's CLIENT span, across services
            assert parent["kind"] == 3 and run.service(parent) != run.service(sp)
            assert parent["attrs"]["peer.service"] == run.service(sp)
            assert parent["attrs"]["server.address"] == address[run.service(sp)]
            assert 2e5 <= run.gap(sp) <= 2e6  # 0.2-2 ms of network both ways
        else:  # CLIENT and INTERNAL spans under their own pod's SERVER span
            assert sp["kind"] in (1, 3) and parent["kind"] == 2 and parent["res"] == sp["res"]
    assert set(kinds) == {1, 2, 3}
    full = [t for t in traces.values() if len(t) > 1]
    assert len(full) > 0.98 * len(traces)
    for t in full[:200]:
        assert len([s for s in t if "parentSpanId" not in s]) == 1
        assert {run.service(s) for s in t if s["kind"] == 2} == {s["name"] for s in topo["services"]}
    # parallel calls overlap, sequential ones follow each other
    router = next(s for s in full[0] if s["kind"] == 2 and run.service(s) == "router")
    calls = {c["attrs"]["peer.service"]: c for c in run.children[router["spanId"]]}
    assert calls["tokenizer"]["t0"] < calls["retriever"]["t1"] and calls["retriever"]["t0"] < calls["tokenizer"]["t1"]
    assert calls["llm"]["t0"] >= max(calls["tokenizer"]["t1"], calls["retriever"]["t1"])


def test_only_entry_spans_carry_the_tier_header(runs):
    run = runs[None]
    tiers = defaultdict(int)
    for sp in run.spans.values():
        if "parentSpanId" in sp:
            assert not TIER_KEYS & set(sp["attrs"]), sp
        else:
            tiers[fold_tier(sp["attrs"])] += 1
    total = sum(tiers.values())
    assert 0.2 < tiers["p99-latency-critical"] / total < 0.4
    assert any(TIER_KEYS & set(sp["attrs"]) for sp in run.spans.values())


def test_healthy_mesh_keeps_its_slos_and_has_no_fault(runs):
    run = runs[None]
    gt = json.loads((run.out / "ground_truth.json").read_text())
    assert gt["fault"] is None and gt["effect"] is None and "topology" in gt
    entry = [sp for sp in run.spans.values() if "parentSpanId" not in sp]
    for tier, (pct, threshold, allowed) in {"p99-latency-critical": (99, 0.8, 0.001),
                                            "standard": (95, 0.2, 0.005)}.items():
        lat = np.array([(sp["t1"] - sp["t0"]) / 1e9 for sp in entry if fold_tier(sp["attrs"]) == tier])
        assert np.percentile(lat, pct) < 0.75 * threshold
        assert np.mean([run.failed(sp) for sp in entry if fold_tier(sp["attrs"]) == tier]) <= allowed
    # every inner service keeps the standard tier too, should its spans not learn their trace's tier
    by_service = defaultdict(list)
    for sp in run.spans.values():
        if sp["kind"] == 2:
            by_service[run.service(sp)].append((sp["t1"] - sp["t0"]) / 1e9)
    for svc, lat in by_service.items():
        assert np.mean(np.array(lat) > 0.2) < 0.01, svc


def test_mesh_margin_holds_at_the_worst_drift_and_burst():
    """At every pod's slowest, in a burst, under the fleet's drift peak, slow requests stay within the allowance."""
    topo = mesh.build_topology(0, ["n1", "n2", "n3"])
    worst = (1 + 0.05) * (1 + 0.04) * (1 + 0.04) * 1.12
    plan = mesh.make_plan(0, 600, 0, 10, topo, 2000.0)
    plan.pod_factor[:] = worst
    plan.drift_period[:] = 1e12  # no drift beyond the worst factor above
    plan.fleet_drift_phase = 0.0
    plan.bursts = {"gateway": np.array([], dtype=np.int64)}
    req = mesh.draw_requests(plan, 0, 0, 60)
    e2e = req.end[0] - req.t
    for code, (pct, threshold) in ((0, (99, 0.8)), (1, (95, 0.2))):
        slow = np.mean(e2e[req.tier == code] > threshold)
        assert slow < 0.8 * (1 - pct / 100), (code, slow)
    for i, svc in enumerate(topo.services):
        assert np.mean((req.end[i] - req.start[i])[req.called[i]] > 0.2) < 0.8 * 0.05, svc.name


# ------------------------------------------------------------------------------------------------ faults


def _compare(runs, kind):
    """(healthy, faulty, spans in both by id) for the twin runs."""
    healthy, faulty = runs[None], runs[kind]
    common = [(healthy.spans[k], sp) for k, sp in faulty.spans.items() if k in healthy.spans]
    assert len(common) > 0.9 * len(healthy.spans)
    return healthy, faulty, common


def _on_pod(faulty, sp) -> bool:
    return sp["res"]["k8s.pod.name"] == faulty.truth.fault["pod"]


@pytest.mark.parametrize("kind", ["slow_handler", "cpu_contention"])
def test_slower_pod_raises_its_own_time_and_nothing_else(runs, kind):
    healthy, faulty, common = _compare(runs, kind)
    f = faulty.truth.fault
    assert f["service"] == SERVICE and f["cause"] == ("application" if kind == "slow_handler" else kind)
    assert f["kind"] == kind and f["self_time_multiplier"] >= 3
    lo, hi = _window(faulty.truth)
    ratios = []
    for h, sp in common:
        assert h["kind"] == sp["kind"] and h.get("status") == sp.get("status")  # no error comes or goes
        if sp["kind"] != 2:
            continue
        if "parentSpanId" in sp:
            assert abs(faulty.gap(sp) - healthy.gap(h)) <= 4  # network time: the same to the nanosecond's rounding
        own, before = faulty.self_time(sp), healthy.self_time(h)
        if _on_pod(faulty, sp) and lo <= faulty.entry_start(sp) <= hi:
            ratios.append(own / before)
        elif not _on_pod(faulty, sp) or sp["t1"] < _ns(f["onset"]):
            assert abs(own - before) <= 8, (faulty.service(sp), own, before)
    assert len(ratios) > 50
    assert np.median(ratios) == pytest.approx(f["self_time_multiplier"], rel=0.15)
    # the entry feels it: its standard tier breaks
    entry = [(sp["t1"] - sp["t0"]) / 1e9 for sp in faulty.spans.values()
             if "parentSpanId" not in sp and lo <= sp["t0"] <= hi and fold_tier(sp["attrs"]) == "standard"]
    assert np.percentile(entry, 95) > 0.2


def test_exceptions_fail_the_pod_and_its_ancestors_only(runs):
    healthy, faulty, common = _compare(runs, "exceptions")
    f = faulty.truth.fault
    assert f["cause"] == "application" and f["kind"] == "exceptions" and f["error_ratio"] >= 0.05
    new_failures = [sp for h, sp in common if faulty.failed(sp) and not healthy.failed(h)]
    origins = [sp for sp in new_failures if sp["kind"] == 2 and _on_pod(faulty, sp)]
    assert len(origins) > 10
    assert all(sp["attrs"]["http.response.status_code"] == 500 for sp in origins)
    # every new failure is an origin or on the path from one up to the entry
    on_path = set()
    for sp in origins:
        while True:
            on_path.add(sp["spanId"])
            if "parentSpanId" not in sp:
                break
            sp = faulty.spans[sp["parentSpanId"]]
            assert faulty.failed(sp)  # the failure propagates ...
            if sp["kind"] == 2 and "http.response.status_code" in sp["attrs"]:
                assert sp["attrs"]["http.response.status_code"] == 500
    assert {sp["spanId"] for sp in new_failures} == on_path  # ... and nowhere else
    # what was not on the path kept its times (the caller's later calls are skipped, so later spans are gone)
    for h, sp in common:
        if sp["kind"] == 2 and sp["spanId"] not in on_path:
            assert abs(faulty.self_time(sp) - healthy.self_time(h)) <= 8
    missing = set(healthy.spans) - set(faulty.spans)
    assert missing and {healthy.service(healthy.spans[k]) for k in missing} <= {"llm", "kv-cache", "router"}
    assert not set(faulty.spans) - set(healthy.spans)


def test_network_latency_delays_the_calls_not_the_pod(runs):
    healthy, faulty, common = _compare(runs, "network_latency")
    f = faulty.truth.fault
    assert f["cause"] == "network_latency" and 50 <= f["added_latency_ms"] <= 500
    lo, hi = _window(faulty.truth)
    added = []
    for h, sp in common:
        assert h.get("status") == sp.get("status")
        if sp["kind"] != 2:
            continue
        assert abs(faulty.self_time(sp) - healthy.self_time(h)) <= 8  # no SERVER span's own time moves
        if _on_pod(faulty, sp):
            assert abs((sp["t1"] - sp["t0"]) - (h["t1"] - h["t0"])) <= 4  # nor the pod's SERVER spans
        if "parentSpanId" not in sp:
            continue
        if _on_pod(faulty, sp) and lo <= faulty.entry_start(sp) <= hi:
            added.append((faulty.gap(sp) - healthy.gap(h)) / 1e6)
        elif not _on_pod(faulty, sp):
            assert abs(faulty.gap(sp) - healthy.gap(h)) <= 4
    assert len(added) > 50
    assert np.median(added) == pytest.approx(f["added_latency_ms"], rel=0.1)


@pytest.mark.parametrize("kind", ["slow_handler", "exceptions", "network_latency"])
def test_mesh_faults_move_no_node_signal_but_the_round_trip(kind):
    fleet = build_fleet(_config(None, kind, duration_s=420, fault_at_s=240, fault_duration_s=120, seed=4))
    t = fleet.truth
    assert t.effect is None and t.fault["evidence"] == ([] if kind != "network_latency" else t.fault["evidence"])
    fi = fleet.names.index(t.fault["node"])
    fleet_wide = {s["signal"] for s in t.fleet_wide["signals"]}
    for i, node in enumerate(fleet.nodes):
        for s in node.series:
            if s.name in fleet_wide:
                continue
            score = faults.robust_score(s, (0, 230), (255, 360))
            if kind == "network_latency" and i == fi and s.name == "sloscope.tcp.rtt":
                assert score > 4
            else:
                assert abs(score) < 3, (node.name, s.name, s.attrs, score)
    if kind == "network_latency" and "sloscope.tcp.rtt" in catalog.BY_NAME:
        assert [e["signal"] for e in t.fault["evidence"]] == ["sloscope.tcp.rtt"]


def test_physical_fault_bends_its_node_as_on_a_flat_fleet():
    fleet = build_fleet(_config(None, "storage_queue", duration_s=420, fault_at_s=240, fault_duration_s=120, seed=9,
                                fault_service=None))
    f = fleet.truth.fault
    topo = fleet.truth.to_dict()["topology"]
    depth = {s["name"]: s["depth"] for s in topo["services"]}
    assert depth[f["service"]] >= 2 and f["cause"] == f["kind"] == "storage_queue"
    assert {"service": f["service"], "node": f["node"]} in [{"service": p["service"], "node": p["node"]}
                                                            for p in topo["pods"] if p["name"] == f["pod"]]
    node = fleet.nodes[fleet.names.index(f["node"])]
    evidence = faults.cause_series(node, "storage_queue", {"spdk.bdev.name": f["spdk.bdev.name"]})
    assert max(faults.robust_score(s, (0, 230), (260, 360), feat) for s, feat in evidence) > 4
    assert fleet.truth.effect is not None  # the effect confounder, as on a flat fleet


def test_faults_land_on_deep_services_by_seed():
    seen = set()
    for seed in range(12):
        fleet = build_fleet(_config(None, "slow_handler", seed=seed, fault_service=None))
        seen.add(fleet.truth.fault["service"])
    topo = mesh.build_topology(0, ["a", "b", "c"])
    assert seen <= {topo.names[i] for i in topo.deep_services()} and len(seen) >= 3


# ------------------------------------------------------------------------------------------------ runs


def test_same_seed_same_files(tmp_path):
    digests = []
    for name, seed, workers in (("a", 3, 1), ("b", 3, 2), ("c", 4, 1)):
        out = tmp_path / name
        simulate(_config(out, "exceptions", seed=seed, duration_s=240, fault_at_s=150, fault_duration_s=60,
                         workers=workers))
        digests.append({f: hashlib.sha256((out / f).read_bytes()).hexdigest()
                        for f in ("metrics.jsonl", "traces.jsonl", "ground_truth.json")})
    assert digests[0] == digests[1]
    assert all(digests[0][f] != digests[2][f] for f in digests[0])


def test_mesh_configs_refused(tmp_path):
    with pytest.raises(ValueError, match="needs a mesh"):
        simulate(SimulationConfig(out=tmp_path, fault="network_latency", duration_s=300))
    with pytest.raises(ValueError, match="needs a mesh"):
        simulate(SimulationConfig(out=tmp_path, fault="disk_io", fault_service="llm", duration_s=300))
    with pytest.raises(ValueError, match="unknown mesh service"):
        simulate(_config(tmp_path, "slow_handler", fault_service="frontend"))
    with pytest.raises(ValueError, match="entry"):
        simulate(_config(tmp_path, "exceptions", fault_service="gateway"))
    with pytest.raises(ValueError, match="unknown fault"):
        simulate(_config(tmp_path, "application"))


def test_cli_simulate_mesh(tmp_path, capsys):
    import sloscope.simulator.cli as cli

    parser = argparse.ArgumentParser(prog="sloscope")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    args = parser.parse_args(["simulate", "--out", str(tmp_path), "--mesh", "--nodes", "2", "--duration", "3m",
                              "--start", START, "--fault", "slow_handler", "--fault-service", "kv-cache",
                              "--fault-at", "100s", "--rate", "2", "--seed", "1"])
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "application (slow_handler)" in err and "(kv-cache)" in err and "internal spans" in err
    gt = json.loads((tmp_path / "ground_truth.json").read_text())
    assert gt["fault"]["service"] == "kv-cache" and gt["fault"]["cause"] == "application"
    assert gt["config"]["mesh"] is True and gt["services"][0] == "gateway"
    args = parser.parse_args(["simulate", "--out", str(tmp_path), "--mesh", "--services", "a,b"])
    assert args.func(args) == 2
    args = parser.parse_args(["simulate", "--out", str(tmp_path), "--fault", "exceptions", "--duration", "3m"])
    assert args.func(args) == 2
    assert "needs a mesh" in capsys.readouterr().err
