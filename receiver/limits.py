"""What the OTLP receiver lets one client, and all of them together, hold of its time and memory.

Defaults follow the OpenTelemetry Collector's OTLP receiver (confighttp, configgrpc) where it has one, and
Prometheus's `--web.max-connections` for the connection cap; the header deadline is the shorter one nginx
recommends, since a client that needs more than 10 s for its headers is one holding a connection open. The
limits per client address (peer) are fractions of the limits in all, so that one address cannot hold what the
others need, while a node's exporters behind one address stay well within them. The
servers of sloscope.edge enforce them: the in-flight bytes as an edge/budget.py ByteBudget. The counts of what one
request holds are the receiver's own (request_items.py).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
BODY_BYTES = 32 * MiB
# The least an ordinary item takes on the wire: a span's ids and times alone are 50 bytes, a data point's time
# and value 20 (and in practice each sits beside its attributes and its metric's name), an attribute's key and
# value 16 and more (a Prometheus label or an Envoy tag 20 to 40). An empty item takes 2 bytes of protobuf, so
# without a count, what one body makes decoding build is bounded only by its bytes over 2.
ORDINARY_ITEM_BYTES = 16
# A bucket count can be 1 byte, so its bound is what senders send instead, with room: 8192 points (the Collector's
# batch) of an exponential histogram's 160 positive and 160 negative buckets (the SDKs' and Prometheus's default
# largest) is 2.5 Mi; an explicit histogram's bounds count beside its bucket counts.
BUCKETS = 2**22


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = BODY_BYTES  # one request body, as sent and decompressed
    max_inflight_bytes: int = 256 * MiB  # request bodies being read or decoded, all clients together
    max_header_bytes: int = 1 * MiB  # a request line and headers (Go's net/http default)
    read_header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    read_timeout_s: float = 60.0  # for the whole body; over gRPC, a connection's age, then the grace of its calls
    write_timeout_s: float = 30.0  # for the whole response
    idle_timeout_s: float = 60.0  # a keep-alive connection waiting for its next request
    max_connections: int = 512  # past it, an idle one is closed for the new one, else new ones wait
    # One client address's share, a quarter: a node's exporters behind one SNAT address fit in it, and three
    # others still fit beside an address that fills it. Past it, the address's own idle connection makes room.
    max_connections_per_peer: int = 128
    max_inflight_requests_per_peer: int = 64  # one address's requests in progress; more are a 503 (retry)
    grpc_max_message_bytes: int = 32 * MiB
    grpc_max_concurrent_streams: int = 16  # calls on one connection; more wait at the client (HTTP/2)
    grpc_max_concurrent_rpcs: int = 64  # calls in all, each with a thread; more are UNAVAILABLE
    grpc_max_concurrent_rpcs_per_peer: int = 32  # one address's calls in progress; more are UNAVAILABLE
    grpc_max_connections: int = 512  # past it, gRPC's core closes new connections at once
    # From a call's arrival to its whole message: 32 MiB at 9 Mbit/s. A call still without it is cancelled.
    grpc_first_message_timeout_s: float = 30.0
    # What one request may hold, counted before it is decoded: the largest body of ordinary items holds no more.
    max_request_items: int = BODY_BYTES // ORDINARY_ITEM_BYTES  # resources, scopes, spans, points, ...
    max_request_attributes: int = BODY_BYTES // ORDINARY_ITEM_BYTES  # key-values at every level, values in arrays
    max_request_buckets: int = BUCKETS  # bucket counts, explicit bounds, summary quantiles

    def __post_init__(self):
        # A request the budget can never hold would be told to retry for ever.
        largest = max(self.max_body_bytes, self.grpc_max_message_bytes)
        if self.max_inflight_bytes < largest:
            raise ValueError(f"--max-inflight-bytes ({self.max_inflight_bytes}) is below the largest request "
                             f"(--max-request-body-size, --grpc-max-recv-msg-size: {largest})")
