"""A bounded on-disk FIFO of OTLP export requests: what could not be exported waits here, in order.

Format: one serialized `ExportMetricsServiceRequest` (OTLP protobuf, exactly the bytes an OTLP/HTTP request
body carries) per file, named by a sequence number, `00000000000000000042.pb`, in one directory. Files sort
in export order. A file is written as `.NAME.tmp`, fsynced, renamed into place and the directory fsynced, so
after a crash or power loss a batch is either entirely in the spool or not there at all (a leftover `.tmp`
file is removed when the spool is opened). Reopening the directory resumes where it stopped; sequence
numbers continue after the highest one present.

Bound: at most `max_bytes` bytes and `max_batches` files. Past either, the oldest batches are dropped (a
cumulative counter point dropped this way loses resolution, not counts: the next one carries the total);
every drop is counted (batches and data points) and logged. A file that does not parse is moved to
`corrupt/`, counted as a drop and logged. A batch the receiver keeps rejecting while it accepts other
requests can be moved to `rejected/` (`reject()`), likewise counted and logged; both directories keep at
most `QUARANTINE_KEEP` files, for people to look at.

A Spool is used by one thread at a time (the agent's sender); a lock guards it anyway.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

log = logging.getLogger(__name__)

SUFFIX = ".pb"
NAME = re.compile(r"^(\d{20})\.pb$")
QUARANTINE_KEEP = 64
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_BATCHES = 100_000


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _points(data: bytes) -> int | None:
    from .otlp_metrics import count_points

    try:
        return count_points(ExportMetricsServiceRequest.FromString(data))
    except Exception:
        return None


@dataclass
class SpoolStats:
    batches: int
    bytes: int
    dropped_batches: int
    dropped_points: int
    rejected_batches: int
    corrupt_batches: int


class Spool:
    def __init__(self, directory: str, max_bytes: int = DEFAULT_MAX_BYTES, max_batches: int = DEFAULT_MAX_BATCHES,
                 *, fsync: bool = True):
        if max_bytes <= 0 or max_batches <= 0:
            raise ValueError("spool bounds must be positive")
        self.directory = os.path.abspath(directory)
        self.max_bytes = int(max_bytes)
        self.max_batches = int(max_batches)
        self.fsync = fsync
        self.dropped_batches = 0
        self.dropped_points = 0
        self.rejected_batches = 0
        self.corrupt_batches = 0
        self._lock = threading.RLock()
        os.makedirs(self.directory, exist_ok=True)
        self._sizes: dict[int, int] = {}
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                os.unlink(entry.path)  # a write that never completed
                continue
            m = NAME.match(entry.name)
            if m and entry.is_file():
                self._sizes[int(m.group(1))] = entry.stat().st_size
        self._order = deque(sorted(self._sizes))
        self._bytes = sum(self._sizes.values())
        self._next = (self._order[-1] + 1) if self._order else 0
        if self._order:
            log.info("spool %s: resuming %d batches (%d bytes)", self.directory, len(self), self._bytes)
        self._enforce_bound()

    # -- queries

    def __len__(self) -> int:
        return len(self._order)

    def __bool__(self) -> bool:
        return len(self) > 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def sequence_numbers(self) -> list[int]:
        with self._lock:
            return list(self._order)

    def path(self, seq: int) -> str:
        return os.path.join(self.directory, f"{seq:020d}{SUFFIX}")

    def stats(self) -> SpoolStats:
        return SpoolStats(len(self), self._bytes, self.dropped_batches, self.dropped_points,
                          self.rejected_batches, self.corrupt_batches)

    # -- writing

    def append(self, data: bytes, points: int | None = None) -> int:
        """Store one serialized export request after all others; durable when this returns. Returns its
        sequence number. Drops the oldest batches if the bound is exceeded (the new one too if it alone is
        over max_bytes)."""
        with self._lock:
            seq = self._next
            self._next += 1
            if len(data) > self.max_bytes:
                self._count_drop(points if points is not None else _points(data), 1)
                log.warning("spool: dropped batch %d (%d bytes alone exceeds the bound of %d bytes)",
                            seq, len(data), self.max_bytes)
                return seq
            final = self.path(seq)
            tmp = os.path.join(self.directory, f".{seq:020d}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            if self.fsync:
                _fsync_dir(self.directory)
            self._order.append(seq)
            self._sizes[seq] = len(data)
            self._bytes += len(data)
            self._enforce_bound()
            return seq

    def _enforce_bound(self) -> None:
        dropped = []
        points = 0
        while len(self) and (self._bytes > self.max_bytes or len(self) > self.max_batches):
            seq = self._order[0]
            try:
                with open(self.path(seq), "rb") as f:
                    n = _points(f.read())
            except OSError:
                n = None
            points += n or 0
            self._unlink(seq)
            dropped.append(seq)
        if dropped:
            self._count_drop(points, len(dropped))
            log.warning("spool: full (bound %d bytes, %d batches): dropped the %d oldest batches (%d..%d, %d data "
                        "points); %d dropped in all", self.max_bytes, self.max_batches, len(dropped), dropped[0],
                        dropped[-1], points, self.dropped_batches)

    def _count_drop(self, points: int | None, batches: int) -> None:
        self.dropped_batches += batches
        self.dropped_points += points or 0

    def _unlink(self, seq: int) -> None:
        try:
            os.unlink(self.path(seq))
        except FileNotFoundError:
            pass
        self._forget(seq)

    def _forget(self, seq: int) -> None:
        self._bytes -= self._sizes.pop(seq, 0)
        if self._order and self._order[0] == seq:
            self._order.popleft()
        elif seq in self._order:
            self._order.remove(seq)

    # -- reading

    def peek(self) -> tuple[int, ExportMetricsServiceRequest, int] | None:
        """(sequence number, request, size) of the oldest batch, or None when empty. A file that does not
        parse is moved to corrupt/ and the next one is returned."""
        with self._lock:
            while len(self):
                seq = self._order[0]
                try:
                    with open(self.path(seq), "rb") as f:
                        data = f.read()
                    return seq, ExportMetricsServiceRequest.FromString(data), len(data)
                except FileNotFoundError:
                    log.warning("spool: batch %d vanished from %s", seq, self.directory)
                    self._unlink(seq)
                except Exception as exc:  # DecodeError, or an unreadable file
                    self.corrupt_batches += 1
                    self._count_drop(None, 1)
                    log.error("spool: batch %d does not parse (%s): moved to corrupt/", seq, exc)
                    self._quarantine(seq, "corrupt")
            return None

    def remove(self, seq: int) -> None:
        """Forget a batch that was delivered."""
        with self._lock:
            self._unlink(seq)

    def reject(self, seq: int, why: str) -> None:
        """Move a batch the receiver will not take to rejected/ (counted as a drop)."""
        with self._lock:
            points = None
            try:
                with open(self.path(seq), "rb") as f:
                    points = _points(f.read())
            except OSError:
                pass
            self.rejected_batches += 1
            self._count_drop(points, 1)
            log.error("spool: batch %d (%s data points) rejected: %s; moved to rejected/", seq, points, why)
            self._quarantine(seq, "rejected")

    def _quarantine(self, seq: int, sub: str) -> None:
        target = os.path.join(self.directory, sub)
        os.makedirs(target, exist_ok=True)
        try:
            os.replace(self.path(seq), os.path.join(target, os.path.basename(self.path(seq))))
        except FileNotFoundError:
            pass
        self._forget(seq)
        kept = sorted(os.listdir(target))
        for name in kept[:-QUARANTINE_KEEP] if len(kept) > QUARANTINE_KEEP else []:
            try:
                os.unlink(os.path.join(target, name))
            except OSError:
                pass
