"""The gRPC calls admitted at once, and what the others are answered.

grpcio's own bound (`maximum_concurrent_rpcs`) answers the calls past it RESOURCE_EXHAUSTED without RetryInfo,
which the OTLP specification makes a permanent refusal: the Collector's otlp exporter and the SDKs drop the batch.
A busy server is backpressure, as an HTTP 503 is, so the bound is kept here instead and the calls past it end
UNAVAILABLE, which every OTLP client retries. The bound is taken when a call arrives, before it holds a thread,
and given back when its handler ends, however it ends: the handler reads its one request message itself (a
streaming handler), so that a call cancelled while its message is awaited ends in the handler too, where grpcio
would drop a unary one before its handler ran.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

import grpc

# Threads beyond the admitted calls' own, for answering the refused ones: a refusal reads nothing and is over at
# once, so a few serve any rate of them, and the admitted calls never wait behind them for long.
REFUSING_THREADS = 4


class Admission(grpc.ServerInterceptor):
    """At most `limit` calls in progress; the others end UNAVAILABLE at once with `busy` (what the client is told),
    counted as `requests_grpc_busy`."""

    def __init__(self, limit: int, count: Callable[[str], None], busy: str):
        self.limit = limit
        self.count = count
        self._busy = grpc.stream_unary_rpc_method_handler(functools.partial(_refuse_busy, busy))
        self._active = 0
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
                request = next(requests, None)
                if request is None:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")
                return unary(request, context)
            finally:
                with self._lock:
                    self._active -= 1

        return serve


def _refuse_busy(message: str, _requests, context):
    context.abort(grpc.StatusCode.UNAVAILABLE, message)
