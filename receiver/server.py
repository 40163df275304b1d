"""The OTLP receiver: OTLP/HTTP (protobuf and JSON) and OTLP/gRPC, decoding into protocol-neutral batches
and handing them to an intake that may refuse them when it is full.

Responses follow the OTLP specification: a malformed payload is a non-retryable 400 / INVALID_ARGUMENT, one
holding more items than a request may (request_items.py) a non-retryable 413 / RESOURCE_EXHAUSTED; a
full intake is a retryable 503 with Retry-After / UNAVAILABLE, so exporters back off and resend instead of
sloscope buffering without bound; data points that were well-formed but could not be kept are reported as
partial success. Over HTTP, every error answer to an export request is a google.rpc.Status encoded like the request.
"""

from __future__ import annotations

import errno
import inspect
import logging
import socket
import threading
import urllib.parse
from collections import Counter
from concurrent import futures
from io import BufferedReader
from typing import Callable

import grpc
import orjson
from google.protobuf.json_format import MessageToDict
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from sloscope.addresses import address_text
from sloscope.edge.auth import BearerAuth, BearerInterceptor
from sloscope.edge.budget import ByteBudget, Exhausted, Reservation
from sloscope.edge.draining import KeepAliveHandler
from sloscope.edge.grpc_admission import REFUSING_THREADS, Admission
from sloscope.edge.http_body import BodyError, declared_length, read_body
from sloscope.edge.http_conn import ConnectionCaps, DeadlineReader, LimitedHTTPServer
from sloscope.edge.peers import peer_ip
from sloscope.edge.tls import TlsFiles
from sloscope.records import Batch, Outcome

from sloscope.receiver import content_coding, freed_memory, otlp_json, otlp_proto, otlp_spans, request_items
from sloscope.receiver.limits import Limits
from sloscope.receiver.otlp_common import REFUSAL_REASONS, UNKEPT_REASONS, DecodeError, refusal_message
from sloscope.receiver.otlp_json import Decoder
from sloscope.receiver.request_items import TooManyItems

log = logging.getLogger("sloscope.receiver")
RETRY_AFTER_S = 1
PEER_BUSY = ("sloscope is serving as many requests from this address as it takes (--max-inflight-requests-per-peer);"
             " retry later")
PLAIN_BODY = ("", "identity")  # Content-Encoding values of a body sent as it is
OTLP_CONTENT_TYPES = ("application/x-protobuf", "application/json")
SIGNALS = ("traces", "metrics", "logs")
RESPONSES = {"traces": trace_service_pb2.ExportTraceServiceResponse,
             "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
             "logs": logs_service_pb2.ExportLogsServiceResponse}
REJECTED_FIELD = {"traces": "rejected_spans", "metrics": "rejected_data_points", "logs": "rejected_log_records"}
# Data not kept, reported back as partial success: well-formed but unkept, and refused as invalid.
UNKEPT = (*UNKEPT_REASONS, *REFUSAL_REASONS)
# Protobuf trace requests by the decoder that read them (ingest counters): a falling share of the fast path
# means an exporter writes what only the general decoder reads, at a fraction of the rate.
FAST_PATH, GENERAL_PATH = "trace_requests_fast_path", "trace_requests_general_path"
# The google.rpc.Status code of an OTLP/HTTP error answer: the Collector's for the statuses it maps (gRPC's
# HTTP-to-gRPC table, 400 as INVALID_ARGUMENT), and for the others the code gRPC gives the same refusal (a body
# too large is what a message past gRPC's limit gets: RESOURCE_EXHAUSTED). UNKNOWN for any other.
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                404: grpc.StatusCode.UNIMPLEMENTED, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
                411: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
                415: grpc.StatusCode.INVALID_ARGUMENT, 501: grpc.StatusCode.UNIMPLEMENTED,
                503: grpc.StatusCode.UNAVAILABLE}


Intake = Callable[[str, Batch, dict, "str | None"], Outcome]  # (signal, batch, decoding counts, client IP) -> outcome
# Decodes and takes in a whole request body elsewhere (worker processes): (signal, body, is_json) ->
# (outcome, decoding counts); raises DecodeError.
Offload = Callable[[str, bytes, bool, "str | None"], tuple[Outcome, dict]]


def fast_decode(signal: str, body: bytes, is_json: bool) -> tuple[Batch, dict] | None:
    """(batch, counts) by the trace fast path (otlp_spans), or None where it does not apply or declines."""
    if signal != "traces" or is_json:
        return None
    decoded = otlp_spans.spans_and_counts(body)
    if decoded is None:
        return None
    spans, counts = decoded
    return Batch(spans=spans), {**counts, FAST_PATH: 1}


class Decoders:
    """A JSON and a protobuf decoder, which keep caches between requests (so: one per thread or process).
    `declared`: metrics kept beside the catalog's (the SLO spec's declared evidence)."""

    def __init__(self, declared: frozenset = frozenset()):
        self.json, self.proto = Decoder(declared=declared), otlp_proto.ProtoDecoder(declared=declared)

    def decode(self, signal: str, body: bytes, is_json: bool) -> tuple[Batch, dict]:
        """(batch, counts) of one export request body by the general path; raises DecodeError."""
        decoder = self.json if is_json else self.proto
        decoder.skipped.clear()
        request = otlp_json.parse(body) if is_json else otlp_proto.parse(signal, body)
        batch, counts = decoder.decode(request), dict(decoder.skipped)
        if signal == "traces" and not is_json:
            counts[GENERAL_PATH] = 1
        return batch, counts


class Receiver:
    """Decodes requests and passes them to the intake; counts everything it refuses. With an offload, bodies
    of at least `offload_bytes` that the fast path declines are decoded by it instead (the fast path needs no
    other process: it runs without the interpreter lock)."""

    def __init__(self, intake: Intake, offload: Offload | None = None, offload_bytes: int = 0,
                 limits: Limits = Limits(), declared: frozenset = frozenset()):
        self.intake = intake
        self.declared = declared
        self.offload = offload
        self.offload_bytes = offload_bytes
        self.limits = limits
        self.inflight = ByteBudget(limits.max_inflight_bytes)  # request bodies held, over HTTP and gRPC
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()  # decoders keep caches; one per thread

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def snapshot(self) -> dict[str, int]:
        """The counts as of now, for /metrics (request threads go on counting meanwhile)."""
        with self._lock:
            return dict(self.counts)

    def _decoders(self) -> Decoders:
        if not hasattr(self._local, "decoders"):
            self._local.decoders = Decoders(self.declared)
        return self._local.decoders

    def accept_body(self, signal: str, body: bytes, is_json: bool, peer: str | None = None,
                    held: Reservation | None = None) -> Outcome:
        """Parse, decode and offer one export request body; DecodeError: the whole request is invalid. peer: the
        client's IP address (a pod's, for an SDK exporting straight here), which the intake may place spans by.
        Before anything decodes it, its items are counted (TooManyItems: past a limit) and what decoding them
        holds is reserved in `held`, the request's share of the in-flight budget (Exhausted: not now)."""
        decoding = request_items.decode_bytes(request_items.counted(signal, body, is_json, self.limits))
        if held is not None:
            # At most what the budget can hold beside the request's bytes, so that any request within the limits
            # is taken when it is alone.
            held.reserve(min(decoding, held.budget.limit - held.held))
        try:
            outcome, skips = self._decoded(signal, body, is_json, peer)
        finally:
            if decoding >= freed_memory.TRIM_ABOVE_BYTES:
                freed_memory.release()
        if outcome.accepted:  # partial rejects by reason, for /metrics
            for reason in UNKEPT:
                if skips.get(reason):
                    self.count(f"{signal}_rejected_{reason}", skips[reason])
        return self._offered(signal, outcome, skips)

    def _decoded(self, signal: str, body: bytes, is_json: bool, peer: str | None) -> tuple[Outcome, dict]:
        """(outcome, decoding counts) of the body decoded here or by the offload, and offered to the intake."""
        decoded = fast_decode(signal, body, is_json)
        if decoded is None and self.offload is not None and len(body) >= self.offload_bytes:
            return self.offload(signal, body, is_json, peer)
        batch, skips = decoded or self._decoders().decode(signal, body, is_json)
        return self.intake(signal, batch, skips, peer), skips

    def _offered(self, signal: str, outcome: Outcome, skips: dict) -> Outcome:
        if not outcome.accepted:
            self.count(f"{signal}_refused_full")
            return outcome
        unkept = {k: skips[k] for k in UNKEPT if skips.get(k)}
        if unkept:
            outcome.rejected, outcome.message = sum(unkept.values()), refusal_message(unkept)
        self.count(f"{signal}_requests_accepted")
        return outcome


# --- OTLP/HTTP --------------------------------------------------------------------------------------------


# GET handler: (**query parameters, if it takes any) -> (body, content type). A ValueError it raises is the
# client's mistake (400); Unavailable says "not now" (503), as /readyz does while serve is not ready.
Page = Callable[..., tuple[bytes, str]]


class Unavailable(Exception):
    """A page that cannot give its answer now (503)."""


class _HttpHandler(KeepAliveHandler):
    receiver: Receiver
    pages: dict[str, Page]
    limits: Limits
    auth: BearerAuth | None
    disable_nagle_algorithm = True  # the status line and the body go out in two writes: no delayed-ACK stall
    server_version = "sloscope-otlp"

    def setup(self):
        super().setup()
        self.rfile.close()  # reads go through the phase deadlines instead; buffered, for pipelined requests
        self.reader = DeadlineReader(self.connection, self._cut_off)
        self.rfile = BufferedReader(self.reader)
        self.body_unread = False

    def log_message(self, fmt, *args):  # noqa: D401 - quiet: per-request logs would swamp the log
        log.debug("%s " + fmt, self.address_string(), *args)

    def _count(self, name: str) -> None:
        if self.receiver is not None:  # a server of pages only counts nothing
            self.receiver.count(name)

    def _cut_off(self, why: str) -> None:
        if why != "idle_timeout":  # a keep-alive connection left idle is closed as a matter of course
            self._count(f"requests_{why}")

    # A new connection owes its first request's headers at once; a kept-alive one may first idle a while.
    def start_request(self) -> None:
        self.reader.expect("header", self.limits.read_header_timeout_s, self.limits.max_header_bytes)

    def start_idle(self) -> None:
        self.reader.expect("idle", self.limits.idle_timeout_s)

    def parse_request(self):
        if not super().parse_request():
            return False
        framing = self.headers.get_all("Content-Length", []) + self.headers.get_all("Transfer-Encoding", [])
        self.body_unread = bool(framing) and framing != ["0"]
        if self.peer_busy:
            self._count("requests_peer_busy")
            self.body_unread = True  # left unread: the connection closes, and the client holds one fewer
            self._refuse(503, PEER_BUSY, {"Retry-After": str(RETRY_AFTER_S)})
            return False
        return True

    def _authenticated(self, page: str | None = None) -> bool:
        """True where the request may go on (a GET of an open `page` needs no token); else it is answered 401
        with the challenge, and counted."""
        if self.auth is None or page in self.auth.open_paths:
            return True
        challenge = self.auth.check(self.headers.get("Authorization"))
        if challenge is None:
            return True
        self._count("unauthenticated_http")
        self._refuse(401, "missing or wrong bearer token", {"WWW-Authenticate": challenge})
        return False

    def do_GET(self):  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        if not self._authenticated(path):
            return
        page = self.pages.get(path)
        if page is None:
            return self._refuse(404, f"not found; GET serves {', '.join(sorted(self.pages)) or 'nothing'}")
        # A page that takes parameters gets the query's (and an unknown one is a 400); others ignore the query.
        known = inspect.signature(page).parameters
        params = dict(urllib.parse.parse_qsl(query)) if known else {}
        unknown = sorted(set(params) - set(known))
        if unknown:
            return self._refuse(400, f"{path}: unknown parameter {', '.join(unknown)}; it takes "
                                     f"{', '.join(known)}")
        try:
            body, content_type = page(**params)
        except ValueError as exc:
            return self._refuse(400, f"{path}: {exc}")
        except Unavailable as exc:
            return self._refuse(503, f"{path}: {exc}")
        except Exception as exc:  # a failing page must not take the receiver down
            log.exception("GET %s failed", self.path)
            return self._refuse(500, f"{type(exc).__name__}: {exc}")
        self._send(200, body, content_type)

    def do_POST(self):  # noqa: N802 - http.server's naming
        if not self._authenticated():  # before the body is read: an unknown client costs no memory
            return
        signal = {f"/v1/{s}": s for s in SIGNALS}.get(self.path.split("?", 1)[0])
        if self.receiver is None:
            return self._refuse(404, f"no OTLP intake here; GET serves {', '.join(sorted(self.pages))}")
        if signal is None:
            self.receiver.count("requests_unknown_path")
            return self._refuse(404, "unknown path: OTLP/HTTP serves /v1/traces, /v1/metrics and /v1/logs")
        content_type = self._content_type()
        if content_type not in OTLP_CONTENT_TYPES:
            self.receiver.count("requests_bad_content_type")
            return self._refuse(415, "Content-Type must be application/x-protobuf or application/json")
        is_json = content_type == "application/json"
        with Reservation(self.receiver.inflight) as held:  # the body is held until it is answered
            body = self._body(held)
            if body is None:
                return
            self._export(signal, body, is_json, content_type, held)

    def _export(self, signal: str, body: bytes, is_json: bool, content_type: str, held: Reservation):
        try:
            outcome = self.receiver.accept_body(signal, body, is_json, peer_ip(self.client_address[0]), held)
        except DecodeError as exc:
            self.receiver.count(f"{signal}_invalid")
            return self._refuse(400, str(exc))
        except TooManyItems as exc:
            self.receiver.count(TooManyItems.COUNTER)
            return self._refuse(413, str(exc))
        except Exhausted:
            return self._refuse_memory()
        if not outcome.accepted:
            return self._refuse(503, "sloscope is busy writing; retry later", {"Retry-After": str(RETRY_AFTER_S)})
        response = RESPONSES[signal]()
        if outcome.rejected:
            setattr(response.partial_success, REJECTED_FIELD[signal], outcome.rejected)
            response.partial_success.error_message = outcome.message
        self._send(200, _encode(response, is_json), content_type)

    def _body(self, held: Reservation) -> bytes | None:
        """The request body within the limits (decompressed), or None once the refusal is answered."""
        limit = self.limits.max_body_bytes
        self.reader.expect("body", self.limits.read_timeout_s)
        try:
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            if encoding not in (*PLAIN_BODY, *content_coding.CODINGS):
                raise BodyError(415, "requests_bad_encoding", f"unsupported Content-Encoding {encoding!r} "
                                f"({', '.join(content_coding.CODINGS)} or none)")
            body = read_body(self.rfile, declared_length(self.headers), limit, held)
            self.body_unread = False
            return body if encoding in PLAIN_BODY else content_coding.decode(encoding, body, limit, held)
        except BodyError as exc:
            self._count(exc.counter)
            self._refuse(exc.status, str(exc))
        except Exhausted:
            self._refuse_memory()
        except TimeoutError:  # counted by the reader; say why before the connection closes
            self._refuse(408, f"request body not received within {self.limits.read_timeout_s:g} s")
        return None

    def _refuse_memory(self):
        self._count("requests_refused_memory")
        self._refuse(503, "sloscope holds too many request bytes; retry later", {"Retry-After": str(RETRY_AFTER_S)})

    def _content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()

    def _refuse(self, code: int, message: str, headers: dict | None = None):
        """An error answer. OTLP/HTTP wants an export request's as a google.rpc.Status encoded like the request;
        a page's, or one to a POST in neither OTLP encoding, is text, there being no encoding to answer in."""
        content_type = self._content_type() if self.command == "POST" else ""
        if content_type not in OTLP_CONTENT_TYPES:
            return self._send(code, message.encode() + b"\n", "text/plain; charset=utf-8", headers)
        status = status_pb2.Status(code=STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN).value[0], message=message)
        self._send(code, _encode(status, content_type == "application/json"), content_type, headers)

    def _method_not_allowed(self):
        if self.receiver is not None:
            self.receiver.count("requests_bad_method")
        body = b"" if self.command == "HEAD" else b"method not allowed: GET for the pages, POST for OTLP\n"
        self._send(405, body, "text/plain; charset=utf-8", {"Allow": "GET, POST"})

    do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _method_not_allowed  # http.server would answer 501

    def _send(self, code: int, body: bytes, content_type: str, headers: dict | None = None):
        self.connection.settimeout(self.limits.write_timeout_s)
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.body_unread:  # what is left of it would be read as the next request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)


def _encode(message, is_json: bool) -> bytes:
    if not is_json:
        return message.SerializeToString()
    return orjson.dumps(MessageToDict(message))


def http_server(receiver: Receiver | None, host: str, port: int, pages: dict[str, Page] | None = None,
                tls: TlsFiles | None = None, auth: BearerAuth | None = None) -> LimitedHTTPServer:
    """OTLP/HTTP on POST, under the receiver's limits; `pages` adds GET endpoints (such as /metrics) on the same
    port. Without a receiver it serves the pages alone, under the default limits. With `tls`, HTTPS only (the
    handshake within the header deadline); with `auth`, every request but those for its open pages needs the
    bearer token."""
    limits = receiver.limits if receiver is not None else Limits()
    handler = type("Handler", (_HttpHandler,), {"receiver": receiver, "pages": dict(pages or {}), "limits": limits,
                                                "auth": auth})
    count = receiver.count if receiver is not None else (lambda name: None)
    caps = ConnectionCaps(limits.max_connections, limits.max_connections_per_peer,
                          limits.max_inflight_requests_per_peer)
    return LimitedHTTPServer((host, port), handler, caps, count, tls, limits.read_header_timeout_s)


# --- OTLP/gRPC --------------------------------------------------------------------------------------------


GRPC_BUSY = "sloscope is serving as many OTLP/gRPC calls as it takes (--grpc-max-concurrent-rpcs); retry later"
GRPC_PEER_BUSY = ("sloscope is serving as many OTLP/gRPC calls from this address as it takes "
                  "(--grpc-max-concurrent-rpcs-per-peer); retry later")
GRPC_SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService",
                 "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
                 "logs": "opentelemetry.proto.collector.logs.v1.LogsService"}


def _export_handler(signal: str, receiver: Receiver):
    """Export takes the raw request bytes, so that a payload protobuf cannot parse is this server's
    INVALID_ARGUMENT (and counted), exactly as over HTTP, rather than gRPC's own INTERNAL."""

    def export(body: bytes, context):
        try:
            with Reservation(receiver.inflight) as held:  # gRPC has read the message; count it while decoding
                held.reserve(len(body))
                outcome = receiver.accept_body(signal, body, False, peer_ip(context.peer()), held)
        except Exhausted:
            receiver.count("requests_refused_memory")
            context.abort(grpc.StatusCode.UNAVAILABLE, "sloscope holds too many request bytes; retry later")
        except TooManyItems as exc:
            receiver.count(TooManyItems.COUNTER)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
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


def grpc_server(receiver: Receiver, host: str, port: int, tls: TlsFiles | None = None,
                auth: BearerAuth | None = None) -> tuple[grpc.Server, int]:
    """OTLP/gRPC under the receiver's limits: a larger message is RESOURCE_EXHAUSTED before it is decoded. Calls
    in progress are bounded per connection by HTTP/2's stream limit (the client waits, as with the Collector's
    max_concurrent_streams), per client address and in all (past them, UNAVAILABLE: edge/grpc_admission.py), each
    with a thread of its own, and a call's message is due within the first-message deadline. Connections are
    capped in all and closed after the idle timeout without calls. A connection's handshake (TLS, HTTP/2 preface)
    has the header deadline; once as old as the body deadline, it is sent a GOAWAY (the client reconnects), and its
    calls have the body deadline again to finish before it is closed. With `tls`, TLS only; with `auth`, a call
    without the bearer token is UNAUTHENTICATED."""
    limits = receiver.limits
    # grpcio holds a pool thread while a call waits for its request message: the first-message deadline bounds
    # the wait, and a connection's age bounds the calls on it, as the body deadline bounds a request over HTTP.
    read_timeout_ms = int(limits.read_timeout_s * 1000)
    admission = Admission(limits.grpc_max_concurrent_rpcs, limits.grpc_max_concurrent_rpcs_per_peer,
                          limits.grpc_first_message_timeout_s, receiver.count, GRPC_BUSY, GRPC_PEER_BUSY)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=limits.grpc_max_concurrent_rpcs + REFUSING_THREADS),
                         interceptors=[BearerInterceptor(auth, receiver.count), admission] if auth else [admission],
                         options=[("grpc.max_receive_message_length", limits.grpc_max_message_bytes),
                                  ("grpc.max_concurrent_streams", limits.grpc_max_concurrent_streams),
                                  ("grpc.server_handshake_timeout_ms", int(limits.read_header_timeout_s * 1000)),
                                  ("grpc.max_connection_age_ms", read_timeout_ms),
                                  ("grpc.max_connection_age_grace_ms", read_timeout_ms),
                                  ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
                                  ("grpc.max_allowed_incoming_connections", limits.grpc_max_connections),
                                  # no SO_REUSEPORT: a second server on a taken port must fail, not share it
                                  ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler(service, {"Export": _export_handler(signal, receiver)})
        for signal, service in GRPC_SERVICES.items()])
    _check_bindable(host, port)
    address = address_text((host, port))  # gRPC reads an IPv6 host in brackets only
    try:
        bound = server.add_secure_port(address, tls.grpc_credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError:  # grpcio raises where it used to return 0
        bound = 0
    if bound == 0:
        raise OSError(errno.EADDRINUSE, "address in use or not available", address)
    return server, bound


def _check_bindable(host: str, port: int) -> None:
    """Bind the address once with a plain socket: its OSError says why (in use, not this host's, privileged),
    where gRPC's core would log its own multi-line complaint and say only that it failed."""
    if port == 0:
        return
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: TIME_WAIT is no conflict
            probe.bind(address)
