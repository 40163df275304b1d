"""The store's single writer for live intake: a queue bounded in rows and bytes, written by group commit.

A request thread offers its frames and gets a `Pending` back (or None: the queue is full, the intake log cannot
be appended to, or the writer is stopping, so the client must retry later). With an intake log
(analytics/intake_log.py) the frames are in the fsynced log when `offer` returns, so the request is durable
already; without one it waits on the `Pending` for its verdict. The writer commits as soon as something is
queued, taking everything queued meanwhile as one transaction, so concurrent requests share its fsync. DuckDB
writes and fsyncs its write-ahead log on COMMIT, so a committed verdict means durable. The bounds count a request
until it is committed (or refused): with a log, that is the log's uncommitted bytes.

Where nobody waits for the commit (an intake log acknowledged the request already, or --ack queued), the writer
may linger: it commits once `batch_rows` rows are queued or the oldest queued request has waited `linger_s`.
A commit costs DuckDB a fixed part (its own log, counters, a checkpoint of the row group it appends to) and a
part per row, which is least once a transaction fills whole row groups: those it writes compressed, straight to
the database file, instead of through its write-ahead log. So lingering halves the writer's cost per row at high
rates, and costs the store's readers at most `linger_s` of freshness.

A failed group write must cost no other request its data: the writer retries each request of the group alone.
A request that fails alone while the store still commits (shown by counting it as rejected) is poison and is
refused for good (with a log, where it was acknowledged already, it is set aside in the log's rejected/); when
the store itself fails (disk full, I/O error) the requests are told to retry (with a log, they stay queued and in
the log), and the writer backs off, reopens the connection where DuckDB invalidated it, and goes on trying.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import duckdb

from sloscope.analytics.intake_log import Entry, IntakeLog, LogAppendError
from sloscope.analytics.intake_record import decode, encode
from sloscope.analytics.frames import Frames
from sloscope.analytics.store import Store

log = logging.getLogger("sloscope.writer")
COMMITTED, RETRY, POISON = "committed", "retry", "poison"
BACKOFF_S = (0.05, 2.0)  # after a store failure: first pause, longest pause
ROW_GROUP_ROWS = 122_880  # DuckDB's row group: a transaction writes its full ones straight to the database file
REASON_CHARS = 300


@dataclass
class Verdict:
    outcome: str  # COMMITTED, RETRY (the store is failing: try again later) or POISON (never storable)
    reason: str = ""


@dataclass
class Pending:
    """One offered request, waiting for the commit (or failure) of the group that holds it."""

    frames: Frames
    counts: dict
    rows: int
    nbytes: int
    entry: Entry | None = None  # where it lies in the intake log, once it is there
    queued_at: float = 0.0  # time.monotonic() when the writer got it
    verdict: Verdict | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> Verdict | None:
        """The verdict, or None when it did not come within timeout."""
        return self.verdict if self._done.wait(timeout) else None

    def settle(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self._done.set()


def frame_bytes(frames: Frames) -> int:
    return sum(f.estimated_size() for f in (frames.spans, frames.points, frames.histograms))


def _store_fault(exc: BaseException) -> bool:
    """Whether an error is the store's own (disk, I/O, memory, a lost database) rather than the data's."""
    if isinstance(exc, (OSError, MemoryError, duckdb.IOException, duckdb.FatalException, duckdb.ConnectionException,
                        duckdb.OutOfMemoryException, duckdb.InternalException)):
        return True
    text = str(exc)
    return any(sign in text for sign in ("Failed to commit", "No space left", "invalidated", "I/O"))


def _needs_reopen(exc: BaseException) -> bool:
    """DuckDB refuses every later statement on a database it invalidated after a fatal error."""
    return isinstance(exc, (duckdb.FatalException, duckdb.ConnectionException)) or "invalidated" in str(exc)


class Writer:
    def __init__(self, store: Store, max_queued_rows: int = 1_000_000, max_queued_bytes: int = 256 * 2**20,
                 batch_rows: int = 2 * ROW_GROUP_ROWS, intake_log: IntakeLog | None = None, linger_s: float = 0.0):
        self.store = store
        self.intake_log = intake_log
        self.max_queued_rows = max_queued_rows
        self.max_queued_bytes = max_queued_bytes
        self.batch_rows = batch_rows
        self.linger_s = linger_s
        self.counts: Counter = Counter()  # what has been written, for logs
        self._queue: deque[Pending] = deque()
        self._tasks: deque = deque()  # callables for the writer thread, run between two writes
        self._held = self._queued_rows = self._queued_bytes = 0  # offered and not yet committed or refused
        self._waiting_rows = 0  # of the requests in _queue
        self._appending = 0  # offered and being appended to the intake log: a stop waits for them
        self._stats: Counter = Counter()
        self._fault: str | None = None  # why the last group write failed, until one succeeds
        self._backoff_s = BACKOFF_S[0]
        self._ready = threading.Condition()
        self._stopping = False
        self._replaying = False  # records the intake log kept from before are queued and not all written
        self._thread = threading.Thread(target=self._run, name="sloscope-writer", daemon=True)

    def start(self) -> "Writer":
        self._thread.start()
        return self

    @property
    def failed(self) -> str | None:
        """Why the store cannot write right now (None while it can)."""
        return self._fault

    def health(self) -> str | None:
        """None while the writer can write; else why not, in a few words (for /readyz and /metrics)."""
        if self._fault is not None:
            return f"store write failing: {self._fault[:REASON_CHARS]}"
        if self.intake_log is not None and self.intake_log.failure is not None:
            return f"intake log append failing: {self.intake_log.failure[:REASON_CHARS]}"
        if self._stopping:
            return "stopping"
        with self._ready:
            if self._replay_pending():
                return f"replaying the intake log: {self._held} requests left"
        if self._thread.ident is not None and not self._thread.is_alive():
            return "writer thread ended"
        return None

    def stats(self) -> dict[str, int]:
        """The queue's fill and the writes so far, for /metrics."""
        with self._ready:
            return {"queued_bytes": self._queued_bytes, "queued_requests": self._held,
                    "queued_rows": self._queued_rows, "write_failures": self._stats["write_failures"],
                    "commits": self._stats["commits"], "rejected_requests": self._stats["rejected_requests"]}

    def offer(self, frames: Frames, counts: dict) -> Pending | None:
        """Queue frames (and the counters that go with them) unless that would pass a bound; with an intake log,
        once they are fsynced in it."""
        record = encode(frames, counts) if self.intake_log is not None else None
        pending = Pending(frames, counts, len(frames), frame_bytes(frames) if record is None else len(record))
        with self._ready:
            full = self._held and (self._queued_rows + pending.rows > self.max_queued_rows
                                   or self._queued_bytes + pending.nbytes > self.max_queued_bytes)
            if self._stopping or full or self._replay_pending():
                return None
            self._hold(pending)
            if record is None:
                self._enqueue(pending)
                return pending
            self._appending += 1
        try:
            pending.entry = self.intake_log.append(record)
        except BaseException as exc:
            with self._ready:
                self._appending -= 1
                self._unhold(pending)
                self._ready.notify()
            if not isinstance(exc, LogAppendError):
                raise
            log.error("%s", exc)
            return None
        with self._ready:
            self._appending -= 1
            self._enqueue(pending)
        return pending

    def replay(self) -> int:
        """Queue every record the intake log kept from before (beyond the bounds: they are acknowledged). Until
        they are written, offers are refused (the client retries): what was acknowledged first is written first,
        while serve already answers its health checks."""
        recovered, self.intake_log.recovered = self.intake_log.recovered, []
        with self._ready:
            for entry, payload in recovered:
                frames, counts = decode(payload)
                pending = Pending(frames, counts, len(frames), entry.length, entry)
                self._hold(pending)
                self._enqueue(pending)
            self._replaying = bool(recovered)
        return len(recovered)

    def _replay_pending(self) -> bool:
        """Whether replayed records are still being written (with _ready held: while they are, nothing else is
        held)."""
        if self._replaying and self._held == 0:
            self._replaying = False
            log.info("replayed the intake log")
        return self._replaying

    def between_writes(self, task) -> None:
        """Run task() on the writer thread after the write under way and before the next, so that it has the
        store's connection to itself; tasks queued before stop() still run. A task handles its own failures."""
        with self._ready:
            self._tasks.append(task)
            self._ready.notify()

    def drained(self) -> bool:
        """Whether everything offered is committed (or refused)."""
        with self._ready:
            return self._held == 0

    def _hold(self, pending: Pending) -> None:
        self._held += 1
        self._queued_rows += pending.rows
        self._queued_bytes += pending.nbytes

    def _unhold(self, pending: Pending) -> None:
        self._held -= 1
        self._queued_rows -= pending.rows
        self._queued_bytes -= pending.nbytes

    def _enqueue(self, pending: Pending) -> None:
        pending.queued_at = time.monotonic()
        self._queue.append(pending)
        self._waiting_rows += pending.rows
        self._ready.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new frames, write everything queued, and return when it is committed (or refused)."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self.intake_log is not None:
            self.intake_log.close()

    # --- the writer thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while (group := self._take()) is not None:
            while self._tasks:
                task = self._tasks.popleft()
                try:
                    task()
                except Exception:  # the writer goes on writing whatever a task did
                    log.exception("writer: a task between writes failed")
            if not group:
                continue
            try:
                self._commit(group)
            except Exception as exc:  # a bug here must not leave request threads waiting for ever
                log.exception("writer: unexpected failure")
                self._retry_later(group, Verdict(RETRY, f"{type(exc).__name__}: {exc}"))
                time.sleep(BACKOFF_S[1])

    def _take(self) -> list[Pending] | None:
        """Everything queued (up to batch_rows rows, at least one request), once the linger is over; None once
        stopped and drained."""
        with self._ready:
            while not self._queue and not self._tasks:
                if self._stopping and not self._appending:
                    return None
                self._ready.wait()
            while self._lingering():
                self._ready.wait(self._queue[0].queued_at + self.linger_s - time.monotonic())
            group, rows = [], 0
            while self._queue and (not group or rows + self._queue[0].rows <= self.batch_rows):
                pending = self._queue.popleft()
                group.append(pending)
                rows += pending.rows
            self._waiting_rows -= rows
        return group

    def _lingering(self) -> bool:
        """Whether to wait for more before committing what is queued (the lock is held). Not while the store is
        failing: each write then tells whether it works again, which readiness waits for."""
        return (bool(self._queue) and not self._tasks and not self._stopping and self._fault is None
                and self._waiting_rows < self.batch_rows
                and time.monotonic() < self._queue[0].queued_at + self.linger_s)

    def _commit(self, group: list[Pending]) -> None:
        error = self._write(group)
        if error is None:
            return
        if len(group) > 1 and self._store_commits():
            for pending in group:  # the store works: find which requests the failure belongs to
                self._commit([pending])
        elif len(group) == 1 and not _store_fault(error) and self._count_rejected():
            self._refuse(group[0], str(error)[:REASON_CHARS])  # it may quote the request's values: keep it short
        else:
            self._store_failed(group, error)

    def _write(self, group: list[Pending]) -> BaseException | None:
        counts = Counter()
        for pending in group:
            counts.update(pending.counts)
        try:
            written = self.store.write(Frames.concat([p.frames for p in group]), counts)
        except Exception as exc:
            return exc
        self.counts.update(written)
        self._stats["commits"] += 1
        if self._fault is not None:
            log.info("store writes succeed again")
        self._fault, self._backoff_s = None, BACKOFF_S[0]
        self._done(group, Verdict(COMMITTED))
        return None

    def _refuse(self, pending: Pending, why: str) -> None:
        log.warning("refused a request the store cannot take (%d rows): %s", pending.rows, why)
        if pending.entry is not None:  # acknowledged already: kept aside rather than lost
            self.intake_log.reject(pending.entry, why)
        self._done([pending], Verdict(POISON, f"the store cannot take this request: {why}"))

    def _store_commits(self) -> bool:
        """Whether a small transaction still commits: the store works, so a failure is the data's."""
        try:
            self.store.probe()
        except Exception:
            return False
        return True

    def _count_rejected(self) -> bool:
        """Count a request as refused, in a transaction of its own; False when even that does not commit."""
        try:
            self.store.write(Frames.concat([]), {"store_rejected_requests": 1})
        except Exception:
            return False
        self._stats["rejected_requests"] += 1
        return True

    def _store_failed(self, group: list[Pending], error: BaseException) -> None:
        reason = f"{type(error).__name__}: {error}"
        if self._fault is None:
            log.error("store write failed (%d requests told to retry): %s", len(group), reason)
        self._fault = reason
        self._stats["write_failures"] += 1
        self._retry_later(group, Verdict(RETRY, reason))
        if self._stopping:  # no try after this one before the stop: the rest of the queue stays in the log too,
            with self._ready:  # at once, rather than a failed try and a back-off each, past the grace period
                rest = list(self._queue)
                self._queue.clear()
                self._waiting_rows = 0
            if rest:
                self._retry_later(rest, Verdict(RETRY, reason))
            return
        if _needs_reopen(error):
            self._reopen()
        time.sleep(self._backoff_s)  # queued requests wait (bounded by their own timeout) for the next try
        self._backoff_s = min(BACKOFF_S[1], self._backoff_s * 2)

    def _reopen(self) -> None:
        try:
            self.store.reopen()
            log.info("reopened %s", self.store.path)
        except Exception as exc:
            log.error("reopening %s failed: %s", self.store.path, exc)

    def _retry_later(self, group: list[Pending], verdict: Verdict) -> None:
        """Logged requests go back to the head of the queue (while stopping, they stay in the log for the next
        start); the others are told to retry."""
        logged = [p for p in group if p.entry is not None]
        with self._ready:
            if not self._stopping:
                self._queue.extendleft(reversed(logged))
                self._waiting_rows += sum(p.rows for p in logged)
                group = [p for p in group if p.entry is None]
        if self._stopping and logged:
            log.warning("%d logged requests stay in the intake log for the next start", len(logged))
        self._done(group, verdict, release_log=False)

    def _done(self, group: list[Pending], verdict: Verdict, release_log: bool = True) -> None:
        with self._ready:
            for pending in group:
                self._unhold(pending)
        if release_log and self.intake_log is not None:
            self.intake_log.release([p.entry for p in group if p.entry is not None])
        for pending in group:
            pending.settle(verdict)
