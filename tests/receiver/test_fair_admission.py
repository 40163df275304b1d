"""Fair admission on serve's listeners: what one client address holds (idle connections, slow requests, gRPC
calls that never send their message, idle HTTP/2 connections) leaves a client at another address served. Real
`sloscope serve` processes; the hostile clients connect from 127.0.0.2, the good ones from 127.0.0.1 (or ::1)."""

import socket
import threading
import time

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from tests.alerting_stack import free_port
from tests.hostile_clients import (ANSWERED_S, ATTACKER, h2_connection, idle_keepalive, serving, silent_calls,
                                   slow_bodies)
from tests.otlp_http import post
from tests.raw_http import RawClient, request
from tests.receiver.test_receiver_hostile_stalls import ADMITTED_S, OWN_CONNECTION, _grpc_request, _silent_calls

TOKEN = "a-token-of-sixteen-or-more"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}


def _export(target: str, first: int, timeout: float = 5.0) -> grpc.StatusCode:
    with grpc.insecure_channel(target, options=OWN_CONNECTION) as channel:
        try:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(_grpc_request(first), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _closed(clients) -> int:
    """How many of the raw clients the server has closed."""
    return sum(_at_eof(client.sock) for client in clients)


def _soon(check, within_s: float = 5.0) -> bool:
    """Whether `check()` holds within `within_s`: a close reaches the client a moment after the server makes it,
    later on a loaded machine."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _at_eof(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _body() -> bytes:
    return _grpc_request(1).SerializeToString()


def test_an_idle_flood_from_one_address_leaves_another_served(tmp_path):
    """530 idle keep-alive connections (GET /healthz needs no token) at the default limits: each good export,
    on a new connection, is answered at once, and the flood holds no more than its address's share."""
    with serving(tmp_path / "s.duckdb", env={"SLOSCOPE_BEARER_TOKEN": TOKEN}) as port:
        flood = idle_keepalive(ATTACKER, port, 530)
        try:
            for _ in range(8):
                began = time.monotonic()
                with RawClient(port, timeout=5) as good:
                    good.send(request("/v1/traces", _body(), AUTH))
                    assert good.response()[0] == 200 and time.monotonic() - began < ANSWERED_S
            assert _soon(lambda: len(flood) - _closed(flood) <= 128)  # --max-connections-per-peer
        finally:
            for client in flood:
                client.close()


def test_idle_connections_are_shed_first_when_the_cap_is_near(tmp_path):
    """At the cap, a new connection is taken by closing an idle one (oldest first, of the address holding the
    most), never one in a request."""
    with serving(tmp_path / "s.duckdb", "--max-connections", "8", "--read-timeout", "20") as port:
        busy = slow_bodies(ATTACKER, port, 4)
        idle = idle_keepalive(ATTACKER, port, 4)
        good = [RawClient(port, timeout=5) for _ in range(4)]
        try:
            for client in good:  # each kept open: the four places are the idle ones'
                client.send(request("/v1/traces", _body(), {"Content-Type": "application/x-protobuf"}))
                assert client.response()[0] == 200
            assert _soon(lambda: _closed(idle) == 4) and _closed(busy) == 0
        finally:
            for client in busy + idle + good:
                client.close()


def test_the_greedy_address_is_refused_503_with_retry_after_while_others_pass(tmp_path):
    with serving(tmp_path / "s.duckdb", "--max-inflight-requests-per-peer", "2") as port:
        held = slow_bodies(ATTACKER, port, 2)
        try:
            more = slow_bodies(ATTACKER, port, 1)[0]
            status, headers, _ = more.response()
            assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
            assert post(f"http://127.0.0.1:{port}/v1/traces", _body()) is None
        finally:
            for client in held:
                client.close()


def test_a_grpc_call_that_never_sends_its_message_ends_at_the_deadline_and_frees_its_place(tmp_path):
    grpc_port = free_port()
    target = f"127.0.0.1:{grpc_port}"
    with serving(tmp_path / "s.duckdb", "--grpc-max-concurrent-rpcs", "4", "--grpc-first-message-timeout", "1",
                 grpc=target):
        sock = h2_connection(ATTACKER, grpc_port)
        try:
            silent_calls(sock, 4)
            time.sleep(ADMITTED_S)
            began = time.monotonic()
            assert _export(target, 1, timeout=1) == grpc.StatusCode.UNAVAILABLE  # every place taken
            while _export(target, 2, timeout=1) != grpc.StatusCode.OK:
                assert time.monotonic() - began < 3, "the silent calls kept their places past the deadline"
                time.sleep(0.1)
        finally:
            sock.close()


def test_the_grpc_connection_cap_holds(tmp_path):
    """Past --grpc-max-connections, gRPC closes new connections at once; a client already connected goes on,
    and serve's HTTP pages still answer."""
    grpc_port = free_port()
    target = f"127.0.0.1:{grpc_port}"
    with serving(tmp_path / "s.duckdb", "--grpc-max-connections", "8", grpc=target) as port:
        with grpc.insecure_channel(target, options=OWN_CONNECTION) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            stub.Export(_grpc_request(1), timeout=5)
            flood = [h2_connection(ATTACKER, grpc_port) for _ in range(40)]
            try:
                assert sum(sock is not None for sock in flood) <= 7  # the good client holds the eighth
                stub.Export(_grpc_request(2), timeout=5)
                with RawClient(port, timeout=5) as page:
                    page.send(request("/healthz", b"", method="GET", length=False))
                    assert page.response()[0] == 200
            finally:
                for sock in flood:
                    if sock is not None:
                        sock.close()


def test_the_greedy_address_is_refused_unavailable_over_grpc_while_others_pass(tmp_path, ipv6_loopback):
    """Calls past --grpc-max-concurrent-rpcs-per-peer from 127.0.0.1 are UNAVAILABLE at once; one from ::1 is
    served (serve listens on both, so that grpcio's clients, which connect from no other address, differ)."""
    grpc_port = free_port()
    with serving(tmp_path / "s.duckdb", "--grpc-max-concurrent-rpcs-per-peer", "2", grpc=f"[::]:{grpc_port}"):
        hold = threading.Event()
        channels, calls = _silent_calls(grpc_port, 2, hold)
        try:
            time.sleep(ADMITTED_S)
            began = time.monotonic()
            assert _export(f"127.0.0.1:{grpc_port}", 1) == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - began < ANSWERED_S
            assert _export(f"[{ipv6_loopback}]:{grpc_port}", 2) == grpc.StatusCode.OK
        finally:
            hold.set()
            for channel in channels:
                channel.close()
