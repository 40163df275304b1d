"""The fleet simulator: OTLP/JSON wire format, catalog coverage, a healthy fleet that keeps its SLOs, determinism
and the CLI. Faults and confounders: tests/simulator/test_simulator_faults.py."""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from sloscope.simulator import traffic
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope import catalog
from tests.sim_reading import (START, START_NS, TIERS, attrs, metric_points, percentile, read_lines, server_spans,
                               steps)

INSTRUMENT_KEY = {catalog.Instrument.GAUGE: "gauge", catalog.Instrument.COUNTER: "sum",
                  catalog.Instrument.HISTOGRAM: "exponentialHistogram"}
DIGITS = re.compile(r"^[0-9]+$")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    truth = simulate(SimulationConfig(out=out, nodes=3, duration_s=300, seed=11, start=START, rate=12))
    return out, truth


# ------------------------------------------------------------------------------------------------ wire format


def test_metrics_are_otlp_json_with_exact_encodings(healthy):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    out, _ = healthy
    raw = gzip.open(out / "metrics.jsonl.gz", "rt").read().splitlines()
    for line in raw[:40]:
        json_format.Parse(line, ExportMetricsServiceRequest())  # strict: unknown fields fail
    seen = set()
    for line in map(json.loads, raw):
        assert list(line) == ["resourceMetrics"] and len(line["resourceMetrics"]) == 1
        rm = line["resourceMetrics"][0]
        res = attrs(rm["resource"]["attributes"])
        assert res["service.name"] == "sloscope-collector"
        assert res["host.name"] == res["k8s.node.name"] and re.fullmatch(r"gpu-node-\d+", res["host.name"])
        for m in rm["scopeMetrics"][0]["metrics"]:
            sig = catalog.signal(m["name"])
            key = INSTRUMENT_KEY[sig.instrument]
            assert key in m and m["unit"] == sig.unit
            body = m[key]
            if key != "gauge":
                assert body["aggregationTemporality"] == 2
            if key == "sum":
                assert body["isMonotonic"] is True
            for dp in body["dataPoints"]:
                assert DIGITS.match(dp["timeUnixNano"])
                if key == "gauge":
                    assert isinstance(dp["asDouble"], (int, float)) and "startTimeUnixNano" not in dp
                    continue
                assert DIGITS.match(dp["startTimeUnixNano"])
                assert int(dp["startTimeUnixNano"]) < int(dp["timeUnixNano"])
                if key == "sum":
                    if sig.unit.startswith("{"):
                        assert DIGITS.match(dp["asInt"]) and "asDouble" not in dp
                    else:
                        assert isinstance(dp["asDouble"], (int, float)) and "asInt" not in dp
                else:
                    assert dp["scale"] == 0 and dp["zeroCount"] == "0"
                    assert DIGITS.match(dp["count"]) and isinstance(dp["sum"], float)
                    buckets = dp["positive"]["bucketCounts"]
                    assert all(DIGITS.match(b) for b in buckets) and isinstance(dp["positive"]["offset"], int)
                    assert sum(map(int, buckets)) == int(dp["count"])
                    off = dp["positive"]["offset"]
                    nz = [i for i, b in enumerate(buckets) if int(b)]
                    # scale 0: bucket index i covers (2^i, 2^(i+1)]
                    assert 2.0 ** (off + nz[0]) < dp["min"] <= 2.0 ** (off + nz[0] + 1)
                    assert 2.0 ** (off + nz[-1]) < dp["max"] <= 2.0 ** (off + nz[-1] + 1)
                    assert dp["min"] <= dp["sum"] / int(dp["count"]) <= dp["max"]
                seen.add(key)
    assert seen == {"sum", "exponentialHistogram"}


def test_traces_are_otlp_json_with_exact_encodings(healthy):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out, truth = healthy
    lines = read_lines(out / "traces.jsonl.gz")
    kinds, encodings = defaultdict(int), defaultdict(int)
    for line in lines:
        assert list(line) == ["resourceSpans"]
        for rs in line["resourceSpans"]:
            res = attrs(rs["resource"]["attributes"])
            assert res["service.name"] in truth.services and res["host.name"] == res["k8s.node.name"]
            for sp in rs["scopeSpans"][0]["spans"]:
                assert re.fullmatch(r"[0-9a-f]{32}", sp["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", sp["spanId"])
                assert DIGITS.match(sp["startTimeUnixNano"]) and DIGITS.match(sp["endTimeUnixNano"])
                assert int(sp["endTimeUnixNano"]) > int(sp["startTimeUnixNano"])
                kinds[sp["kind"]] += 1
                a = {kv["key"]: kv["value"] for kv in sp["attributes"]}
                assert DIGITS.match(a["http.response.status_code"]["intValue"])
                if sp["kind"] == 2:
                    assert "http.route" in a
                if "http.request.header.x-slo-tier" in a:
                    encodings[next(iter(a["http.request.header.x-slo-tier"]))] += 1
                elif "slo.tier" in a:
                    encodings["istio"] += 1
                if sp.get("status", {}).get("code"):
                    assert sp["status"]["code"] == 2
    assert kinds[2] > 10 * kinds[3] > 0 and set(kinds) == {2, 3}
    assert encodings["arrayValue"] > encodings["stringValue"] > 0 and encodings["istio"] > 0
    # protobuf's own JSON parser (ids are base64 there: OTLP/JSON's hex ids are the one documented difference)
    for line in lines[:20]:
        for rs in line["resourceSpans"]:
            for sp in rs["scopeSpans"][0]["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
        json_format.ParseDict(line, ExportTraceServiceRequest())


def test_batching_one_line_per_node_per_flush_interval(healthy):
    out, truth = healthy
    lines = read_lines(out / "metrics.jsonl.gz")
    per = defaultdict(int)
    for line in lines:
        rm = line["resourceMetrics"][0]
        node = attrs(rm["resource"]["attributes"])["host.name"]
        times = {int(dp["timeUnixNano"]) for m in rm["scopeMetrics"][0]["metrics"]
                 for k in ("gauge", "sum", "exponentialHistogram") if k in m for dp in m[k]["dataPoints"]}
        steps_ = {(t - START_NS) // 10**10 for t in times}
        assert len(steps_) == 1, "a line holds one flush interval"
        per[(node, steps_.pop())] += 1
        assert len(times) <= 10
        for m in rm["scopeMetrics"][0]["metrics"]:  # several points per metric, one per 1 s sample per series
            key = next(k for k in ("gauge", "sum", "exponentialHistogram") if k in m)
            assert len(m[key]["dataPoints"]) >= len(times)
    assert set(per.values()) == {1} and len(per) == 3 * 30
    assert truth.extra["counts"]["metric_lines"] == len(lines)


def test_every_catalog_signal_on_every_node_at_1s(healthy):
    out, truth = healthy
    pts, kinds = metric_points(read_lines(out / "metrics.jsonl.gz"))
    assert set(pts) == set(truth.nodes)
    for node, by_name in pts.items():
        assert set(by_name) == {s.name for s in catalog.SIGNALS if s.own}, node
        for name, series in by_name.items():
            sig = catalog.signal(name)
            assert kinds[name][0] == INSTRUMENT_KEY[sig.instrument] and kinds[name][1] == sig.unit
            for ak, points in series.items():
                assert set(json.loads(ak)) <= set(sig.attributes), (name, ak)
                times = sorted(t for t, _ in points)
                gaps = np.diff(times)
                assert np.median(gaps) == 10**9, (node, name)
                if node != truth.counter_reset["node"]:
                    assert len(times) == 300
    node = pts[truth.nodes[0]]
    assert len(node["hw.gpu.io"]) == 8  # 2 GPUs x transmit/receive x nvlink/pcie
    assert len(node["sloscope.syscall.duration"]) == 5
    assert len(node["sloscope.pressure.stall"]) == 5
    assert {json.loads(k)["network.connection.state"] for k in node["system.network.connection.count"]} == \
        {"established", "time_wait", "close_wait"}
    gpu_ids = {json.loads(k)["hw.id"] for k in node["hw.gpu.temperature"]}
    assert len(gpu_ids) == 2 and all(re.fullmatch(r"GPU-[0-9a-f-]{36}", g) for g in gpu_ids)


def test_plausible_healthy_levels(healthy):
    out, _ = healthy
    pts, _ = metric_points(read_lines(out / "metrics.jsonl.gz"))

    def values(node, name):
        return np.array([dp["asDouble"] for series in pts[node][name].values() for _, dp in series])

    for node in pts:
        assert 0.35 < np.median(values(node, "hw.gpu.utilization")) < 0.7
        assert 0.45 < np.median(values(node, "sloscope.gpu.kernel.busy.max")) < 0.8
        assert 0.15 < np.median(values(node, "sloscope.gpu.sm.active")) < 0.5
        assert 50 < np.median(values(node, "hw.gpu.temperature")) < 70
        assert 38 < np.median(values(node, "sloscope.nvme.temperature")) < 52
        assert 2e-4 < np.median(values(node, "spdk.bdev.io.wait")) < 1.2e-3
        assert 0.15 < np.median(values(node, "spdk.reactor.busy")) < 0.5


def test_counter_reset_is_a_collector_restart(healthy):
    out, truth = healthy
    pts, _ = metric_points(read_lines(out / "metrics.jsonl.gz"))
    reset_node = truth.counter_reset["node"]
    for node, by_name in pts.items():
        for name in ("sloscope.tcp.retransmits", "system.disk.io_time", "sloscope.cpu.runqueue.delay"):
            for series in by_name[name].values():
                series.sort(key=lambda x: x[0])
                starts = [dp["startTimeUnixNano"] for _, dp in series]
                vals = [float(dp.get("asInt", dp.get("asDouble", dp.get("count")))) for _, dp in series]
                drops = [i for i in range(1, len(vals)) if vals[i] < vals[i - 1]]
                if node == reset_node:
                    assert len(set(starts)) == 2 and len(drops) == 1
                    i = drops[0]
                    assert starts[i] != starts[i - 1] and int(starts[i]) < series[i][0]
                    assert series[i][0] - series[i - 1][0] > 10**9  # a short gap while it restarted
                else:
                    assert len(set(starts)) == 1 and not drops


# ------------------------------------------------------------------------------------------------ SLO


def test_healthy_fleet_keeps_slow_and_failed_requests_within_each_tier_allowance(healthy):
    out, truth = healthy
    spans = server_spans(read_lines(out / "traces.jsonl.gz"))
    assert len(spans) > 3 * 3 * 12 * 300 * 0.9
    tiers_seen = defaultdict(int)
    for s in spans:
        tiers_seen[s[2]] += 1
    assert tiers_seen["p99-latency-critical"] > 0.2 * len(spans)
    worst, slow, total = {}, defaultdict(int), defaultdict(int)
    for (tier, svc, node, step), (lat, failed) in steps(spans, lambda s: s[3]).items():
        pct, threshold, budget = TIERS[tier]
        assert failed[0] / len(lat) < budget, (tier, svc, node, step, failed[0], len(lat))
        slow[tier, svc, node] += sum(v > threshold for v in lat)
        total[tier, svc, node] += len(lat)
        worst[tier] = max(worst.get(tier, 0), percentile(lat, pct) / threshold)
    for (tier, svc, node), n in total.items():
        assert slow[tier, svc, node] / n < 1 - TIERS[tier][0] / 100, (tier, svc, node, slow[tier, svc, node], n)
    for (tier, svc, node, step), (lat, failed) in steps(spans, lambda s: s[4]).items():  # steps by end time
        assert failed[0] / len(lat) < TIERS[tier][2], (tier, svc, node, step, failed[0], len(lat))
    # Lognormal noise: single windows' percentiles come near the objective, as in a real fleet.
    assert worst["p99-latency-critical"] > 0.6 and worst["standard"] > 0.6


def test_latency_model_margin_holds_by_construction():
    traffic.check_latency_margin(traffic.DEFAULT_SERVICES + ("some-other-service",))
    for svc in traffic.DEFAULT_SERVICES:
        for tier in traffic.TIERS:
            assert 0 < traffic.worst_slow_share(svc, tier) < traffic.MARGIN * traffic.slow_allowance(tier)


def test_hostile_and_missing_tier_values_are_present_and_behave_as_default(healthy):
    out, _ = healthy
    hostile = defaultdict(list)
    for line in read_lines(out / "traces.jsonl.gz"):
        for rs in line["resourceSpans"]:
            for sp in rs["scopeSpans"][0]["spans"]:
                if sp["kind"] != 2:
                    continue
                a = attrs(sp["attributes"])
                raw = a.get("http.request.header.x-slo-tier", a.get("slo.tier", "<missing>"))
                if raw not in ("p99-latency-critical", "standard", ["p99-latency-critical"], ["standard"]):
                    lat = (int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])) / 1e9
                    hostile[json.dumps(raw)[:40]].append(lat)
    assert '"<missing>"' in hostile
    assert any(len(k) >= 40 for k in hostile)  # the 10 kB value
    assert any("Latency-Critical" in k for k in hostile) and '[""]' in hostile and '[]' in hostile
    # folded into the default tier, and served like it: its median, far below the critical tier's
    for lats in hostile.values():
        assert np.median(lats) < 0.6 * 0.2


def test_network_loss_breaks_availability_on_the_fault_node(tmp_path):
    truth = simulate(SimulationConfig(out=tmp_path, nodes=2, duration_s=240, seed=3, start=START,
                                      fault="network_loss", fault_at_s=120, fault_duration_s=90))
    spans = server_spans(read_lines(tmp_path / "traces.jsonl.gz"))
    onset = START_NS + 120 * 10**9
    fnode = truth.fault["node"]
    after = [s for s in spans if s[0] == fnode and onset + 30 * 10**9 <= s[3] < onset + 90 * 10**9]
    assert sum(s[5] for s in after) / len(after) > 0.01
    before = [s for s in spans if s[3] < onset]
    assert sum(s[5] for s in before) / len(before) < 0.001


# ------------------------------------------------------------------------------------------------ runs


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic_by_seed_and_start(tmp_path):
    runs = []
    for name, seed, workers in (("a", 4, 1), ("b", 4, 2), ("c", 5, 1)):
        out = tmp_path / name
        simulate(SimulationConfig(out=out, nodes=2, duration_s=150, seed=seed, start=START, fault="disk_io",
                                  fault_at_s=90, compress=False, workers=workers))
        runs.append({f: _digest(out / f) for f in ("metrics.jsonl", "traces.jsonl", "ground_truth.json")})
    assert runs[0] == runs[1]  # the worker count does not change a byte
    assert all(runs[0][f] != runs[2][f] for f in runs[0])


def test_ground_truth_written(healthy):
    out, truth = healthy
    gt = json.loads((out / "ground_truth.json").read_text())
    for key in ("seed", "start", "end", "fault", "effect", "fleet_wide", "counter_reset", "nodes", "services",
                "files", "counts", "slo"):
        assert key in gt
    assert gt["fault"] is None and gt["effect"] is None and gt["seed"] == 11
    assert gt["start"] == START and gt["end"] == "2026-03-01T12:05:00Z"
    assert (out / gt["files"]["metrics"]).exists() and (out / gt["files"]["traces"]).exists()
    assert truth.to_dict() == gt


def test_invalid_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown fault"):
        simulate(SimulationConfig(out=tmp_path, fault="cosmic_rays", duration_s=300))
    with pytest.raises(ValueError, match="onset"):
        simulate(SimulationConfig(out=tmp_path, fault="disk_io", duration_s=300, fault_at_s=290))
    with pytest.raises(ValueError, match="node"):
        simulate(SimulationConfig(out=tmp_path, fault="disk_io", duration_s=300, fault_node="gpu-node-9"))


def test_cli_simulate(tmp_path, capsys):
    import sloscope.simulator.cli as cli

    parser = argparse.ArgumentParser(prog="sloscope")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--help"])
    assert "--fault-duration" in capsys.readouterr().out
    args = parser.parse_args(["simulate", "--out", str(tmp_path), "--nodes", "2", "--duration", "3m",
                              "--start", START, "--fault", "gpu_memory_leak", "--fault-at", "100s",
                              "--fault-node", "2", "--services", "llm-gateway,embedder", "--rate", "4", "--plain"])
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "gpu_memory_leak on gpu-node-2" in err and "data points" in err
    gt = json.loads((tmp_path / "ground_truth.json").read_text())
    assert gt["fault"]["node"] == "gpu-node-2" and gt["fault"]["hw.id"].startswith("GPU-")
    assert gt["services"] == ["llm-gateway", "embedder"]
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "metrics.jsonl.gz").exists()
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--out", str(tmp_path), "--fault", "nonsense"])
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--out", str(tmp_path), "--flush-interval", "0"])
    assert "--flush-interval: expected a duration above zero" in capsys.readouterr().err
    assert parser.parse_args(["simulate", "--out", str(tmp_path), "--duration", "1h30m"]).duration == 5400
    assert cli.DEFAULT_SERVICES == traffic.DEFAULT_SERVICES
