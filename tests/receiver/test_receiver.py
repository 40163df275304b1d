"""`sloscope serve`'s receiving end: OTLP/HTTP and gRPC in, rows out; bad input refused with the right codes."""

import gzip
import http.client
import json
import signal
import subprocess
import sys
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from sloscope.analytics.store import Store
from tests.alerting_stack import free_port, wait_listening
from tests.in_process import InProcessReceiver
from tests.otlp_builders import gauge, metrics, span, traces

T0 = 1_764_410_400_000_000_000


@pytest.fixture
def server(tmp_path):
    s = InProcessReceiver(tmp_path / "r.duckdb")
    yield s
    s.close()


def _proto_traces(n=3, tier="p99-latency-critical"):
    from google.protobuf.json_format import ParseDict

    doc = traces([span(f"{i + 1:032x}", f"{i + 1:016x}", T0 + i, 100, tier=[tier]) for i in range(n)])
    for rs in doc["resourceSpans"]:  # protobuf's JSON mapping wants base64 ids
        for s in rs["scopeSpans"][0]["spans"]:
            import base64
            s["traceId"] = base64.b64encode(bytes.fromhex(s["traceId"])).decode()
            s["spanId"] = base64.b64encode(bytes.fromhex(s["spanId"])).decode()
    return ParseDict(doc, trace_service_pb2.ExportTraceServiceRequest())


def test_protobuf_and_json_over_http_land_in_the_store(server):
    status, _, _ = server.post("/v1/traces", _proto_traces(3).SerializeToString())
    assert status == 200
    body = json.dumps(traces([span("a" * 32, "b" * 16, T0, 250, tier=["bogus"])])).encode()
    status, headers, reply = server.post("/v1/traces", body, "application/json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    m = json.dumps(metrics([gauge("hw.gpu.temperature", [(T0, 61.0)], {"hw.id": "GPU-1"})])).encode()
    assert server.post("/v1/metrics", gzip.compress(m), "application/json", {"Content-Encoding": "gzip"})[0] == 200
    assert server.rows("SELECT tier, count(*) FROM requests GROUP BY tier ORDER BY tier") == [
        ("p99-latency-critical", 3), ("standard", 1)]
    assert server.store.rows("SELECT node, value FROM samples") == [("gpu-node-1", 61.0)]
    assert server.store.counters()["tier_invalid"] == 1


def test_grpc_export_lands_in_the_store(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        reply = stub.Export(_proto_traces(5), timeout=10)
    assert not reply.partial_success.rejected_spans
    assert server.rows("SELECT count(*) FROM requests") == [(5,)]


@pytest.mark.parametrize("path,body,content_type,code,counter", [
    ("/v1/traces", b"\xff\xff\xff not protobuf", "application/x-protobuf", 400, "traces_invalid"),
    ("/v1/traces", b"{nope", "application/json", 400, "traces_invalid"),
    ("/v1/traces", b'{"resourceSpans": "x"}', "application/json", 400, "traces_invalid"),
    ("/v1/other", b"", "application/x-protobuf", 404, "requests_unknown_path"),
    ("/v1/traces", b"x", "text/plain", 415, "requests_bad_content_type"),
    ("/v1/traces", b"x", "", 415, "requests_bad_content_type"),
])
def test_bad_requests_get_client_errors_and_are_counted(server, path, body, content_type, code, counter):
    status, _, _ = server.post(path, body, content_type)
    assert status == code and server.receiver.counts[counter] == 1
    assert server.post("/v1/traces", _proto_traces(1).SerializeToString())[0] == 200  # still serving


def test_oversized_and_gzip_bomb_bodies_are_refused(server):
    bomb = gzip.compress(b"\0" * (40 * 2**20))
    status, _, _ = server.post("/v1/traces", bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and server.receiver.counts["requests_too_large"] == 1


def test_a_full_writer_answers_503_with_retry_after(tmp_path):
    s = InProcessReceiver(tmp_path / "full.duckdb", start_writer=False, queue_rows=4)
    try:
        first = []  # queued, and answered only once the writer has committed it
        waiting = threading.Thread(target=lambda: first.append(
            s.post("/v1/traces", _proto_traces(3).SerializeToString())[0]))
        waiting.start()
        while not s.writer.stats()["queued_requests"]:
            waiting.join(0.01)
        status, headers, _ = s.post("/v1/traces", _proto_traces(3).SerializeToString())
        assert status == 503 and headers["Retry-After"] == "1"
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(_proto_traces(3), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not first
        s.writer.start()
        waiting.join(10)
        assert first == [200]
        assert s.rows("SELECT count(*) FROM requests") == [(3,)]
    finally:
        s.close()


@pytest.mark.parametrize("depth", [20, 50])  # past sloscope's limit; past protobuf's own
def test_deeply_nested_attributes_are_invalid_argument_over_grpc(server, depth):
    request = _proto_traces(1)
    value = request.resource_spans[0].resource.attributes.add(key="deep").value
    for _ in range(depth):
        value = value.array_value.values.add()
    value.string_value = "x"
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server.receiver.counts["traces_invalid"] == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2000), st.sampled_from(["/v1/traces", "/v1/metrics", "/v1/logs"]))
def test_random_protobuf_bodies_never_break_the_server(server, body, path):
    status, _, _ = server.post(path, body)
    assert status in (200, 400)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_valid_protobuf_never_breaks_the_server(server, data):
    body = bytearray(_proto_traces(2).SerializeToString())
    for _ in range(data.draw(st.integers(1, 5))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    status, _, _ = server.post("/v1/traces", bytes(body))
    assert status in (200, 400)


def test_sigterm_writes_everything_accepted(tmp_path):
    db, http_port = tmp_path / "s.duckdb", free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db),
                             "--http", f"127.0.0.1:{http_port}", "--grpc", "off"],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(http_port, proc, "sloscope serve")
        accepted = 0
        for i in range(20):
            body = json.dumps(traces([span(f"{i * 100 + k + 1:032x}", f"{i * 100 + k + 1:016x}", T0, 100)
                                      for k in range(50)])).encode()
            conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/json"})
            accepted += 50 if conn.getresponse().status == 200 else 0
            conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store(db, read_only=True) as store:
        assert store.rows("SELECT count(*) FROM requests") == [(accepted,)] and accepted == 1000


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize("body,content_type", [
    (lambda: _mutated_proto_span(start_time_unix_nano=2**64 - 10, end_time_unix_nano=2**64 - 1),
     "application/x-protobuf"),
    (lambda: _json(traces([span("a" * 32, "b" * 16, 2**64 - 10**9, 1)])), "application/json"),
    (lambda: _json(traces([span("a" * 32, "b" * 16, T0, 1, status=70000)])), "application/json"),
    (lambda: _json(metrics([gauge("hw.gpu.temperature", [(2**63, 61.0)])])), "application/json"),
])
def test_numbers_beyond_what_the_store_keeps_are_invalid_not_a_crash(server, body, content_type):
    """Times, counts and status codes are stored as bounded integers: a value past them is the client's
    mistake (400 and counted), not an exception in the request thread."""
    signal_path = "/v1/metrics" if b"resourceMetrics" in body() else "/v1/traces"
    status, _, reply = server.post(signal_path, body(), content_type)
    assert status == 400, reply
    assert server.receiver.counts[f"{signal_path.rsplit('/', 1)[1]}_invalid"] == 1
    assert server.post("/v1/traces", _proto_traces(1).SerializeToString())[0] == 200


def _mutated_proto_span(**fields) -> bytes:
    request = _proto_traces(1)
    for name, value in fields.items():
        setattr(request.resource_spans[0].scope_spans[0].spans[0], name, value)
    return request.SerializeToString()
