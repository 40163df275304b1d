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

This module holds what both transports share: the answers and how they are classified. The exporters are
otlp_http.py and otlp_grpc.py; make_exporter loads only the one the config names, since a node agent that
exports over one never needs the other's library (requests or grpcio: each about 10 MiB of its memory).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

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


def delivered(body: bytes | None, what: str) -> Answer:
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


def read_pem(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def make_exporter(cfg):
    """The exporter of `cfg.protocol` (a CollectorConfig), its module loaded here and only here: see above."""
    if cfg.protocol == "grpc":
        from .otlp_grpc import GrpcExporter as exporter
    else:
        from .otlp_http import HttpExporter as exporter
    transport = Transport(cfg.compression, cfg.certificate, cfg.client_key, cfg.client_certificate)
    return exporter(cfg.endpoint, dict(cfg.headers), cfg.timeout_s, transport)
