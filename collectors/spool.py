"""A bounded on-disk FIFO of OTLP export requests: what could not be exported waits here, in order.

Files: one batch per file, named by a sequence number, `00000000000000000042.pb`, in one directory; files sort
in export order. Each file is a checksummed record (spool_format.py: magic, version, length and SHA-256 of the
serialized `ExportMetricsServiceRequest`, then the request); files without the header, from earlier versions,
still replay. Reopening the directory resumes where it stopped; sequence numbers continue after the highest
one present.

Durability: a file is written as `.NAME.tmp` in the spool directory, fsynced, renamed into place and the
directory fsynced, so after a crash or power loss a batch is either entirely in the spool or not there at all.
A failed write removes its temporary file; one left by a crash is removed (and logged) when the spool opens.

Bounds: at most `max_bytes` bytes of disk, the files set aside in rejected/ and corrupt/ included (not the
directories' own blocks), and `max_batches` batches waiting. A file counts for the disk it takes (`occupied`): its
allocated blocks, as du, a disk quota and a sized volume (a Kubernetes emptyDir's sizeLimit) count them, so a
batch of 1 KB in a 4 KiB block counts 4 KiB. The bounds hold while a batch is written, not only after: room for
the whole blocks of the new file is made first, by removing set-aside files (they will never be sent), oldest
first, then by dropping the oldest batches; a batch whose blocks alone exceed the bound is not written. A full
disk (ENOSPC, EDQUOT) is a bound too: room is made the same way and the write is tried once more; when that fails
as well, the new batch is dropped. (A cumulative counter point dropped this way loses resolution, not counts: the
next one carries the total.) Every drop is counted (batches and data points) and logged; a set-aside file's
batch was counted when it was set aside, and its removal is logged.

Reading: a file that cannot be trusted (header, length or checksum wrong, or a request that does not parse)
is moved to `corrupt/` and counted. A file that could not be read (EIO, EMFILE, ...) stays where it is: the
read error is counted and peek() raises it, for the caller to try again later; after UNREADABLE_TRIES failed
reads in a row for a reason of the file's own (EIO, not the process's EMFILE), it goes to `corrupt/` too. A
batch the receiver refuses for good is moved to `rejected/` (`reject()`), counted. Both folders keep at most
`QUARANTINE_KEEP` files, the newest, for people to look at.

One at a time: a Spool holds an exclusive flock on `LOCK_FILE` in its directory from the moment it opens until
close() (or until the process ends, however it ends: the kernel lets go, so no stale lock is ever left behind).
Another Spool on the same directory, in this process or another, is refused at once (SpoolInUse): two collectors
on one directory would replay each other's batches and overwrite each other's files. The lock file is never
removed: one removed while another collector has it open would let a third lock a new file beside it.

A Spool is used by one thread at a time (the agent's sender); a lock guards it anyway.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO, Callable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.files import fsync_directory

from .otlp_metrics import count_points
from .spool_aside import SetAside
from .spool_format import CorruptRecord, decode_record, encode_record

log = logging.getLogger(__name__)

SUFFIX = ".pb"
NAME = re.compile(r"^(\d{20})\.pb$")
QUARANTINE_KEEP = 64
SET_ASIDE = ("rejected", "corrupt")
# Neither a batch's name nor a temporary file's: the scan at start leaves it where it is.
LOCK_FILE = ".lock"
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MAX_BATCHES = 100_000
SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)
# Read errors of the process, not of the file: any file would fail alike, so the batch is never set aside for them.
PROCESS_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR)
# A batch whose file failed this many reads in a row for a reason of its own (EIO from a bad block) is set aside:
# it would hold every batch behind it until the bounds drop it, days later.
UNREADABLE_TRIES = 5


class SpoolInUse(Exception):
    """Another Spool (another collector) holds the directory."""


def occupied(st: os.stat_result) -> int:
    """The bytes of disk a file takes: its allocated blocks, never counted as less than its size (a file system
    that allocates late, compresses or keeps small files inline may report fewer blocks, or none, for a while;
    the bound then counts at least the bytes written)."""
    return max(st.st_blocks * 512, st.st_size)


def _lock_directory(directory: str) -> BinaryIO:
    """The open lock file, holding an exclusive flock; SpoolInUse at once when another holds it. (A file object,
    not a bare descriptor: a Spool dropped without close() lets go when it is collected.)"""
    # Read-only: flock needs no more. 0o600: another user, who could not write the spool, cannot lock it either.
    handle = open(os.path.join(directory, LOCK_FILE), "rb",
                  opener=lambda path, flags: os.open(path, flags | os.O_CREAT, 0o600))
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SpoolInUse(f"spool directory {directory} is in use: another collector holds its lock "
                         f"({os.path.join(directory, LOCK_FILE)}); give each collector its own spool directory"
                         ) from None
    except BaseException:
        handle.close()
        raise
    return handle


def _block_size(directory: str) -> int:
    try:
        return os.statvfs(directory).f_bsize
    except OSError:
        return 4096  # only how much room is made depends on it


def _parse(payload: bytes) -> int:
    """Data points of a serialized request; raises when it does not parse."""
    return count_points(ExportMetricsServiceRequest.FromString(payload))


@dataclass
class SpoolStats:
    batches: int
    bytes: int
    dropped_batches: int  # every batch lost, for whatever reason below or the bounds
    dropped_points: int
    rejected_batches: int
    corrupt_batches: int
    disk_full_batches: int  # dropped to make room on a full disk, or not written for want of it
    read_errors: int  # transient: the batch stayed


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
        self.disk_full_batches = 0
        self.read_errors = 0
        self._failed_reads = (-1, 0)  # (batch, reads in a row it failed for a reason of its own)
        self._lock = threading.RLock()
        os.makedirs(self.directory, exist_ok=True)
        self._block = _block_size(self.directory)
        self._directory_lock = _lock_directory(self.directory)  # before the scan, which removes and drops files
        try:
            self._resume()
        except BaseException:
            self.close()
            raise

    def _resume(self) -> None:
        """Take up the batches a previous run left, within the bounds."""
        self._sizes: dict[int, int] = self._scan()
        self._order = deque(sorted(self._sizes))
        self._bytes = sum(self._sizes.values())
        self._aside = SetAside(self._scan_set_aside())
        # Numbers go on from the highest ever given, set-aside batches' too: a new batch must not take the name of
        # one in rejected/ or corrupt/, which would replace it there and unsettle what "the last files" are.
        self._next = max([*self._order, *self._aside.numbers()], default=-1) + 1
        if self._order:
            log.info("spool %s: resuming %d batches (%d bytes on disk)", self.directory, len(self), self._bytes)
        self._enforce_bound()

    def _scan_set_aside(self) -> dict[str, tuple[int, int]]:
        """The batches in rejected/ and corrupt/: path -> (number, bytes of disk)."""
        found = {}
        for sub in SET_ASIDE:
            try:
                entries = list(os.scandir(os.path.join(self.directory, sub)))
            except OSError:  # not there (yet): nothing set aside
                continue
            for entry in entries:
                m = NAME.match(entry.name)
                if m and entry.is_file():
                    found[entry.path] = (int(m.group(1)), occupied(entry.stat()))
        return found

    def _scan(self) -> dict[int, int]:
        sizes, unfinished = {}, []
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                os.unlink(entry.path)
                unfinished.append(entry.name)
                continue
            m = NAME.match(entry.name)
            if m and entry.is_file():
                sizes[int(m.group(1))] = occupied(entry.stat())
        if unfinished:
            log.warning("spool %s: removed %d unfinished writes (%s)", self.directory, len(unfinished),
                        ", ".join(sorted(unfinished)[:5]))
        return sizes

    def close(self) -> None:
        """Let go of the directory, for the next collector to open it. The spool is not to be used after."""
        with self._lock:
            self._directory_lock.close()  # closing the only descriptor releases the flock

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
        return SpoolStats(len(self), self._bytes, self.dropped_batches, self.dropped_points, self.rejected_batches,
                          self.corrupt_batches, self.disk_full_batches, self.read_errors)

    # -- writing

    def append(self, data: bytes, points: int | None = None) -> int | None:
        """Store one serialized export request after all others; durable when this returns its sequence
        number. None: it could not be stored (too large for the bound, no room, an unwritable directory), and
        was counted and logged as dropped. Makes room within the bounds before it writes (see the module
        docstring)."""
        with self._lock:
            seq = self._next
            self._next += 1
            record = encode_record(data)
            needed = self._disk_for(len(record))
            if needed > self.max_bytes:  # neither worth writing nor worth dropping anything for
                self.lose(points, f"batch {seq}: the {needed} bytes of disk it takes alone exceed the bound of "
                          f"{self.max_bytes}", data)
                return None
            self._enforce_bound(room=needed, batches=1)
            try:
                taken = self._store(seq, record)
            except OSError as error:
                if error.errno in SPACE_ERRORS:
                    self.disk_full_batches += 1
                self.lose(points, f"batch {seq} could not be written to {self.directory}: {error}", data)
                return None
            if taken > self.max_bytes:  # more blocks than its bytes fill (the file system's own): keep the others
                self._unlink(seq)
                self.lose(points, f"batch {seq}: the {taken} bytes of disk it takes alone exceed the bound of "
                          f"{self.max_bytes}", data)
                return None
            self._order.append(seq)
            self._sizes[seq] = taken
            self._bytes += taken
            self._enforce_bound()  # it may take more blocks than its bytes fill
            return seq

    def lose(self, points: int | None, why: str, data: bytes | None = None) -> None:
        """Count and log a batch that never made it into the spool."""
        if points is None and data is not None:
            points = self._points_or_none(data)
        self._count_drop(points, 1)
        log.error("spool: dropped a batch of %s data points: %s; %d dropped in all", points, why,
                  self.dropped_batches)

    def _store(self, seq: int, record: bytes) -> int:
        """Write the record; on a full disk make room and try once more. The bytes of disk the file takes;
        OSError when it is not stored."""
        try:
            return self._write(seq, record)
        except OSError as exc:
            if exc.errno not in SPACE_ERRORS or not self._make_room(len(record)):
                raise
        return self._write(seq, record)

    def _write(self, seq: int, record: bytes) -> int:
        """Write the record durably (see the module docstring); the bytes of disk the file takes."""
        final = self.path(seq)
        tmp = os.path.join(self.directory, f".{seq:020d}.tmp")
        made = None  # the file this write put on disk so far: not stored means not there, whatever step failed
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            made = tmp
            try:
                view = memoryview(record)
                while view:
                    view = view[os.write(fd, view):]
                if self.fsync:
                    os.fsync(fd)
                taken = occupied(os.fstat(fd))  # blocks reserved for a delayed allocation count already
            finally:
                os.close(fd)
            os.replace(tmp, final)
            made = final
            if self.fsync:
                fsync_directory(self.directory)
        except BaseException:
            if made is not None:
                try:
                    os.unlink(made)
                except OSError as exc:
                    log.error("spool: could not remove %s after a failed write: %s", made, exc)
            raise
        return taken

    def _disk_for(self, size: int) -> int:
        """The bytes of disk a file of `size` bytes takes: whole blocks."""
        return -(-size // self._block) * self._block

    def _make_room(self, size: int) -> bool:
        """Remove set-aside files, then drop the oldest batches, until their blocks would hold `size` bytes; False
        when there is nothing to remove (the disk is full of something else)."""
        needed = self._disk_for(size) + self._block  # and one block more for the directory and the inode
        freed = self._aside.remove_oldest(lambda removed: removed >= needed, "disk full")
        dropped = self._drop_oldest(lambda more: freed + more >= needed, "disk full")
        self.disk_full_batches += dropped
        if (freed or dropped) and self.fsync:
            try:
                fsync_directory(self.directory)  # also commits the file system's journal, which frees the blocks
            except OSError as exc:
                log.warning("spool: fsync of %s after dropping batches: %s", self.directory, exc)
        return freed > 0 or dropped > 0

    def _enforce_bound(self, room: int = 0, batches: int = 0) -> None:
        """Keep within the bounds with `room` bytes of disk and `batches` batches to spare, for a file about to be
        written: set-aside files go first, since they will never be sent, then the oldest batches."""
        def fits(_freed: int) -> bool:
            return self._bytes + self._aside.bytes + room <= self.max_bytes

        why = f"full (bound {self.max_bytes} bytes, {self.max_batches} batches)"
        self._aside.remove_oldest(fits, why)
        self._drop_oldest(lambda freed: fits(freed) and len(self) + batches <= self.max_batches, why)

    def _drop_oldest(self, enough: Callable[[int], bool], why: str) -> int:
        """Drop the oldest batches until enough(bytes of disk freed); counted and logged. How many."""
        dropped, points, freed = [], 0, 0
        while len(self) and not enough(freed):
            seq = self._order[0]
            points += self._points_of(seq) or 0
            freed += self._unlink(seq)
            dropped.append(seq)
        if dropped:
            self._count_drop(points, len(dropped))
            log.warning("spool: %s: dropped the %d oldest batches (%d..%d, %d data points); %d dropped in all", why,
                        len(dropped), dropped[0], dropped[-1], points, self.dropped_batches)
        return len(dropped)

    def _count_drop(self, points: int | None, batches: int) -> None:
        self.dropped_batches += batches
        self.dropped_points += points or 0

    def _unlink(self, seq: int) -> int:
        """Remove a batch; the bytes of disk that frees."""
        path, freed = self.path(seq), 0
        try:
            freed = os.stat(path).st_blocks * 512
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("spool: could not remove batch %d: %s", seq, exc)
        self._forget(seq)
        return freed

    def _forget(self, seq: int) -> None:
        self._bytes -= self._sizes.pop(seq, 0)
        if self._order and self._order[0] == seq:
            self._order.popleft()
        elif seq in self._order:
            self._order.remove(seq)

    # -- reading

    def peek(self) -> tuple[int, bytes, int] | None:
        """(sequence number, serialized request, data points) of the oldest batch, or None when empty. A file
        that cannot be trusted is moved to corrupt/ and the next one is returned, as is one that failed
        UNREADABLE_TRIES reads in a row for a reason of its own. OSError: the oldest batch could not be read
        now; it stays, and a later peek reads it again."""
        with self._lock:
            while len(self):
                seq = self._order[0]
                try:
                    raw = self._read(seq)
                except FileNotFoundError:
                    log.warning("spool: batch %d vanished from %s", seq, self.directory)
                    self._forget(seq)
                    continue
                except OSError as exc:
                    self.read_errors += 1
                    if self._unreadable_for_good(seq, exc):
                        self._set_aside_unreadable(seq, exc)
                        continue
                    log.warning("spool: batch %d could not be read (%s); it stays, to be read again", seq, exc)
                    raise
                self._failed_reads = (-1, 0)
                try:
                    payload = decode_record(raw)
                    return seq, payload, _parse(payload)
                except Exception as exc:  # CorruptRecord, or a DecodeError from a request that does not parse
                    self.corrupt_batches += 1
                    self._count_drop(None, 1)
                    log.error("spool: batch %d is corrupt (%s): moved to corrupt/", seq,
                              exc if isinstance(exc, CorruptRecord) else f"request does not parse: {exc}")
                    self._quarantine(seq, "corrupt")
            return None

    def _unreadable_for_good(self, seq: int, exc: OSError) -> bool:
        if exc.errno in PROCESS_ERRORS:
            return False
        last, tries = self._failed_reads
        self._failed_reads = (seq, tries + 1 if last == seq else 1)
        return self._failed_reads[1] >= UNREADABLE_TRIES

    def _set_aside_unreadable(self, seq: int, exc: OSError) -> None:
        self.corrupt_batches += 1
        self._count_drop(None, 1)
        log.error("spool: batch %d could not be read %d times in a row (%s): moved to corrupt/, so that the "
                  "batches behind it go on", seq, UNREADABLE_TRIES, exc)
        self._failed_reads = (-1, 0)
        self._quarantine(seq, "corrupt")

    def _read(self, seq: int) -> bytes:
        with open(self.path(seq), "rb") as f:
            return f.read()

    def _points_of(self, seq: int) -> int | None:
        try:
            return self._points_or_none(self._read(seq))
        except OSError:
            return None

    @staticmethod
    def _points_or_none(raw: bytes) -> int | None:
        try:
            return _parse(decode_record(raw))
        except Exception:  # unreadable: the count is unknown, the drop is still counted
            return None

    def remove(self, seq: int) -> None:
        """Forget a batch that was delivered."""
        with self._lock:
            self._unlink(seq)

    def reject(self, seq: int, why: str) -> None:
        """Move a batch the receiver will not take to rejected/ (counted as a drop)."""
        with self._lock:
            points = self._points_of(seq)
            self.rejected_batches += 1
            self._count_drop(points, 1)
            log.error("spool: batch %d (%s data points) rejected: %s; moved to rejected/", seq, points, why)
            self._quarantine(seq, "rejected")

    def _quarantine(self, seq: int, sub: str) -> None:
        """Move a batch into a folder for people to look at. If it cannot be moved (a full disk) it stays
        where it is, out of the queue until the spool is opened again. Either way it is set aside: in the byte
        bound, and the first to go when room is needed."""
        taken = self._sizes.get(seq, 0)
        self._forget(seq)
        source = self.path(seq)
        target = os.path.join(self.directory, sub, os.path.basename(source))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(source, target)
        except FileNotFoundError:  # nothing left on disk to set aside
            return
        except OSError as exc:
            log.error("spool: could not move batch %d to %s/: %s", seq, sub, exc)
            target = source
        self._aside.add(target, seq, taken, QUARANTINE_KEEP)
