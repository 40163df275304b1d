"""Partial acceptance: spans and data points whose source names no node are kept, on the explicitly unknown node
(counted), never costing the rest of their request; node attribution skips that node, tier SLIs count it. The
fixtures in tests/data/otlp/ have the shape of the opentelemetry-proto project's examples, which name no node."""

import base64
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sloscope.analytics.attribution import Window, signal_steps
from sloscope.analytics.rca import analyse
from sloscope.analytics.slo import sli_windows
from sloscope.analytics.store import Store
from sloscope.catalog import UNKNOWN_NODE
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec
from tests.otlp_builders import SPAN_ID, TRACE_ID, gauge, metrics, resource, span, write_lines
from tests.in_process import InProcessReceiver

DATA = Path(__file__).parents[1] / "data" / "otlp"
T0 = 1_764_410_400_000_000_000
S = 10**9


@pytest.fixture
def server(tmp_path):
    s = InProcessReceiver(tmp_path / "a.duckdb")
    yield s
    s.close()


def _example(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _post_json(server, path, doc):
    status, _, reply = server.post(path, json.dumps(doc).encode(), "application/json")
    assert status == 200, reply
    return json.loads(reply)


def _as_protobuf(doc: dict) -> bytes:
    """The same request as protobuf (whose JSON mapping spells ids in base64, not hex)."""
    doc = json.loads(json.dumps(doc))
    for block in doc["resourceSpans"]:
        for scope in block["scopeSpans"]:
            for s in scope["spans"]:
                for key in {"traceId", "spanId", "parentSpanId"} & s.keys():
                    s[key] = base64.b64encode(bytes.fromhex(s[key])).decode()
    return ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()


ROWS = f"SELECT {TRACE_ID}, {SPAN_ID}, node, service, pod, namespace, tier, status_code FROM requests"
EXPECTED_ROW = ("9f3a0c2e5b7d41a8b6c0d2e4f6a8b0c2", "a1b2c3d4e5f60718", UNKNOWN_NODE, "chat-frontend",
                "chat-frontend-6d9f7", "serving", "p99-latency-critical", 200)


def test_an_example_shaped_trace_without_a_node_is_kept_on_the_unknown_node(server):
    reply = _post_json(server, "/v1/traces", _example("trace_without_node.json"))
    assert "partialSuccess" not in reply
    assert server.rows(ROWS) == [EXPECTED_ROW]
    counters = server.store.counters()
    assert counters["spans_node_unknown"] == 2 and "spans_not_server" not in counters  # its CLIENT span is kept too
    assert server.rows("SELECT kind, printf('%016x', parent_id), node FROM spans") == [(3, "a1b2c3d4e5f60718",
                                                                                       UNKNOWN_NODE)]


def test_over_protobuf_a_span_without_a_node_takes_the_fast_path_to_the_same_row(server):
    status, _, _ = server.post("/v1/traces", _as_protobuf(_example("trace_without_node.json")))
    assert status == 200
    assert server.rows(ROWS) == [EXPECTED_ROW]
    counters = server.store.counters()
    assert counters["trace_requests_fast_path"] == 1 and counters["spans_node_unknown"] == 2  # and its CLIENT span


def _batch_of_many_sources() -> dict:
    """What a Collector's batch processor sends: resources of several sources merged into one request."""
    def block(spans, **attrs):
        return {"resource": resource(**attrs), "scopeSpans": [{"scope": {"name": "envoy"}, "spans": spans}]}

    return {"resourceSpans": [
        block([span(f"{i:032x}", f"{i:016x}", T0 + i, 100) for i in (1, 2)], service_name="gw", host_name="gpu-node-1"),
        block([span(f"{3:032x}", f"{3:016x}", T0, 100)], service_name="gw", k8s_pod_name="gw-1"),
        block([span(f"{4:032x}", f"{4:016x}", T0, 100)], service_name="llm", hw_id="GPU-7"),
        block([span(f"{5:032x}", f"{5:016x}", T0, 100)], service_name="llm", hw_id="GPU-never-seen"),
    ]}


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_a_resource_without_a_node_never_costs_the_others_in_its_batch(server, encoding):
    _post_json(server, "/v1/metrics", metrics([gauge("hw.gpu.temperature", [(T0, 60.0)], {"hw.id": "GPU-7"})],
                                              node="gpu-node-7"))
    doc = _batch_of_many_sources()
    if encoding == "json":
        assert "partialSuccess" not in _post_json(server, "/v1/traces", doc)
    else:
        assert server.post("/v1/traces", _as_protobuf(doc))[0] == 200
    assert server.rows(f"SELECT {TRACE_ID}[-1:], node, pod FROM requests ORDER BY trace_hi, trace_lo") == [
        ("1", "gpu-node-1", None), ("2", "gpu-node-1", None), ("3", UNKNOWN_NODE, "gw-1"), ("4", "gpu-node-7", None),
        ("5", UNKNOWN_NODE, None)]
    counters = server.store.counters()
    assert counters["spans_node_unknown"] == 2 and counters["spans_node_from_gpu"] == 1


def test_example_shaped_metrics_without_a_node_are_kept_and_teach_no_gpu_a_node(server):
    reply = _post_json(server, "/v1/metrics", _example("metrics_without_node.json"))
    assert reply["partialSuccess"]["rejectedDataPoints"] == "1"  # the explicit-bucket histogram
    assert "points_unsupported_type" in reply["partialSuccess"]["errorMessage"]
    gpu_span = {"resourceSpans": [{"resource": resource(service_name="llm", hw_id="GPU-0b5e"),
                                   "scopeSpans": [{"spans": [span("e" * 32, "f" * 16, T0, 100)]}]}]}
    _post_json(server, "/v1/traces", gpu_span)
    assert server.rows("SELECT node, metric, value FROM samples ORDER BY metric") == [
        (UNKNOWN_NODE, "hw.gpu.temperature", 64.0), (UNKNOWN_NODE, "sloscope.tcp.retransmits", 7.0)]
    assert server.store.rows("SELECT node FROM requests") == [(UNKNOWN_NODE,)]
    counters = server.store.counters()
    assert counters["points_node_unknown"] == 2 and "spans_node_from_gpu" not in counters


def test_ingest_keeps_example_shaped_files_without_a_node(tmp_path):
    files = [str(write_lines(tmp_path / name, [_example(name)]))
             for name in ("trace_without_node.json", "metrics_without_node.json")]
    assert main(["ingest", "--db", str(tmp_path / "i.duckdb"), *files]) == 0
    with Store(tmp_path / "i.duckdb", read_only=True) as store:
        assert store.rows(ROWS) == [EXPECTED_ROW]
        assert store.rows("SELECT DISTINCT node FROM samples") == [(UNKNOWN_NODE,)]
        counters = store.counters()
    assert counters["spans_node_unknown"] == 2 and counters["points_node_unknown"] == 2  # SERVER and CLIENT span


def _slow_requests_without_a_node(start_ns: int, seconds: int) -> dict:
    spans = [span(f"{i + 1:032x}", f"{i + 1:016x}", start_ns + i * S // 2, 900, tier="standard")
             for i in range(seconds * 2)]
    return {"resourceSpans": [{"resource": resource(service_name="llm"), "scopeSpans": [{"spans": spans}]}]}


def test_attribution_skips_the_unknown_node_while_the_tier_sli_counts_it(tmp_path):
    temperatures = [(T0 + i * S, 60.0 if i < 660 else 95.0) for i in range(720)]
    lines = [_slow_requests_without_a_node(T0 + 660 * S, 60),
             {"resourceMetrics": [{"resource": resource(service_name="exporter"), "scopeMetrics": [
                 {"metrics": [gauge("hw.gpu.temperature", temperatures, {"hw.id": "GPU-1"})]}]}]}]
    db = tmp_path / "rca.duckdb"
    assert main(["ingest", "--db", str(db), str(write_lines(tmp_path / "slow.jsonl", lines))]) == 0
    spec = load_spec(None)
    with Store(db, read_only=True) as store:
        incidents = analyse(store, spec)["incidents"]
        assert [(i["node"], i["tier"], i["causes"]) for i in incidents] == [(UNKNOWN_NODE, "standard", [])]
        start = datetime(2025, 11, 29, 10, 0)
        windows = sli_windows(store, spec, start, start + timedelta(minutes=13))["standard"]
        assert windows.filter(windows["node"] == UNKNOWN_NODE)["requests"].sum() == 120
        window = Window.around(start + timedelta(minutes=11), start + timedelta(minutes=12), spec.resolution_s)
        assert store.scalar("SELECT count(*) FROM samples WHERE node = ?", [UNKNOWN_NODE]) == 720
        assert signal_steps(store, window).is_empty()


def test_a_declared_summary_is_reported_back_point_by_point():
    """A summary (Prometheus's, through the prometheus receiver) under a name the spec declares is not kept: each
    of its data points is reported back, not one per metric."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from sloscope.receiver.otlp_json import Decoder
    from sloscope.receiver.otlp_proto import ProtoDecoder

    summary = {"name": "go_gc_duration_seconds", "summary": {"dataPoints": [
        {"timeUnixNano": str(T0), "count": "3", "sum": 0.5,
         "attributes": [{"key": "instance", "value": {"stringValue": f"n{i}:9100"}}]} for i in range(3)]}}
    doc = metrics([summary], node="gpu-node-1")
    declared = frozenset({"go_gc_duration_seconds"})
    for decoder, request in ((Decoder(declared=declared), doc),
                             (ProtoDecoder(declared=declared), ParseDict(doc, ExportMetricsServiceRequest()))):
        decoder.decode(request)
        assert decoder.skipped["points_unsupported_type"] == 3
    snake = {"name": "go_gc_duration_seconds", "summary": {"data_points": summary["summary"]["dataPoints"]}}
    decoder = Decoder(declared=declared)
    decoder.decode(metrics([snake], node="gpu-node-1"))
    assert decoder.skipped["points_unsupported_type"] == 3
