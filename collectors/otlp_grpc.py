"""The OTLP/gRPC exporter (otlp_answers.py says how its answers are classified)."""

from __future__ import annotations

from urllib.parse import urlparse

import grpc
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status

from .otlp_answers import (GRPC_METHOD, REFUSED, RETRY, RETRYABLE_GRPC, STATUS_DETAILS_KEY, USER_AGENT, Answer,
                           Transport, delivered, printable, read_pem)


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
            self._credentials = grpc.ssl_channel_credentials(root_certificates=read_pem(transport.certificate),
                                                             private_key=read_pem(transport.client_key),
                                                             certificate_chain=read_pem(transport.client_certificate))
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
        return delivered(response, "gRPC OK")

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
