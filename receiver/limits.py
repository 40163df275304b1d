"""What the OTLP receiver lets one client, and all of them together, hold of its time and memory.

Defaults follow the OpenTelemetry Collector's OTLP receiver (confighttp, configgrpc) where it has one, and
Prometheus's `--web.max-connections` for the connection cap; the header deadline is the shorter one nginx
recommends, since a client that needs more than 10 s for its headers is one holding a connection open. The
servers of sloscope.edge enforce them: the in-flight bytes as an edge/budget.py ByteBudget.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * MiB  # one request body, as sent and decompressed
    max_inflight_bytes: int = 256 * MiB  # request bodies being read or decoded, all clients together
    max_header_bytes: int = 1 * MiB  # a request line and headers (Go's net/http default)
    read_header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    read_timeout_s: float = 60.0  # for the whole body; over gRPC, a connection's age, then the grace of its calls
    write_timeout_s: float = 30.0  # for the whole response
    idle_timeout_s: float = 60.0  # a keep-alive connection waiting for its next request
    max_connections: int = 512  # past it, new connections wait in the listen backlog
    grpc_max_message_bytes: int = 32 * MiB
    grpc_max_concurrent_streams: int = 16  # calls on one connection; more wait at the client (HTTP/2)
    grpc_max_concurrent_rpcs: int = 64  # calls in all, each with a thread; more are UNAVAILABLE

    def __post_init__(self):
        # A request the budget can never hold would be told to retry for ever.
        largest = max(self.max_body_bytes, self.grpc_max_message_bytes)
        if self.max_inflight_bytes < largest:
            raise ValueError(f"--max-inflight-bytes ({self.max_inflight_bytes}) is below the largest request "
                             f"(--max-request-body-size, --grpc-max-recv-msg-size: {largest})")
