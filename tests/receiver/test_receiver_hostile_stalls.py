"""Clients that announce much and then stall: HTTP bodies declared (or chunks announced) large with a byte sent,
and gRPC calls that send their headers and never their message. Neither may take from well-behaved clients the
in-flight budget, the threads or the time their requests need. Real servers on 127.0.0.1."""

import json
import threading
import time

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from sloscope.edge.auth import BearerAuth
from sloscope.edge.grpc_admission import REFUSING_THREADS
from sloscope.receiver.limits import Limits
from tests.in_process import InProcessReceiver
from tests.otlp_builders import span, traces
from tests.raw_http import RawClient, request
from tests.receiver.test_receiver_limits import _eventually

T0 = 1_764_410_400_000_000_000
MiB = 2**20
JSON = {"Content-Type": "application/json"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # each channel its own connection
ADMITTED_S = 0.5  # for calls just started to reach the server (on 127.0.0.1, milliseconds)
TOKEN = b"a-token-of-sixteen-or-more"


@pytest.fixture
def serve(tmp_path):
    made = []

    def make(**limits):
        made.append(InProcessReceiver(tmp_path / f"r{len(made)}.duckdb", Limits(**limits)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _body(n: int, first: int) -> bytes:
    return json.dumps(traces([span(f"{first + i:032x}", f"{first + i:016x}", T0 + i, 50, tier=["standard"])
                              for i in range(n)])).encode()


def _grpc_request(first: int) -> trace_service_pb2.ExportTraceServiceRequest:
    message = trace_service_pb2.ExportTraceServiceRequest()
    message.resource_spans.add().scope_spans.add().spans.add(
        trace_id=first.to_bytes(16, "big"), span_id=first.to_bytes(8, "big"), name="POST /x", kind=2,
        start_time_unix_nano=T0, end_time_unix_nano=T0 + 10**6)
    return message


STALLED_HEADS = {
    "declared": b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
    "chunked": b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n{",
}


@pytest.mark.parametrize("framing", STALLED_HEADS)
def test_bodies_that_stall_hold_only_the_bytes_they_sent(serve, framing):
    """Eight clients each announcing a body of the whole limit, a quarter of the budget, and sending one byte
    hold eight bytes of it: a good client still gets its 200 at once, over HTTP and gRPC."""
    s = serve(max_inflight_bytes=4 * MiB, max_body_bytes=MiB, grpc_max_message_bytes=MiB)
    stalled = [RawClient(s.http_port) for _ in range(8)]
    for client in stalled:
        client.send(STALLED_HEADS[framing] % MiB)
    assert _eventually(lambda: s.receiver.inflight.held == len(stalled))
    with RawClient(s.http_port, timeout=5) as good:
        began = time.monotonic()
        good.send(request("/v1/traces", _body(3, first=1), JSON))
        assert good.response()[0] == 200 and time.monotonic() - began < 2
    with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}") as channel:
        assert not trace_service_pb2_grpc.TraceServiceStub(channel).Export(_grpc_request(100), timeout=5) \
            .partial_success.rejected_spans
    assert s.receiver.counts["requests_refused_memory"] == 0
    for client in stalled:
        client.close()
    assert _eventually(lambda: s.receiver.inflight.held == 0)
    assert s.spans() == 4


def test_bytes_past_the_budget_are_refused_as_they_arrive_and_a_declared_length_past_the_limit_at_once(serve):
    s = serve(max_inflight_bytes=100_000, max_body_bytes=80_000, grpc_max_message_bytes=80_000)
    whole = _body(150, first=1)
    assert 60_000 < len(whole) < 80_000
    with RawClient(s.http_port) as holder, RawClient(s.http_port) as second:
        holder.send(request("/v1/traces", whole, JSON)[:-1000])  # all but the end: what it sent is held
        assert _eventually(lambda: s.receiver.inflight.held == len(whole) - 1000)
        second.send(request("/v1/traces", _body(150, first=1000), JSON))
        status, headers, _ = second.response()  # its bytes would pass the budget: retry later, on a new connection
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        holder.send(whole[-1000:])
        assert holder.response()[0] == 200
    with RawClient(s.http_port) as c:
        c.send(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 80001\r\n\r\n{")
        assert c.response()[0] == 413
    # A request's bytes are given back once its answer is sent: the client may read the answer first.
    assert _eventually(lambda: s.receiver.inflight.held == 0)
    assert s.receiver.counts["requests_refused_memory"] == 1 and s.receiver.counts["requests_too_large"] == 1
    assert s.spans() == 150


def _silent_calls(port: int, n: int, hold: threading.Event) -> tuple[list, list]:
    """n Export calls, each on its own connection, that send their headers and never their message."""
    def never():
        hold.wait()
        yield from ()

    channels, calls = [], []
    for _ in range(n):
        channels.append(grpc.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION))
        export = channels[-1].stream_unary(EXPORT, request_serializer=bytes, response_deserializer=bytes)
        calls.append(export.future(never()))
    return channels, calls


def _export(port: int, first: int, timeout: float = 5.0) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) as channel:
        try:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(_grpc_request(first), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_silent_grpc_calls_take_no_thread_from_the_others_and_past_the_limit_are_refused(serve):
    s = serve(grpc_max_concurrent_rpcs=12)
    hold = threading.Event()
    channels, calls = _silent_calls(s.grpc_port, 11, hold)  # more than a pool of 8 threads, within the limit
    try:
        time.sleep(ADMITTED_S)
        assert _export(s.grpc_port, 1) == grpc.StatusCode.OK
        more_channels, more_calls = _silent_calls(s.grpc_port, 1, hold)  # the limit reached
        channels += more_channels
        time.sleep(ADMITTED_S)
        # refused at once, not queued behind the silent calls: those were all admitted, each with its thread
        assert _export(s.grpc_port, 2, timeout=1) == grpc.StatusCode.UNAVAILABLE
        assert not any(call.done() for call in calls + more_calls)
    finally:
        hold.set()
        for channel in channels:
            channel.close()
    assert s.spans() == 1


def test_silent_grpc_calls_are_cut_off_with_their_connection(serve):
    """A connection is told to go away after the body deadline and closed after another: the calls it holds
    end there, and the calls of others are taken again."""
    s = serve(grpc_max_concurrent_rpcs=4, read_timeout_s=1.0)
    hold = threading.Event()
    channels, calls = _silent_calls(s.grpc_port, 4, hold)
    try:
        began = time.monotonic()
        time.sleep(ADMITTED_S)
        assert _export(s.grpc_port, 1, timeout=1) == grpc.StatusCode.UNAVAILABLE
        assert _eventually(lambda: all(call.done() for call in calls), within_s=4)
        assert time.monotonic() - began < 3.5  # twice the body deadline, give or take gRPC's 10% jitter
        assert {call.exception().code() for call in calls} == {grpc.StatusCode.UNAVAILABLE}
        assert _export(s.grpc_port, 2) == grpc.StatusCode.OK
    finally:
        hold.set()
        for channel in channels:
            channel.close()
    assert s.spans() == 1


def test_a_call_cancelled_before_its_message_gives_its_place_back(serve):
    """The bound on calls is given back however a call ends: one cancelled while its message was awaited (which
    grpcio ends before a unary handler runs) must not hold its place for ever."""
    s = serve(grpc_max_concurrent_rpcs=2)
    hold = threading.Event()
    answers = []  # every answer the test got: each UNAVAILABLE is one call the server counted as busy

    def export() -> grpc.StatusCode:
        answers.append(_export(s.grpc_port, 1, timeout=1))
        return answers[-1]

    for _ in range(3):  # more rounds than places: a place kept by a cancelled call would refuse the last ones
        channels, calls = _silent_calls(s.grpc_port, 2, hold)
        time.sleep(ADMITTED_S)
        assert export() == grpc.StatusCode.UNAVAILABLE  # both places taken
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()
        # A place comes back as the cancellation reaches the server: an export just before it is refused too.
        assert _eventually(lambda: export() == grpc.StatusCode.OK, within_s=5)
    hold.set()
    assert s.receiver.counts["requests_grpc_busy"] == answers.count(grpc.StatusCode.UNAVAILABLE) >= 3


def test_silent_calls_without_the_token_hold_no_thread(tmp_path):
    """A call refused for its token is refused at once, without its message awaited: silent ones, more than the
    server has threads, leave a call with the token served."""
    s = InProcessReceiver(tmp_path / "r.duckdb", Limits(grpc_max_concurrent_rpcs=2), auth=BearerAuth(TOKEN))
    hold = threading.Event()
    try:
        channels, calls = _silent_calls(s.grpc_port, 2 + REFUSING_THREADS + 2, hold)
        assert _eventually(lambda: all(call.done() for call in calls), within_s=5)
        assert {call.exception().code() for call in calls} == {grpc.StatusCode.UNAUTHENTICATED}
        with grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}", options=OWN_CONNECTION) as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                _grpc_request(1), timeout=5, metadata=(("authorization", f"Bearer {TOKEN.decode()}"),))
        assert s.spans() == 1
    finally:
        hold.set()
        for channel in channels:
            channel.close()
        s.close()
