"""The bytes of request bodies a server holds at once, across its connection threads: a budget that refuses what
would pass it, and each request's reservation of it."""

from __future__ import annotations

import threading


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
