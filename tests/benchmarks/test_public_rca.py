"""benchmarks/public_rca.py's conversion of Nezha's CSVs to OTLP/JSON, on a tiny case written here in Nezha's layout
(four pods on two nodes, two traces, a fault list): span kinds, parents and peers, the node grouping, the
metrics' names, values and times, the scorer, and that `sloscope ingest` loads the result with the counts
expected. No network and no real Nezha data."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from sloscope.catalog import TIER_HEADER_ATTRIBUTE

REPO = Path(__file__).resolve().parents[2]
DAY = "2022-08-22"  # one of the benchmark's days, so that its command line runs on this case too

FRONTEND = "frontend-579b9bff58-t2dbm"
CART = "cartservice-579f59597d-wc2lz"
CHECKOUT = "checkoutservice-578fcf4766-9csqn"
PAYMENT = "paymentservice-9cdb6588f-554sm"
NODE_A = (FRONTEND, CART)  # node-1 by its first pod's name (cartservice)
NODE_B = (CHECKOUT, PAYMENT)

T0 = 1661162400  # 2022-08-22 10:00:00 UTC
NS = 1_000_000_000

TRACE_1, TRACE_2 = "0087f677c0a2cf3f80a551987167911b", "1187f677c0a2cf3f80a551987167911c"
# (trace, span, parent, pod, operation, start s after T0, duration ms)
SPANS = [
    (TRACE_1, "aa00000000000001", "root", FRONTEND, "hipstershop.Frontend/Recv.", 10.0, 20),
    (TRACE_1, "aa00000000000002", "aa00000000000001", FRONTEND, "hipstershop.CartService/GetCart", 10.001, 10),
    (TRACE_1, "aa00000000000003", "aa00000000000002", CART, "hipstershop.CartService/GetCart", 10.002, 8),
    (TRACE_1, "aa00000000000004", "aa00000000000003", CART, "redis.get", 10.003, 2),
    (TRACE_2, "bb00000000000001", "root", FRONTEND, "hipstershop.Frontend/Recv.", 70.0, 50),
    (TRACE_2, "bb00000000000002", "bb00000000000001", FRONTEND, "hipstershop.CheckoutService/PlaceOrder", 70.001, 40),
    (TRACE_2, "bb00000000000003", "bb00000000000002", CHECKOUT, "hipstershop.CheckoutService/PlaceOrder", 70.002, 35),
    (TRACE_2, "bb00000000000004", "bb00000000000003", CHECKOUT, "hipstershop.PaymentService/Charge", 70.003, 20),
    (TRACE_2, "bb00000000000005", "bb00000000000004", PAYMENT, "hipstershop.PaymentService/Charge", 70.004, 15),
]
EXPECTED_KINDS = {"aa00000000000001": (2, ""), "aa00000000000002": (3, "cartservice"),
                  "aa00000000000003": (2, ""), "aa00000000000004": (1, ""),
                  "bb00000000000001": (2, ""), "bb00000000000002": (3, "checkoutservice"),
                  "bb00000000000003": (2, ""), "bb00000000000004": (3, "paymentservice"),
                  "bb00000000000005": (2, "")}

TRACE_HEADER = "TraceID,SpanID,ParentID,PodName,OperationName,StartTimeUnixNano,EndTimeUnixNano,Duration"
METRIC_HEADER = ("Time,TimeStamp,PodName,CpuUsage(m),CpuUsageRate(%),MemoryUsage(Mi),MemoryUsageRate(%),SyscallRead,"
                 "SyscallWrite,NetworkReceiveBytes,NetworkTransmitBytes,PodClientLatencyP90(s),"
                 "PodServerLatencyP90(s),PodClientLatencyP95(s),PodServerLatencyP95(s),PodClientLatencyP99(s),"
                 "PodServerLatencyP99(s),PodWorkload(Ops),PodSuccessRate(%),NodeCpuUsageRate(%),"
                 "NodeMemoryUsageRate(%),NodeNetworkReceiveBytes")
MINUTES = 3  # each minute's sample is taken 19.25 s after the minute, as in Nezha's files
NODE_VALUES = {"A": [(2.5, 11.25, 32833.6), (4.75, 11.5, 31350.5), (3.0, 11.0, 30000.0)],
               "B": [(10.5, 29.75, 195031.75), (11.0, 28.5, 83582.25), (0, 28.0, 81000.0)]}  # one missing sample


def cpu_m(i: int, minute: int) -> float:
    return 5.0 + i + minute / 4


def memory_mi(i: int, minute: int) -> float:
    return 15.5 + 10 * i + minute


def load_benchmark():
    spec = importlib.util.spec_from_file_location("public_rca", REPO / "benchmarks" / "public_rca.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_benchmark()


def metric_time(minute: int) -> str:
    """A `Time` value as Nezha writes it, with the Go monotonic clock suffix."""
    t = datetime.fromtimestamp(T0 + 60 * minute + 19, timezone.utc)
    return f"{t:%Y-%m-%d %H:%M:%S}.250000000 +0000 UTC m=+{60 * minute + 0.305:.9f}"


@pytest.fixture(scope="module")
def nezha(tmp_path_factory) -> Path:
    """A copy of the Nezha repository's layout holding one fault, its three trace minutes, and four pods."""
    root = tmp_path_factory.mktemp("nezha")
    day = root / "rca_data" / DAY
    (day / "trace").mkdir(parents=True)
    (day / "metric").mkdir()
    faults = {"10": [{"inject_time": f"{DAY} 10:00:40", "inject_timestamp": str(T0 + 40), "inject_pod": CART,
                      "inject_type": "cpu_contention"}],
              "11": [{"inject_time": f"{DAY} 11:00:00", "inject_timestamp": str(T0 + 3600), "inject_pod": PAYMENT,
                      "inject_type": "exception"}]}  # its trace minutes are not in this copy
    (day / f"{DAY}-fault_list.json").write_text(json.dumps(faults, indent=4))
    files: dict[str, list[str]] = {"10_00": [], "10_01": [], "10_02": []}
    for trace, span, parent, pod, name, start_s, duration_ms in SPANS:
        start = T0 * NS + round(start_s * NS)
        end = start + duration_ms * 1_000_000
        line = f"{trace},{span},{parent},{pod},{name},{start},{end},{duration_ms * 1000}"
        files["10_00" if start_s < 60 else "10_01"].append(line)
    files["10_01"].append(files["10_00"][0])  # neighbouring files overlap: one span twice
    files["10_02"].append("not-hex,zz,root,frontend-579b9bff58-t2dbm,x,1,2,1")  # a malformed row
    for minute, lines in files.items():
        (day / "trace" / f"{minute}_trace.csv").write_text("\n".join([TRACE_HEADER, *lines]) + "\n")
    for i, pod in enumerate((*NODE_A, *NODE_B)):
        values = NODE_VALUES["A" if pod in NODE_A else "B"]
        rows = [METRIC_HEADER]
        for minute in range(MINUTES):
            node_cpu, node_mem, node_net = values[minute]
            # TimeStamp deliberately corrupt in one file, as in the real data: the benchmark reads Time
            stamp = T0 + 60 * minute + 19 + (200000000 if pod == FRONTEND else 0)
            rows.append(f"{metric_time(minute)},{stamp},{pod},{cpu_m(i, minute)},26.7,{memory_mi(i, minute)},12.0,"
                        f"0,0,32496.3,237008.7,0.15,1.15,0.2,1.8,0.4,2.3,9.1,100,{node_cpu},{node_mem},{node_net}")
        (day / "metric" / f"{pod}_metric.csv").write_text("\n".join(rows) + "\n")
    (day / "metric" / "front_service.csv").write_text("Time,TimeStamp,ServiceName,SuccessRate(%)\n")
    return root


def test_service_of_strips_replica_set_and_pod_suffixes(bench):
    assert bench.service_of(CART) == "cartservice"
    assert bench.service_of("productcatalogservice-668d5f85fb-jhwx9") == "productcatalogservice"
    assert bench.service_of("node-exporter-x7k2p") == "node-exporter"
    assert bench.service_of("redis") == "redis"


def test_faults_and_their_trace_minutes(bench, nezha):
    day = nezha / "rca_data" / DAY
    faults = bench.read_faults(day)
    assert [(f.at, f.pod, f.kind, f.service, f.expected_cause) for f in faults] == [
        (datetime(2022, 8, 22, 10, 0, 40), CART, "cpu_contention", "cartservice", "cpu_contention"),
        (datetime(2022, 8, 22, 11, 0, 0), PAYMENT, "exception", "paymentservice", "application")]
    assert faults[0].minutes() == ("10_00_trace.csv", "10_01_trace.csv", "10_02_trace.csv")
    assert bench.missing_minutes(faults[0], day / "trace") == []
    assert bench.missing_minutes(faults[1], day / "trace") == ["11_00", "11_02"]


def test_spans_kinds_parents_and_peers(bench, nezha):
    trace_dir = nezha / "rca_data" / DAY / "trace"
    report = bench.SpanReport()
    spans = bench.read_spans(sorted(trace_dir.glob("*_trace.csv")), report)
    assert (report.read, report.duplicates, report.malformed) == (len(SPANS) + 2, 1, 1)
    assert len(spans) == len(SPANS)
    kinds = bench.span_kinds(spans, report)
    assert {span: kinds[trace, span] for trace, span, *_ in SPANS} == EXPECTED_KINDS
    assert report.orphans == 0 and report.kinds == {"SERVER": 5, "CLIENT": 3, "INTERNAL": 1}

    node_of = bench.group_nodes(bench.read_pod_metrics(nezha / "rca_data" / DAY / "metric")[0]).node_of
    requests = bench.trace_requests(spans, kinds, node_of)
    out = {}
    for request in requests:
        for rs in request["resourceSpans"]:
            resource = {a["key"]: a["value"]["stringValue"] for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    out[span["spanId"]] = (resource, span)
    for trace, span_id, parent, pod, name, start_s, duration_ms in SPANS:
        resource, span = out[span_id]
        assert resource == {"service.name": bench.service_of(pod), "k8s.pod.name": pod,
                            "k8s.namespace.name": bench.NAMESPACE, "k8s.node.name": node_of[pod]}
        assert span["traceId"] == trace and span["name"] == name
        assert span.get("parentSpanId") == (None if parent == "root" else parent)
        assert int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]) == duration_ms * 1_000_000
        kind, peer = EXPECTED_KINDS[span_id]
        assert span["kind"] == kind
        attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
        assert attributes.get("peer.service") == ({"stringValue": peer} if peer else None)
        entry = parent == "root" and pod == FRONTEND  # only the shop's entry requests carry the tier
        assert (TIER_HEADER_ATTRIBUTE in attributes) == entry
        if entry:
            assert attributes[TIER_HEADER_ATTRIBUTE] == {"arrayValue": {"values": [{"stringValue": bench.TIER}]}}
        assert "status" not in span


def test_node_grouping(bench, nezha):
    pods, bad = bench.read_pod_metrics(nezha / "rca_data" / DAY / "metric")
    assert bad == 0 and sorted(pods) == sorted((*NODE_A, *NODE_B))
    grouping = bench.group_nodes(pods)
    assert grouping.node_of == {CART: "node-1", FRONTEND: "node-1", CHECKOUT: "node-2", PAYMENT: "node-2"}
    assert grouping.nodes == {"node-1": [CART, FRONTEND], "node-2": [CHECKOUT, PAYMENT]}
    assert grouping.pairs[CART, FRONTEND] == (MINUTES, MINUTES)
    assert grouping.pairs[CHECKOUT, PAYMENT] == (MINUTES - 1, MINUTES - 1)  # the minute with a missing sample
    assert grouping.pairs[CART, CHECKOUT] == (0, MINUTES - 1)
    lines = grouping.lines()
    assert lines[0].startswith(f"node-1: {CART}, {FRONTEND} (") and f"at {MINUTES}/{MINUTES} minutes" in lines[0]


def test_metrics_names_values_and_times(bench, nezha):
    pods, _ = bench.read_pod_metrics(nezha / "rca_data" / DAY / "metric")
    node_of = bench.group_nodes(pods).node_of
    requests = bench.metric_requests(pods, node_of)
    series = {}
    for request in requests:
        for rm in request["resourceMetrics"]:
            resource = {a["key"]: a["value"]["stringValue"] for a in rm["resource"]["attributes"]}
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    for p in m["gauge"]["dataPoints"]:
                        attributes = {a["key"]: a["value"]["stringValue"] for a in p.get("attributes", [])}
                        key = (m["name"], m["unit"], resource.get("k8s.pod.name"), resource["k8s.node.name"],
                               tuple(sorted(attributes.items())))
                        value = int(p["asInt"]) if "asInt" in p else p["asDouble"]
                        series.setdefault(key, []).append((int(p["timeUnixNano"]), value))
            if "k8s.pod.name" in resource:
                assert resource["k8s.namespace.name"] == bench.NAMESPACE
    times = [(T0 + 60 * minute + 19) * NS + 250_000_000 for minute in range(MINUTES)]
    expected = {}
    for i, pod in enumerate((*NODE_A, *NODE_B)):
        node = node_of[pod]
        expected["k8s.pod.cpu.usage", "{cpu}", pod, node, ()] = [(t, cpu_m(i, m) / 1000) for m, t in enumerate(times)]
        expected["k8s.pod.memory.working_set", "By", pod, node, ()] = [
            (t, round(memory_mi(i, m) * 2**20)) for m, t in enumerate(times)]
    for node, letter in (("node-1", "A"), ("node-2", "B")):
        values = NODE_VALUES[letter]
        expected["system.cpu.utilization", "1", None, node, (("state", "user"),)] = [
            (t, values[m][0] / 100) for m, t in enumerate(times) if values[m][0]]
        expected["system.memory.utilization", "1", None, node, (("state", "used"),)] = [
            (t, values[m][1] / 100) for m, t in enumerate(times)]
    assert series.keys() == expected.keys()
    for key, points in expected.items():
        assert [t for t, _ in series[key]] == [t for t, _ in points], key
        assert [v for _, v in series[key]] == pytest.approx([v for _, v in points]), key
    assert bench.count_points(requests) == sum(len(p) for p in expected.values())
    # the window keeps [since, until)
    assert bench.count_points(bench.metric_requests(pods, node_of, times[1], times[2])) == 4 * 2 + 2 * 2
    last = bench.metric_requests(pods, node_of, times[2])
    assert bench.count_points(last) == 4 * 2 + 2 * 2 - 1  # node-2's CPU lacks that minute's sample


def test_ingest_accepts_the_conversion(bench, nezha, tmp_path):
    day = nezha / "rca_data" / DAY
    spans = bench.read_spans(sorted((day / "trace").glob("*_trace.csv")))
    kinds = bench.span_kinds(spans)
    pods, _ = bench.read_pod_metrics(day / "metric")
    node_of = bench.group_nodes(pods).node_of
    metric_reqs = bench.metric_requests(pods, node_of)
    traces = bench.write_jsonl(tmp_path / "traces.jsonl", bench.trace_requests(spans, kinds, node_of))
    metrics = bench.write_jsonl(tmp_path / "metrics.jsonl", metric_reqs)
    loaded = bench.ingest(tmp_path / "store.duckdb", [traces, metrics])
    assert loaded["rc"] == 0, loaded["stderr"]
    servers = sum(kind == 2 for kind, _ in EXPECTED_KINDS.values())
    assert (loaded["requests"], loaded["samples"]) == (servers, bench.count_points(metric_reqs))
    assert "tier header defaulted: 0 invalid" in loaded["stderr"]  # frontend's roots carry a tier the spec knows


def test_scoring_tolerates_missing_keys(bench):
    fault = bench.Fault(DAY, datetime(2022, 8, 22, 10, 0, 40), CART, "cpu_contention")
    code = bench.Fault(DAY, datetime(2022, 8, 22, 10, 0, 40), CART, "return")
    cause = {"service": "cartservice", "pod": CART, "node": "node-1", "cause": "cpu_contention", "score": 0.9}
    hit = bench.score(fault, "node-1", {"moment": {"causes": [cause], "culprits": []}})
    assert (hit["service"], hit["node_cause"], hit["application"]) == (True, True, None)
    assert hit["expected"] == "cartservice node-1 cpu_contention" and hit["got"] == "cartservice node-1 cpu_contention"
    wrong_node = bench.score(fault, "node-2", {"moment": {"causes": [cause]}})
    assert (wrong_node["service"], wrong_node["node_cause"]) == (True, False)
    # no service key (the moment of an analysis that names none) is a miss, not an error
    bare = bench.score(fault, "node-1", {"moment": {"causes": [{"node": "node-1", "cause": "cpu_contention"}]}})
    assert (bare["service"], bare["node_cause"]) == (False, True)
    culprit = {"service": "cartservice", "pod": CART, "node": "node-1", "kind": "self", "share": 0.7}
    by_culprit = bench.score(code, "node-1", {"moment": {"causes": [], "culprits": [culprit]}})
    assert (by_culprit["service"], by_culprit["application"]) == (True, False)
    assert by_culprit["got"] == "cartservice node-1 self (culprit)"
    application = dict(cause, cause="application")
    assert bench.score(code, "node-1", {"moment": {"causes": [application]}})["application"] is True
    for document in ({}, {"error": "exit 1"}, {"moment": None}, {"moment": {"causes": "x", "culprits": [1]}}):
        missed = bench.score(fault, "node-1", document)
        assert (missed["service"], missed["node_cause"]) == (False, False)


def test_command_line_on_the_case(nezha, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "public_rca.py"), "--data", str(nezha),
                           "--day", DAY, "--work", str(tmp_path), "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"node-1: {CART}, {FRONTEND}" in done.stdout
    assert "faults: 2; analysed 1; skipped 1 for want of a trace file" in done.stdout
    assert f"skipped {DAY} 11:00:00 {PAYMENT} exception: no 11_00 or 11_02 trace file" in done.stdout
    assert "service AC@1" in done.stdout and "Nezha (reads logs too) 92.86 %" in done.stdout
    (case,) = json.loads((tmp_path / "out.json").read_text())
    assert case["at"] == f"{DAY}T10:01:40Z" and case["node"] == "node-1"
    assert "moment" in case["answer"]
    assert (tmp_path / DAY / "100040" / "store.duckdb").exists()
