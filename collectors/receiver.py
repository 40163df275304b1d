"""The OTLP receiver: OTLP/HTTP (protobuf and JSON) and OTLP/gRPC, decoding into protocol-neutral batches
and handing them to an intake that may refuse them when it is full.

Responses follow the OTLP specification: a malformed payload is a non-retryable 400 / INVALID_ARGUMENT; a
full intake is a retryable 503 with Retry-After / UNAVAILABLE, so exporters back off and resend instead of
sloscope buffering without bound; data points that were well-formed but could not be kept are reported as
partial success.
"""

from __future__ import annotations

import inspect
import logging
import threading
import urllib.parse
import zlib
from collections import Counter
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import grpc
import orjson
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from sloscope.records import Batch

from collectors import otlp_proto, otlp_spans
from collectors.otlp_common import DecodeError
from collectors.otlp_json import Decoder

log = logging.getLogger("sloscope.receiver")
MAX_BODY_BYTES = 32 * 2**20
RETRY_AFTER_S = 1
SIGNALS = ("traces", "metrics", "logs")
RESPONSES = {"traces": trace_service_pb2.ExportTraceServiceResponse,
             "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
             "logs": logs_service_pb2.ExportLogsServiceResponse}
REJECTED_FIELD = {"traces": "rejected_spans", "metrics": "rejected_data_points", "logs": "rejected_log_records"}
# Well-formed data that cannot be kept, reported back as partial success.
UNKEPT = ("points_not_finite", "points_unsupported_type")
# Protobuf trace requests by the decoder that read them (ingest counters): a falling share of the fast path
# means an exporter writes what only the general decoder reads, at a fraction of the rate.
FAST_PATH, GENERAL_PATH = "trace_requests_fast_path", "trace_requests_general_path"


@dataclass
class Outcome:
    accepted: bool  # False: the intake is full, the client should retry later
    rejected: int = 0
    message: str = ""


Intake = Callable[[str, Batch, dict], Outcome]  # (signal, batch, decoding counts) -> outcome
# Decodes and takes in a whole request body elsewhere (worker processes): (signal, body, is_json) ->
# (outcome, decoding counts); raises DecodeError.
Offload = Callable[[str, bytes, bool], tuple[Outcome, dict]]


def fast_decode(signal: str, body: bytes, is_json: bool) -> tuple[Batch, dict] | None:
    """(batch, counts) by the trace fast path (otlp_spans), or None where it does not apply or declines."""
    if signal != "traces" or is_json:
        return None
    fast = otlp_spans.span_table(body)
    if fast is None:
        return None
    spans, not_server = fast
    counts = {FAST_PATH: 1}
    if not_server:
        counts["spans_not_server"] = not_server
    return Batch(spans=spans), counts


class Decoders:
    """A JSON and a protobuf decoder, which keep caches between requests (so: one per thread or process)."""

    def __init__(self):
        self.json, self.proto = Decoder(), otlp_proto.ProtoDecoder()

    def decode(self, signal: str, body: bytes, is_json: bool) -> tuple[Batch, dict]:
        """(batch, counts) of one export request body by the general path; raises DecodeError."""
        decoder = self.json if is_json else self.proto
        decoder.skipped.clear()
        request = parse_json(body) if is_json else otlp_proto.parse(signal, body)
        batch, counts = decoder.decode(request), dict(decoder.skipped)
        if signal == "traces" and not is_json:
            counts[GENERAL_PATH] = 1
        return batch, counts


class Receiver:
    """Decodes requests and passes them to the intake; counts everything it refuses. With an offload, bodies
    of at least `offload_bytes` that the fast path declines are decoded by it instead (the fast path needs no
    other process: it runs without the interpreter lock)."""

    def __init__(self, intake: Intake, offload: Offload | None = None, offload_bytes: int = 0):
        self.intake = intake
        self.offload = offload
        self.offload_bytes = offload_bytes
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()  # decoders keep caches; one per thread

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _decoders(self) -> Decoders:
        if not hasattr(self._local, "decoders"):
            self._local.decoders = Decoders()
        return self._local.decoders

    def accept_body(self, signal: str, body: bytes, is_json: bool) -> Outcome:
        """Parse, decode and offer one export request body; DecodeError: the whole request is invalid."""
        decoded = fast_decode(signal, body, is_json)
        if decoded is None and self.offload is not None and len(body) >= self.offload_bytes:
            return self._offered(signal, *self.offload(signal, body, is_json))
        batch, skips = decoded or self._decoders().decode(signal, body, is_json)
        return self._offered(signal, self.intake(signal, batch, skips), skips)

    def _offered(self, signal: str, outcome: Outcome, skips: dict) -> Outcome:
        if not outcome.accepted:
            self.count(f"{signal}_refused_full")
            return outcome
        unkept = sum(skips.get(k, 0) for k in UNKEPT)
        if unkept:
            outcome.rejected, outcome.message = unkept, f"{unkept} data points were not finite or of an unsupported type"
        self.count(f"{signal}_requests_accepted")
        return outcome


# --- OTLP/HTTP --------------------------------------------------------------------------------------------


# GET handler: (**query parameters, if it takes any) -> (body, content type). A ValueError it raises is the
# client's mistake (400).
Page = Callable[..., tuple[bytes, str]]


class _HttpHandler(BaseHTTPRequestHandler):
    receiver: Receiver
    pages: dict[str, Page]
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the status line and the body go out in two writes: no delayed-ACK stall
    server_version = "sloscope-otlp"

    def log_message(self, fmt, *args):  # noqa: D401 - quiet: per-request logs would swamp the log
        log.debug("%s " + fmt, self.address_string(), *args)

    def do_GET(self):  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        page = self.pages.get(path)
        if page is None:
            return self._plain(404, f"not found; GET serves {', '.join(sorted(self.pages)) or 'nothing'}")
        # A page that takes parameters gets the query's (and an unknown one is a 400); others ignore the query.
        params = dict(urllib.parse.parse_qsl(query)) if inspect.signature(page).parameters else {}
        try:
            inspect.signature(page).bind(**params)
        except TypeError as exc:
            return self._plain(400, f"{path}: {exc}")
        try:
            body, content_type = page(**params)
        except ValueError as exc:
            return self._plain(400, f"{path}: {exc}")
        except Exception as exc:  # a failing page must not take the receiver down
            log.exception("GET %s failed", self.path)
            return self._plain(500, f"{type(exc).__name__}: {exc}")
        self._send(200, body, content_type)

    def do_POST(self):  # noqa: N802 - http.server's naming
        signal = {f"/v1/{s}": s for s in SIGNALS}.get(self.path.split("?", 1)[0])
        if signal is None:
            return self._plain(404, "unknown path: OTLP/HTTP serves /v1/traces, /v1/metrics and /v1/logs")
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type not in ("application/x-protobuf", "application/json"):
            return self._plain(415, "Content-Type must be application/x-protobuf or application/json")
        is_json = content_type == "application/json"
        body = self._body()
        if body is None:
            return
        try:
            outcome = self.receiver.accept_body(signal, body, is_json)
        except DecodeError as exc:
            self.receiver.count(f"{signal}_invalid")
            return self._status(400, str(exc), is_json)
        if not outcome.accepted:
            return self._status(503, "sloscope is busy writing; retry later", is_json,
                                {"Retry-After": str(RETRY_AFTER_S)})
        response = RESPONSES[signal]()
        if outcome.rejected:
            setattr(response.partial_success, REJECTED_FIELD[signal], outcome.rejected)
            response.partial_success.error_message = outcome.message
        self._send(200, _encode(response, is_json), content_type)

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._plain(411, "Content-Length required")
            return None
        if length > MAX_BODY_BYTES:
            self.receiver.count("requests_too_large")
            self._plain(413, f"body larger than {MAX_BODY_BYTES} bytes", close=True)
            return None
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding != "gzip":
            self._plain(415, f"unsupported Content-Encoding {encoding!r} (gzip or none)")
            return None
        try:  # bounded: a small gzip bomb must not inflate past the limit
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = inflater.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error as exc:
            self.receiver.count("requests_bad_gzip")
            self._plain(400, f"bad gzip body: {exc}")
            return None
        if len(body) > MAX_BODY_BYTES or inflater.unconsumed_tail:
            self.receiver.count("requests_too_large")
            self._plain(413, f"decompressed body larger than {MAX_BODY_BYTES} bytes")
            return None
        return body

    def _status(self, code: int, message: str, is_json: bool, headers: dict | None = None):
        # OTLP/HTTP error bodies are google.rpc.Status, encoded like the request.
        grpc_code = 3 if code == 400 else 14  # INVALID_ARGUMENT, UNAVAILABLE
        if is_json:
            body, content_type = orjson.dumps({"code": grpc_code, "message": message}), "application/json"
        else:
            from google.rpc import status_pb2

            body = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
            content_type = "application/x-protobuf"
        self._send(code, body, content_type, headers)

    def _plain(self, code: int, message: str, close: bool = False):
        self._send(code, message.encode() + b"\n", "text/plain; charset=utf-8", close=close)

    def _send(self, code: int, body: bytes, content_type: str, headers: dict | None = None, close: bool = False):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


def parse_json(body: bytes):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None


def _encode(message, is_json: bool) -> bytes:
    if not is_json:
        return message.SerializeToString()
    from google.protobuf.json_format import MessageToDict

    return orjson.dumps(MessageToDict(message))


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def http_server(receiver: Receiver, host: str, port: int, pages: dict[str, Page] | None = None) -> ThreadingHTTPServer:
    """OTLP/HTTP on POST; `pages` adds GET endpoints (such as /metrics) on the same port."""
    handler = type("Handler", (_HttpHandler,), {"receiver": receiver, "pages": dict(pages or {})})
    return _HttpServer((host, port), handler)


# --- OTLP/gRPC --------------------------------------------------------------------------------------------


GRPC_SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService",
                 "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
                 "logs": "opentelemetry.proto.collector.logs.v1.LogsService"}


def _export_handler(signal: str, receiver: Receiver):
    """Export takes the raw request bytes, so that a payload protobuf cannot parse is this server's
    INVALID_ARGUMENT (and counted), exactly as over HTTP, rather than gRPC's own INTERNAL."""

    def export(body: bytes, context):
        try:
            outcome = receiver.accept_body(signal, body, is_json=False)
        except DecodeError as exc:
            receiver.count(f"{signal}_invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not outcome.accepted:
            context.abort(grpc.StatusCode.UNAVAILABLE, "sloscope is busy writing; retry later")
        response = RESPONSES[signal]()
        if outcome.rejected:
            setattr(response.partial_success, REJECTED_FIELD[signal], outcome.rejected)
            response.partial_success.error_message = outcome.message
        return response

    return grpc.unary_unary_rpc_method_handler(export, request_deserializer=None,
                                               response_serializer=lambda m: m.SerializeToString())


def grpc_server(receiver: Receiver, host: str, port: int, workers: int = 8) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)])
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler(service, {"Export": _export_handler(signal, receiver)})
        for signal, service in GRPC_SERVICES.items()])
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    return server, bound
