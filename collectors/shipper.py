"""The node collector's sender: exports batches in order, and keeps what it cannot deliver in the spool.

One thread owns the exporter (otlp_http.py or otlp_grpc.py) and the spool:

- healthy (spool empty): each batch is sent once. Delivered: done. A retryable answer (a busy receiver's 503 /
  UNAVAILABLE, 429, no answer at all) is backpressure, never a rejection: the batch goes to the spool and the
  sender turns degraded. So does a backlog: when more than MEMORY_QUEUE_MAX batches wait behind the one in
  flight (an endpoint that answers, but slower than batches come), they go to the spool.
- degraded (spool not empty): every new batch is appended to the spool (a FIFO that nothing overtakes), and
  the oldest spooled batch is resent after the backoff: exponential from 1 s to 30 s with jitter, and never
  sooner than the receiver's Retry-After / RetryInfo asked (at most RETRY_AFTER_MAX_S). Once one is delivered
  the spool is replayed in order, as fast as the endpoint takes it, then the sender is healthy again. A
  restarted collector finds the spool and replays it first.
- refused (a non-retryable answer: 400, 413, INVALID_ARGUMENT, ...): the specification says the same bytes
  must not be sent again. If the endpoint takes an empty request next and refuses the batch once more (that
  one resend only confirms), the batch itself is what it refuses: it goes to the spool's rejected/ folder,
  counted. If the empty request is refused too (a wrong path, missing credentials), the fault is the
  endpoint's, not the batch's: it waits in the spool like any other, and the log says so.

A batch whose spool file cannot be read for now (EIO, EMFILE) stays in the spool and is tried again after the
backoff; one whose file is corrupt is set aside by the spool. So the collection loop never waits for the
network, and a stall per attempt is bounded by the exporter's timeout.

Delivery is exactly once when the endpoint refuses connections or answers, and at least once when an export
times out after the receiver took it; the store recognises such a repeat (a cumulative point not newer than the
last stored point of its series is a duplicate).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from opentelemetry.sdk.metrics.export import MetricsData

from .otlp_answers import DELIVERED, REFUSED, RETRY, Answer
from .otlp_metrics import count_points, encode
from .spool import Spool

log = logging.getLogger(__name__)

RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 30.0
RETRY_AFTER_MAX_S = 300.0  # a server's Retry-After is untrusted: past this, the spool would only fill up
JITTER = 0.2
SHUTDOWN_GRACE_S = 5.0
# Batches that may wait in memory behind the one in flight. More means the endpoint answers slower than batches
# come: they go to the spool, so that memory does not grow with the backlog and a crash does not lose it.
MEMORY_QUEUE_MAX = 2
EMPTY_REQUEST = b""  # a serialized ExportMetricsServiceRequest with nothing in it


@dataclass
class _Batch:
    data: MetricsData
    points: int


# Export latency buckets: a healthy endpoint answers in milliseconds; the top ones meet the exporter's timeout.
LATENCY_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class LatencyHistogram:
    bounds_s: tuple[float, ...] = LATENCY_BOUNDS_S
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BOUNDS_S))  # per bucket, not cumulative
    total: int = 0
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(self.bounds_s):
            if seconds <= bound:
                self.counts[i] += 1
                break
        self.total += 1
        self.sum_s += seconds


@dataclass
class ShipperStats:
    exported_batches: int = 0
    exported_points: int = 0
    spooled_batches: int = 0  # batches written to the spool, ever
    replayed_batches: int = 0
    failed_exports: int = 0  # attempts not delivered: retryable answers and refusals
    refused_exports: int = 0  # non-retryable answers
    partially_rejected_points: int = 0  # points a receiver's partial success said it did not keep
    export_latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # every attempt, answered or not


class Shipper:
    """Exports batches in order; what is not delivered waits in the spool (see the module docstring)."""

    def __init__(self, exporter, spool: Spool, *, timeout_s: float = 10.0, retry_initial_s: float = RETRY_INITIAL_S,
                 retry_max_s: float = RETRY_MAX_S, clock: Callable[[], float] = time.monotonic):
        self.exporter = exporter
        self.spool = spool
        self.timeout_s = timeout_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.clock = clock
        self.stats = ShipperStats()
        self.endpoint_up: bool | None = None  # None until the first attempt
        self._queue: deque[_Batch] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._aborted = False
        self._backoff = retry_initial_s
        self._next_retry = 0.0
        self._failing_with: str | None = None  # the kind of the last failure logged
        self._thread = threading.Thread(target=self._run, name="sloscope-export", daemon=True)
        self._exporter_shut = False

    # -- main-thread side

    def start(self) -> None:
        self._thread.start()

    def submit(self, data: MetricsData) -> None:
        with self._cv:
            self._queue.append(_Batch(data, count_points(data)))
            self._cv.notify()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Export (or spool) what is queued, then stop. Past `grace_s` the exporter is shut down, which
        ends the attempt in flight, and the rest goes to the spool."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(grace_s)
            if self._thread.is_alive():
                log.warning("export still running after %.1f s: aborting it, the rest goes to the spool", grace_s)
                self._aborted = True
                self._shutdown_exporter()
                self._thread.join(self.timeout_s + 5.0)  # an attempt's deadline (the exporter's send), and slack
        if self._thread.is_alive():  # should not happen: every export attempt has a deadline
            log.error("export thread did not stop; %d batches still in memory were lost", len(self._queue))
        else:
            self._spool_queued()  # the thread never started, or something remained
        self._shutdown_exporter()

    def _shutdown_exporter(self) -> None:
        if not self._exporter_shut:
            self._exporter_shut = True
            try:
                self.exporter.shutdown()
            except Exception as exc:
                log.debug("exporter shutdown: %s", exc)

    # -- sender thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    if self.spool:
                        wait = self._next_retry - self.clock()
                        if wait <= 0:
                            break
                        self._cv.wait(wait)
                    else:
                        self._cv.wait()
                if self._closing and not self._queue:
                    return
            try:
                self._step()
            except Exception:  # never let the sender die: keep what is queued on disk and go on
                log.exception("export step failed")
                self._next_retry = self.clock() + self._backoff
                try:
                    self._spool_queued()
                except Exception:
                    log.exception("spooling failed")

    def _step(self) -> None:
        if self.spool or self._aborted or self._backlogged():
            self._spool_queued()
            if not self._closing and self.clock() >= self._next_retry:
                self._replay()
            return
        with self._cv:
            batch = self._queue.popleft() if self._queue else None
        if batch is None:
            return
        body = self._encode(batch)
        if body is None:
            return
        answer, its_own = self._attempt(body)
        if answer.outcome == DELIVERED:
            self._delivered(batch.points, answer)
            return
        seq = self._keep(body, batch.points)
        if its_own and seq is not None:
            self.spool.reject(seq, answer.detail)
            self._mark_up()
            return
        self._mark_down(answer)

    def _backlogged(self) -> bool:
        """More batches wait in memory than MEMORY_QUEUE_MAX (logged); the spool is empty here, so spooling
        them keeps their order."""
        waiting = len(self._queue)
        if waiting <= MEMORY_QUEUE_MAX:
            return False
        log.warning("the endpoint answers slower than batches come (%d waiting): spooling them to %s, to be "
                    "replayed in order as fast as it takes them", waiting, self.spool.directory)
        return True

    def _encode(self, batch: _Batch) -> bytes | None:
        try:
            return encode(batch.data).SerializeToString()
        except Exception as exc:
            self.spool.lose(batch.points, f"could not be encoded: {exc}")
            return None

    def _send(self, body: bytes) -> Answer:
        began = time.monotonic()
        try:
            answer = self.exporter.send(body)
        except Exception as exc:  # an exporter bug: no answer, like a dropped connection
            log.warning("export raised %s: %s", type(exc).__name__, exc)
            answer = Answer(RETRY, f"export raised {type(exc).__name__}")
        self.stats.export_latency.observe(time.monotonic() - began)
        if answer.outcome != DELIVERED:
            self.stats.failed_exports += 1
            self.stats.refused_exports += answer.outcome == REFUSED
        return answer

    def _delivered(self, points: int, answer: Answer) -> None:
        self.stats.exported_batches += 1
        self.stats.exported_points += points
        if answer.rejected_points:
            # A receiver that claims more than the batch held is believed for the batch, not past it.
            rejected = min(answer.rejected_points, points)
            self.stats.partially_rejected_points += rejected
            log.warning("the endpoint kept a batch but rejected %d of its %d data points (%s)",
                        answer.rejected_points, points, answer.detail)
        self._mark_up()

    def _keep(self, body: bytes, points: int) -> int | None:
        seq = self.spool.append(body, points)  # None: not stored; the spool counted and logged it
        if seq is not None:
            self.stats.spooled_batches += 1
        return seq

    def _spool_queued(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    return
                batch = self._queue.popleft()
            body = self._encode(batch)
            if body is not None:
                self._keep(body, batch.points)

    def _replay(self) -> None:
        replayed = 0
        while self.spool and not self._closing:
            self._spool_queued()  # what arrived meanwhile queues behind, in order, on disk
            try:
                head = self.spool.peek()
            except OSError:  # counted and logged by the spool; the batch stays for the next try
                self._mark_down(None)
                break
            if head is None:
                break
            seq, body, points = head
            answer, its_own = self._attempt(body)
            if answer.outcome == DELIVERED:
                if self.endpoint_up is not True:
                    log.info("endpoint is back: replaying %d spooled batches in order", len(self.spool))
                self.spool.remove(seq)
                replayed += 1
                self.stats.replayed_batches += 1
                self._delivered(points, answer)
                continue
            if its_own:
                self.spool.reject(seq, answer.detail)
                continue
            self._mark_down(answer)
            break
        if replayed and not self.spool:
            log.info("spool drained: %d batches replayed", replayed)

    def _attempt(self, body: bytes) -> tuple[Answer, bool]:
        """Send a batch: (the last answer, whether the batch itself is refused). A refusal is the batch's own
        only when the endpoint then takes an empty request and refuses the batch once more; the second send
        only confirms, so that an endpoint that changed its mind in between (credentials put right) costs no
        batch."""
        answer = self._send(body)
        if answer.outcome != REFUSED or self._send(EMPTY_REQUEST).outcome != DELIVERED:
            return answer, False
        again = self._send(body)
        return again, again.outcome == REFUSED

    def _mark_up(self) -> None:
        self.endpoint_up = True
        self._backoff = self.retry_initial_s

    def _mark_down(self, answer: Answer | None) -> None:
        wait = self._backoff * random.uniform(1 - JITTER, 1 + JITTER)
        if answer is not None and answer.retry_after_s is not None:
            wait = max(wait, min(answer.retry_after_s, RETRY_AFTER_MAX_S))
        kind = answer.outcome if answer is not None else "unreadable"
        if self.endpoint_up is not False or kind != self._failing_with:  # log changes, not every attempt
            why = answer.detail if answer is not None else "a spooled batch could not be read"
            if kind == REFUSED:
                log.error("the endpoint refuses every request, an empty one too (%s): check its address and "
                          "credentials; spooling to %s meanwhile", why, self.spool.directory)
            else:
                log.warning("export failed (%s): spooling to %s until the endpoint is back (retry in %.1f s, "
                            "backing off to %g s)", why, self.spool.directory, wait, self.retry_max_s)
        self.endpoint_up = False
        self._failing_with = kind
        self._next_retry = self.clock() + wait
        self._backoff = min(self._backoff * 2, self.retry_max_s)
