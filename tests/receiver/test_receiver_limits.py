"""The receiver under hostile clients: malformed framing, chunked bodies, slow clients, connection and byte
limits, keep-alive kept in sync by every error answer, cut-off gzip, and gRPC's message and call limits.
Real servers on 127.0.0.1; raw sockets for what no client library sends."""

import gzip
import json
import threading
import time

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from sloscope.receiver.limits import Limits
from tests.in_process import InProcessReceiver
from tests.otlp_builders import span, traces
from tests.raw_http import RawClient, chunked, request

T0 = 1_764_410_400_000_000_000
JSON = {"Content-Type": "application/json"}


class Served(InProcessReceiver):
    """`gate`, when given, holds every request in the intake until it is set; `entered` counts those held."""

    def __init__(self, db, limits: Limits, gate: threading.Event | None = None):
        self.entered = threading.Semaphore(0)

        def gated(intake):
            def held(*request):
                self.entered.release()
                gate.wait(30)
                return intake(*request)
            return held

        super().__init__(db, limits, wrap=gated if gate else None)
        self.port = self.http_port


@pytest.fixture
def serve(tmp_path):
    made = []

    def make(gate=None, **limits):
        made.append(Served(tmp_path / f"r{len(made)}.duckdb", Limits(**limits), gate))
        return made[-1]

    yield make
    for s in made:
        s.close()


def body(n=2, first=1) -> bytes:
    return json.dumps(traces([span(f"{first + i:032x}", f"{first + i:016x}", T0 + i, 50, tier=["standard"])
                              for i in range(n)])).encode()


@pytest.mark.parametrize("framing", [
    "Content-Length: -1", "Content-Length: 12abc", "Content-Length: +5", "Content-Length: 0x10",
    "Content-Length: 5\r\nContent-Length: 5", "Content-Length: 5, 5",
    "Content-Length: 5\r\nTransfer-Encoding: chunked",
    "Transfer-Encoding: chunked, chunked", "Transfer-Encoding: identity", "Transfer-Encoding: chunked, gzip",
])
def test_bad_content_length_is_a_400_that_closes(serve, framing):
    s = serve()
    with RawClient(s.port) as c:
        c.send(f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
               .encode() + b"hello")
        status, headers, _ = c.response()
        assert status == 400 and headers["connection"] == "close"
        assert c.closed_by_server()
    assert s.receiver.counts["requests_bad_framing"] == 1
    with RawClient(s.port) as c:  # and the server goes on serving
        c.send(request("/v1/traces", body(), JSON))
        assert c.response()[0] == 200


def test_a_transfer_coding_before_chunked_is_501_and_other_methods_are_405(serve):
    s = serve()
    with RawClient(s.port) as c:
        c.send(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        assert c.response()[0] == 501  # well-formed, not implemented (RFC 9112)
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"):
        with RawClient(s.port) as c:
            c.send(f"{method} /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".encode())
            status, headers, answer = c.response()
            assert (status, headers["allow"]) == (405, "GET, POST") and (method != "HEAD" or answer == b"")
    assert s.receiver.counts["requests_bad_method"] == 5
    with RawClient(s.port) as c:
        c.send(request("/v1/traces", body(), JSON))
        assert c.response()[0] == 200


def test_an_http2_client_on_the_http_port_gets_an_http_505(serve):
    s = serve()
    with RawClient(s.port) as c:  # the HTTP/2 connection preface, as a gRPC exporter sent to :4318 opens with
        c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert c.response()[0] == 505


def test_chunked_gzip_bodies_are_taken_within_the_same_limit(serve):
    s = serve(max_body_bytes=64 * 1024)
    with RawClient(s.port) as c:
        framed = {**JSON, "Transfer-Encoding": "chunked", "Content-Encoding": "gzip"}
        c.send(request("/v1/traces", chunked(gzip.compress(body(5)), 7), framed, length=False))
        assert c.response()[0] == 200
        c.send(request("/v1/traces", chunked(body(3, first=100), 1000), {**JSON, "Transfer-Encoding": "chunked"},
                       length=False))
        assert c.response()[0] == 200  # the same connection: the chunked body was read to its end
        c.send(request("/v1/traces", chunked(b"x" * 70_000, 8192), {**JSON, "Transfer-Encoding": "chunked"},
                       length=False))
        status, headers, _ = c.response()
        assert status == 413 and headers["connection"] == "close"
    assert s.receiver.counts["requests_too_large"] == 1
    assert s.spans() == 8


def test_slow_headers_and_bodies_are_cut_off_and_connections_are_capped(serve):
    s = serve(read_header_timeout_s=1.0, read_timeout_s=1.0)
    with RawClient(s.port) as slow:
        started = time.monotonic()
        sent = slow.trickle(request("/v1/traces", body(), JSON), every_s=0.1)
        assert slow.closed_by_server(), "a header byte every 0.1 s must not hold the connection"
        assert time.monotonic() - started < 4 and sent < 60
    with RawClient(s.port) as c:  # headers in time, the body never complete: a 408, then closed
        c.send(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        assert c.response()[0] == 408 and c.closed_by_server()
    assert s.receiver.counts["requests_header_timeout"] == 1 and s.receiver.counts["requests_body_timeout"] == 1

    capped = serve(max_connections=2)
    # Both slots, taken by connections inside a request: an idle connection would make room for the third.
    idle = [RawClient(capped.port), RawClient(capped.port)]
    for client in idle:
        client.send(b"POST /v1/traces HTTP/1.1\r\n")
    time.sleep(0.3)
    with RawClient(capped.port) as third:
        third.send(request("/v1/traces", body(), JSON))
        assert third.silent_for(0.5)  # waiting in the backlog, not served
        idle[0].close()
        assert third.response()[0] == 200
    idle[1].close()
    assert capped.receiver.counts["http_connection_limit_waits"] == 1


def test_error_answers_keep_the_connection_in_sync(serve):
    """An answer given before the body is read closes the connection; one given after keeps it. A request
    hidden in an unread body is never taken for the next request."""
    s = serve()
    smuggled = request("/v1/traces", body(1, first=500), JSON)
    for path, headers in (("/v1/nope", JSON), ("/v1/traces", {"Content-Type": "text/plain"}),
                          ("/v1/traces", {**JSON, "Content-Encoding": "br"})):
        with RawClient(s.port) as c:
            c.send(request(path, smuggled, headers) + request("/v1/traces", body(1, first=600), JSON))
            status, reply_headers, _ = c.response()
            assert status in (404, 415) and reply_headers["connection"] == "close"
            assert c.closed_by_server()
    with RawClient(s.port) as c:
        c.send(request("/v1/traces", b"{not json", JSON))
        status, reply_headers, _ = c.response()
        assert status == 400 and "connection" not in reply_headers
        c.send(request("/v1/traces", body(2, first=700), JSON))
        assert c.response()[0] == 200
    assert s.spans() == 2


def test_cut_off_gzip_is_a_400(serve):
    s = serve()
    whole = gzip.compress(body(20))
    for cut in (whole[:-8], whole[: len(whole) // 2], whole[:10], b""):
        with RawClient(s.port) as c:
            c.send(request("/v1/traces", cut, {**JSON, "Content-Encoding": "gzip"}))
            status, _, reply = c.response()
            assert status == 400, reply
    assert s.receiver.counts["requests_bad_gzip"] == 4
    assert s.spans() == 0


def test_request_bytes_in_flight_are_bounded(serve):
    """A body being received holds its bytes against the budget; one that would pass it gets a retryable 503,
    and once the first is done the budget is whole again."""
    s = serve(max_inflight_bytes=100_000, max_body_bytes=80_000, grpc_max_message_bytes=80_000)
    whole = body(150)
    assert 60_000 < len(whole) < 100_000
    holder = RawClient(s.port)
    holder.send(request("/v1/traces", whole, JSON)[:-1000])  # all but the end: the bytes sent are held
    assert _eventually(lambda: s.receiver.inflight.held == len(whole) - 1000)
    with RawClient(s.port) as c:
        c.send(request("/v1/traces", body(150, first=1000), JSON))
        status, headers, _ = c.response()
        assert status == 503 and headers["retry-after"] == "1"
    holder.send(whole[-1000:])
    assert holder.response()[0] == 200
    holder.close()
    assert _eventually(lambda: s.receiver.inflight.held == 0)  # given back once the answer is out
    with RawClient(s.port) as c:
        c.send(request("/v1/traces", body(150, first=1000), JSON))
        assert c.response()[0] == 200
    assert s.receiver.counts["requests_refused_memory"] == 1
    with RawClient(s.port) as c:  # headers are bounded too: 1 MiB by default, then the connection closes
        pad = {f"X-Pad-{i}": "a" * 60_000 for i in range(30)}
        try:
            c.send(request("/v1/traces", body(1, first=5000), {**JSON, **pad}))
        except OSError:
            pass  # closed while still sending
        assert c.closed_by_server()
    assert s.receiver.counts["requests_headers_too_large"] == 1
    assert s.spans() == 300


def _eventually(condition, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _grpc_request(n: int, first: int = 1) -> trace_service_pb2.ExportTraceServiceRequest:
    request = trace_service_pb2.ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add()
    for i in range(n):
        one = spans.spans.add(trace_id=(first + i).to_bytes(16, "big"), span_id=(first + i).to_bytes(8, "big"),
                              name="POST /x", kind=2, start_time_unix_nano=T0, end_time_unix_nano=T0 + 10**6)
        one.attributes.add(key="http.route").value.string_value = "/x" * 40
    return request


# As the OTLP exporters do, a call refused with UNAVAILABLE is tried again: with one stream per connection, a stream
# the client opens as the one before it closes may reach the server first and be refused (HTTP/2 REFUSED_STREAM).
RETRY_UNAVAILABLE = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps({"methodConfig": [{
    "name": [{}], "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}))]


def test_grpc_message_size_and_concurrent_calls_are_bounded(serve):
    own_connection = [("grpc.use_local_subchannel_pool", 1)]  # each channel its own connection
    gate = threading.Event()
    per_connection = serve(gate=gate, grpc_max_message_bytes=20_000, grpc_max_concurrent_streams=1)
    with grpc.insecure_channel(f"127.0.0.1:{per_connection.grpc_port}",
                               options=own_connection + RETRY_UNAVAILABLE) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(_grpc_request(1000), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        first = stub.Export.future(_grpc_request(3), timeout=20)
        assert per_connection.entered.acquire(timeout=10)  # the first call is inside the receiver
        second = stub.Export.future(_grpc_request(3, first=10), timeout=20)
        assert not per_connection.entered.acquire(timeout=0.5)  # the second waits for a stream, at the client
        gate.set()
        assert not first.result().partial_success.rejected_spans
        assert not second.result().partial_success.rejected_spans
    assert per_connection.spans() == 6

    gate = threading.Event()
    in_all = serve(gate=gate, grpc_max_concurrent_rpcs=1)
    with grpc.insecure_channel(f"127.0.0.1:{in_all.grpc_port}", options=own_connection) as channel, \
            grpc.insecure_channel(f"127.0.0.1:{in_all.grpc_port}", options=own_connection) as other_channel:
        first = trace_service_pb2_grpc.TraceServiceStub(channel).Export.future(_grpc_request(3), timeout=20)
        assert in_all.entered.acquire(timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            trace_service_pb2_grpc.TraceServiceStub(other_channel).Export(_grpc_request(3, first=20), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        gate.set()
        assert not first.result().partial_success.rejected_spans
    assert in_all.spans() == 3
