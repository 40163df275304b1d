"""OTLP metrics export of serialized `ExportMetricsServiceRequest`s over HTTP/protobuf or gRPC: one attempt per
call, and the answer classified as the OTLP specification says (opentelemetry-proto, docs/specification.md,
"Failures", "Retryable Response Codes", "Throttling"):

- delivered: HTTP 2xx, gRPC OK. A partial success is delivered too (it must not be retried); the points the
  receiver says it rejected, and its message, come with the answer.
- retry: HTTP 429, 502, 503, 504; gRPC CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE,
  DATA_LOSS, and RESOURCE_EXHAUSTED when its status carries a RetryInfo; no answer at all (refused, reset,
  timed out). `retry_after_s` is the server's wish: `Retry-After` (seconds or an HTTP date) or RetryInfo's
  `retry_delay`.
- refused: every other answer (400, 401, 413, 500, INVALID_ARGUMENT, RESOURCE_EXHAUSTED without RetryInfo,
  ...): these bytes must not be sent again.

The SDK's exporters retry inside export() and then say only SUCCESS or FAILURE; the sender must tell
backpressure (keep, wait, resend) from a refusal, and retries itself, from its spool, so it sends the bytes
through these instead. TLS and gzip as the exporter specification's options say (config.py): a custom trust
bundle, a client certificate for mutual TLS, and compression of every request. Whatever the server writes in its answer is untrusted: messages are cut short and
stripped of control characters before they reach a log.
"""

from __future__ import annotations

import gzip
import math
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlparse

import grpc
import requests
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from .config import CollectorConfig
from .http_deadline import DeadlineAdapter, attempt_deadline

# Level 6 is what Go's and Python's gzip writers default to; the batches are small and compress well at it.
GZIP_LEVEL = 6

DELIVERED, RETRY, REFUSED = "delivered", "retry", "refused"
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset({"CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS"})
GRPC_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
USER_AGENT = "sloscope-collector"
DETAIL_MAX = 200
ANSWER_MAX = 64 * 2**10  # an OTLP answer is a partial success or a google.rpc.Status: a few hundred bytes
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


@dataclass(frozen=True)
class Answer:
    outcome: str  # DELIVERED, RETRY or REFUSED
    detail: str = ""  # what came back, for the log: "HTTP 503: busy"
    retry_after_s: float | None = None
    rejected_points: int = 0  # of a partial success


def printable(text: str) -> str:
    return _UNPRINTABLE.sub(" ", text)[:DETAIL_MAX]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After value (delay-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # an HTTP date is always GMT; anything else is not one
    seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _delivered(body: bytes | None, what: str) -> Answer:
    """A 2xx/OK answer, with its partial success if it carries one."""
    try:
        response = ExportMetricsServiceResponse.FromString(body or b"")
    except Exception:  # a body that is not the response message: still delivered
        return Answer(DELIVERED, what)
    partial = response.partial_success
    rejected = max(0, partial.rejected_data_points)
    message = printable(partial.error_message)
    return Answer(DELIVERED, f"{what}: {message}" if message else what, rejected_points=rejected)


@dataclass(frozen=True)
class Transport:
    """How the bytes travel: compression and the TLS files (paths to PEM; None: the defaults)."""
    compression: str = "none"
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class HttpExporter:
    """OTLP/HTTP protobuf, with one keep-alive session (the specification asks clients to keep the connection).
    An attempt takes at most `timeout_s` in all, however slowly the answer comes (http_deadline.py)."""

    def __init__(self, endpoint: str, headers: dict[str, str], timeout_s: float, transport: Transport = Transport()):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._gzip = transport.compression == "gzip"
        self._session = requests.Session()
        for prefix in ("https://", "http://"):
            self._session.mount(prefix, DeadlineAdapter())
        self._session.headers.update({**headers, "Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT})
        if self._gzip:
            self._session.headers["Content-Encoding"] = "gzip"
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a session's verify.
        self._tls = {"verify": transport.certificate or True}
        if transport.client_certificate:
            self._tls["cert"] = (transport.client_certificate, transport.client_key)

    def send(self, body: bytes) -> Answer:
        if self._gzip:
            body = gzip.compress(body, GZIP_LEVEL, mtime=0)
        with attempt_deadline(self.timeout_s) as deadline:
            try:
                with self._session.post(self.endpoint, data=body, timeout=self.timeout_s, allow_redirects=False,
                                        stream=True, **self._tls) as response:
                    if deadline.passed:  # perhaps cut short in its headers: http.client takes the cut for their end
                        return self._no_answer_in_time()
                    content = self._answer_body(response, deadline)
            except requests.RequestException as exc:  # no answer: refused, reset, timed out, closed
                if deadline.passed:
                    return self._no_answer_in_time()
                return Answer(RETRY, printable(f"no answer: {type(exc).__name__}: {exc}"))
        code = response.status_code
        if content is None:  # the status says what happened; the body is left unread
            what = f"HTTP {code}, its body longer than {ANSWER_MAX} bytes or not in by {self.timeout_s:g} s, not read"
            return (Answer(DELIVERED, what) if 200 <= code < 300 else
                    Answer(RETRY if code in RETRYABLE_HTTP else REFUSED, what))
        if 200 <= code < 300:
            return _delivered(content, f"HTTP {code}")
        detail = printable(f"HTTP {code}: {self._message(response, content)}")
        if code in RETRYABLE_HTTP:
            return Answer(RETRY, detail, parse_retry_after(response.headers.get("Retry-After")))
        return Answer(REFUSED, detail)

    def _answer_body(self, response, deadline) -> bytes | None:
        """The answer's body, read as it comes; None past ANSWER_MAX bytes or when the attempt's deadline cut it
        short (the status came in time, and decides)."""
        content = b""
        try:
            for chunk in response.iter_content(4096):
                content += chunk
                if len(content) > ANSWER_MAX:
                    return None
        except requests.RequestException:
            if not deadline.passed:
                raise
        return None if deadline.passed else content  # a body without a length would seem to end where it was cut

    def _no_answer_in_time(self) -> Answer:
        return Answer(RETRY, f"no answer: Timeout: none within the attempt's {self.timeout_s:g} s")

    @staticmethod
    def _message(response, content: bytes) -> str:
        """The google.rpc.Status message the specification puts in a failure's body, else the body as text."""
        if (response.headers.get("Content-Type") or "").startswith("application/x-protobuf"):
            try:
                return Status.FromString(content).message
            except Exception:
                pass
        return content[:DETAIL_MAX].decode("utf-8", "replace")

    def shutdown(self) -> None:
        self._session.close()


class GrpcExporter:
    """OTLP/gRPC: MetricsService/Export with the request's bytes as they are.

    A channel that failed to connect waits out gRPC's own reconnect backoff (growing to 2 minutes) and fails
    every call until then, so a receiver back after a few minutes' outage would stay unreached long after
    the sender's retry (its backoff tops out at 30 s). The sender keeps the schedule: the attempt after an
    UNAVAILABLE is made on a new channel, which connects at once."""

    def __init__(self, endpoint: str, headers: dict[str, str], timeout_s: float, transport: Transport = Transport()):
        url = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._target = url.netloc
        self._options = [("grpc.primary_user_agent", USER_AGENT)]
        self._compression = (grpc.Compression.Gzip if transport.compression == "gzip"
                             else grpc.Compression.NoCompression)
        self._credentials = None
        if url.scheme == "https":
            self._credentials = grpc.ssl_channel_credentials(root_certificates=_read(transport.certificate),
                                                             private_key=_read(transport.client_key),
                                                             certificate_chain=_read(transport.client_certificate))
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())
        self._shut = False
        self._open_channel()

    def _open_channel(self) -> None:
        if self._credentials is not None:
            channel = grpc.secure_channel(self._target, self._credentials, options=self._options,
                                          compression=self._compression)
        else:
            channel = grpc.insecure_channel(self._target, options=self._options, compression=self._compression)
        self._channel, self._reconnect = channel, False
        self._export = channel.unary_unary(GRPC_METHOD, request_serializer=None,
                                           response_deserializer=None)  # bytes both ways

    def send(self, body: bytes) -> Answer:
        if self._reconnect and not self._shut:
            self._channel.close()
            self._open_channel()
        try:
            response = self._export(body, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            self._reconnect = exc.code() is grpc.StatusCode.UNAVAILABLE
            return self._failure(exc)
        except ValueError as exc:  # the channel was closed by shutdown()
            return Answer(RETRY, printable(f"no answer: {exc}"))
        return _delivered(response, "gRPC OK")

    def _failure(self, exc) -> Answer:
        code = exc.code().name if exc.code() is not None else "UNKNOWN"
        detail = printable(f"gRPC {code}: {exc.details() or ''}")
        retry_after = retry_delay(exc.trailing_metadata() or ())
        if code in RETRYABLE_GRPC or (code == "RESOURCE_EXHAUSTED" and retry_after is not None):
            return Answer(RETRY, detail, retry_after)
        return Answer(REFUSED, detail)

    def shutdown(self) -> None:
        self._shut = True
        self._channel.close()


def retry_delay(trailing_metadata) -> float | None:
    """RetryInfo.retry_delay in seconds from a gRPC status's details (the grpc-status-details-bin trailer, a
    google.rpc.Status), or None."""
    for key, value in trailing_metadata:
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            for detail in Status.FromString(value).details:
                if detail.Is(RetryInfo.DESCRIPTOR):
                    info = RetryInfo()
                    detail.Unpack(info)
                    return max(0.0, info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
        except Exception:  # an unreadable status: as if it had no RetryInfo
            return None
    return None


def make_exporter(cfg: CollectorConfig) -> HttpExporter | GrpcExporter:
    cls = GrpcExporter if cfg.protocol == "grpc" else HttpExporter
    transport = Transport(cfg.compression, cfg.certificate, cfg.client_key, cfg.client_certificate)
    return cls(cfg.endpoint, dict(cfg.headers), cfg.timeout_s, transport)
