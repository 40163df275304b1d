"""The gRPC calls admitted at once, in all and from one client address, how long a call may take to send its
message, and what the others are answered.

grpcio's own bound (`maximum_concurrent_rpcs`) answers the calls past it RESOURCE_EXHAUSTED without RetryInfo,
which the OTLP specification makes a permanent refusal: the Collector's otlp exporter and the SDKs drop the batch.
A busy server is backpressure, as an HTTP 503 is, so the bound is kept here instead and the calls past it end
UNAVAILABLE, which every OTLP client retries. The bound in all is taken when a call arrives, before it holds a
thread, and given back when its handler ends, however it ends: the handler reads its one request message itself
(a streaming handler), so that a call cancelled while its message is awaited ends in the handler too, where grpcio
would drop a unary one before its handler ran. The client's address is known only there, so the bound per address
is taken there, at once. grpcio waits for a message without a deadline of its own; a call whose message has not
come within `first_message_s` is cancelled (CANCELLED, which OTLP clients retry), and its places given back.

grpcio offers no hook where a connection is accepted, nor a way to close one: connections are capped in all by
gRPC's core (`grpc.max_allowed_incoming_connections`, new ones closed at once past it) and idle ones closed after
the idle timeout (`grpc.max_connection_idle_ms`), but neither per address nor idle ones first.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from typing import Callable

import grpc

from sloscope.edge.peers import peer_ip

# Threads beyond the admitted calls' own, for answering the refused ones: a refusal reads nothing and is over at
# once, so a few serve any rate of them, and the admitted calls never wait behind them for long.
REFUSING_THREADS = 4


class Admission(grpc.ServerInterceptor):
    """At most `limit` calls in progress, `per_peer` from one client address; the others end UNAVAILABLE at once
    with `busy` (counted as `requests_grpc_busy`) or `peer_busy` (`requests_grpc_peer_busy`). A call's message is
    due within `first_message_s` (else `requests_grpc_first_message_timeout`)."""

    def __init__(self, limit: int, per_peer: int, first_message_s: float, count: Callable[[str], None],
                 busy: str, peer_busy: str):
        self.limit, self.per_peer, self.first_message_s = limit, per_peer, first_message_s
        self.count = count
        self.peer_busy = peer_busy
        self._busy = grpc.stream_unary_rpc_method_handler(functools.partial(_refuse_busy, busy))
        self._active = 0
        self._peers: Counter = Counter()
        self._lock = threading.Lock()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        with self._lock:
            admitted = self._active < self.limit
            if admitted:
                self._active += 1
        if not admitted:
            self.count("requests_grpc_busy")
            return self._busy
        return grpc.stream_unary_rpc_method_handler(self._released_after(handler.unary_unary),
                                                    request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    def _released_after(self, unary):
        def serve(requests, context):
            try:
                with self._peer_place(peer_ip(context.peer()) or context.peer(), context):
                    return unary(self._first_message(requests, context), context)
            finally:
                with self._lock:
                    self._active -= 1

        return serve

    @contextlib.contextmanager
    def _peer_place(self, peer: str, context):
        """One of `peer`'s places while the call runs; past them, the call ends UNAVAILABLE."""
        with self._lock:
            admitted = not self.per_peer or self._peers[peer] < self.per_peer  # 0: no cap per address
            if admitted:
                self._peers[peer] += 1
        if not admitted:
            self.count("requests_grpc_peer_busy")
            context.abort(grpc.StatusCode.UNAVAILABLE, self.peer_busy)
        try:
            yield
        finally:
            with self._lock:
                self._peers[peer] -= 1
                if not self._peers[peer]:
                    del self._peers[peer]

    def _first_message(self, requests, context):
        """The call's request message, awaited until its deadline, past which the call is cancelled. Either the
        message or the deadline comes first, under one lock: a message that arrives as the call is being cancelled
        is not taken, since its client, told CANCELLED, sends it again."""
        decided, first = threading.Lock(), []  # first: "deadline" or "message", whichever took the lock first

        def cut_off():
            with decided:
                if first:
                    return
                first.append("deadline")
            self.count("requests_grpc_first_message_timeout")
            context.cancel()

        deadline = threading.Timer(self.first_message_s, cut_off)
        deadline.daemon = True
        deadline.start()
        try:
            request = next(requests, None)
        finally:
            deadline.cancel()
        with decided:
            first.append("message")
        if first[0] == "deadline":
            context.abort(grpc.StatusCode.CANCELLED, "the request message came after its deadline")
        if request is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")
        return request


def _refuse_busy(message: str, _requests, context):
    context.abort(grpc.StatusCode.UNAVAILABLE, message)
