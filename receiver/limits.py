"""What the OTLP receiver lets one client, and all of them together, hold of its time and memory.

Defaults follow the OpenTelemetry Collector's OTLP receiver (confighttp, configgrpc) where it has one, and
Prometheus's `--web.max-connections` for the connection cap; the header deadline is the shorter one nginx
recommends, since a client that needs more than 10 s for its headers is one holding a connection open.
"""

from __future__ import annotations

import re
import threading
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


class Exhausted(Exception):
    """The in-flight byte budget cannot take a request now; the client should retry later."""


class ByteBudget:
    """Bytes of request bodies held at once, across threads. A reservation that would pass the limit is refused
    rather than waited for, so that a burst turns into retryable answers instead of blocked threads."""

    def __init__(self, limit: int):
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def reserve(self, n: int) -> None:
        with self._lock:
            if self._held + n > self.limit:
                raise Exhausted(f"{self._held} bytes of requests in flight; no room for {n} more")
            self._held += n

    def release(self, n: int) -> None:
        with self._lock:
            self._held -= n


class Reservation:
    """What one request holds of a budget, given back all at once when the request is done."""

    def __init__(self, budget: ByteBudget):
        self.budget = budget
        self.held = 0

    def reserve(self, n: int) -> None:
        self.budget.reserve(n)
        self.held += n

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.budget.release(self.held)
        self.held = 0


_SIZE = re.compile(r"\s*([0-9]+)\s*(|k|ki|kib|m|mi|mib|g|gi|gib)b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def size_text(n: int) -> str:
    """Bytes as parse_size reads them, in the largest binary unit that holds them exactly: 33554432 -> 32MiB."""
    for unit in "GMK":
        if n and n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}iB"
    return str(n)


def parse_size(text: str) -> int:
    """Bytes from '1048576', '512KiB', '32MiB' or '1GiB' (binary units, as the Collector's *_mib settings)."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with KiB, MiB or GiB)")
    return int(match[1]) * _UNITS[match[2][:1].lower()]
