"""A small OTLP metrics receiver for tests, on 127.0.0.1: OTLP/HTTP (POST /v1/metrics, protobuf) or OTLP/gRPC
(MetricsService/Export). It records every request it accepted, and can be stopped and started again on the
same port, or told to answer with an error, to play an endpoint that goes away.

    sink = OtlpSink("http"); sink.start()      # sink.endpoint -> "http://127.0.0.1:PORT"
    ...; sink.stop(); ...; sink.start()        # same port again
    sink.fail_with = 503                       # HTTP status (or a grpc.StatusCode) for every request
    sink.refuse = lambda request: 400 or None  # the same, per request (None: accept it)
    sink.retry_after = 2                       # failures carry Retry-After: 2 (HTTP) or RetryInfo (gRPC)
    sink.partially_rejected = 3                # successes are partial: "rejected 3 data points"
    sink.requests                              # [ExportMetricsServiceRequest, ...] in arrival order
    sink.failures                              # [(time.monotonic(), code), ...] of every failure answered
    OtlpSink("grpc", tls=pki.server)           # TLS (tests/fakes/tls.py); with client_ca, mutual TLS

Failures are answered as the OTLP specification says: HTTP with a google.rpc.Status body, gRPC with the
RetryInfo in the status details (the grpc-status-details-bin trailer).

Run as a script (`python -m tests.fakes.otlp_sink --protocol http --port 4318`) it prints a line per request.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

STATUS_DETAILS = "grpc-status-details-bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OtlpSink:
    def __init__(self, protocol: str = "http", port: int | None = None, *, delay_s: float = 0.0, on_request=None,
                 tls=None):
        if protocol not in ("http", "grpc"):
            raise ValueError("protocol is http or grpc")
        self.protocol = protocol
        self.port = port or free_port()
        self.delay_s = delay_s  # answer this late (a slow endpoint)
        self.fail_with = None  # HTTP status code or grpc.StatusCode to answer every request with
        self.refuse = None  # request -> HTTP status code, grpc.StatusCode or None (accept)
        self.retry_after: float | None = None
        self.partially_rejected = 0
        self.on_request = on_request
        self.tls = tls  # tests.fakes.tls.ServerTls or None (plain text)
        self.headers_seen: dict = {}
        self.requests: list[ExportMetricsServiceRequest] = []
        self.failures: list[tuple[float, object]] = []
        self.rejected = 0
        self.lock = threading.Lock()
        self._server = None
        self._thread = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def _failure(self, request: ExportMetricsServiceRequest | None):
        """The failure to answer this request with, or None to accept it (and counted when there is one)."""
        code = self.fail_with
        if code is None and self.refuse is not None and request is not None:
            code = self.refuse(request)
        if code is not None:
            with self.lock:
                self.rejected += 1
                self.failures.append((time.monotonic(), code))
        return code

    def _accept(self, request: ExportMetricsServiceRequest) -> bytes:
        with self.lock:
            self.requests.append(request)
        if self.on_request:
            self.on_request(request)
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if self.partially_rejected:
            response.partial_success.rejected_data_points = self.partially_rejected
            response.partial_success.error_message = "some points were not kept"
        return response.SerializeToString()

    def _status(self, code: int, message: str) -> bytes:
        status = status_pb2.Status(code=code, message=message)
        if self.retry_after is not None:
            info = error_details_pb2.RetryInfo()
            info.retry_delay.FromTimedelta(datetime.timedelta(seconds=self.retry_after))
            status.details.add().Pack(info)
        return status.SerializeToString()

    # -- lifecycle

    def start(self) -> "OtlpSink":
        if self._server is not None:
            return self
        if self.protocol == "http":
            self._start_http()
        else:
            self._start_grpc()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self.protocol == "http":
            server.shutdown()
            server.server_close()  # joins handler threads: an accepted request is answered first
            self._thread.join(5)
        else:
            server.stop(grace=2).wait(5)

    def __enter__(self) -> "OtlpSink":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- HTTP

    def _start_http(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so stop() never waits on an idle keep-alive connection
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.path != "/v1/metrics":
                    return self._answer(404, b"not found")
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/x-protobuf":
                    return self._answer(415, b"protobuf only")
                if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                    import gzip

                    body = gzip.decompress(body)
                try:
                    request = ExportMetricsServiceRequest.FromString(body)
                except Exception:
                    request = None
                code = sink._failure(request)
                if code is not None:
                    headers = {"Retry-After": f"{sink.retry_after:g}"} if sink.retry_after is not None else {}
                    return self._answer(int(code), sink._status(2, "failing on purpose"), "application/x-protobuf",
                                        headers)
                if request is None:
                    return self._answer(400, sink._status(3, "not an ExportMetricsServiceRequest"),
                                        "application/x-protobuf")
                sink.headers_seen = {k.lower(): v for k, v in self.headers.items()}
                self._answer(200, sink._accept(request), "application/x-protobuf")

            def _answer(self, code: int, body: bytes, ctype: str = "text/plain", headers: dict | None = None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = False
        if self.tls:  # a failed handshake is an OSError in accept(), which the server survives
            server.socket = self.tls.ssl_context().wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    # -- gRPC

    def _start_grpc(self) -> None:
        import grpc
        from concurrent import futures

        sink = self

        class Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                code = sink._failure(request)
                if code is not None:
                    details = sink._status(code.value[0], "failing on purpose")
                    context.set_trailing_metadata(((STATUS_DETAILS, details),))
                    context.abort(code, "failing on purpose")
                sink.headers_seen = dict(context.invocation_metadata())
                return metrics_service_pb2.ExportMetricsServiceResponse.FromString(sink._accept(request))

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Servicer(), server)
        address = f"127.0.0.1:{self.port}"
        bound = (server.add_secure_port(address, self.tls.grpc_credentials()) if self.tls
                 else server.add_insecure_port(address))
        if bound != self.port:
            server.stop(0)
            raise OSError(f"could not bind 127.0.0.1:{self.port}")
        server.start()
        self._server = server

    # -- what arrived

    def points(self) -> list[tuple[str, str, tuple, int, object]]:
        """(metric, kind, attributes, time_unix_nano, value) of every data point received, in order.
        value: the number for gauges and sums, (count, sum, zero_count, offset, buckets) for exponential
        histograms."""
        out = []
        with self.lock:
            requests = list(self.requests)
        for req in requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            attrs = tuple(sorted((kv.key, str(kv.value.string_value or kv.value.int_value))
                                                 for kv in p.attributes))
                            if kind == "exponential_histogram":
                                value = (p.count, p.sum, p.zero_count, p.positive.offset,
                                         tuple(p.positive.bucket_counts))
                            else:
                                value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            out.append((m.name, kind, attrs, p.time_unix_nano, value))
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    def show(request):
        n = sum(len(getattr(m, m.WhichOneof("data")).data_points) for rm in request.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics)
        print(f"request: {n} points", flush=True)

    sink = OtlpSink(args.protocol, args.port or None, on_request=show).start()
    print(f"listening on {sink.endpoint} ({args.protocol})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        sink.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
