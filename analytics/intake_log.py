"""The intake log of `sloscope serve`: decoded requests appended and fsynced before they are acknowledged, then
committed to the store in the background, and replayed at start when serve stopped before committing them.

A directory of segment files, `NNNNNNNNNNNNNNNN.log`, each a sequence of records (analytics/intake_record.py).

The frames are those handed to the writer (tiers resolved, requests placed on their node), so a replay needs no
decoder and stores what the first attempt would have. One thread writes the log: it takes every record queued
since its last round, writes them and fsyncs them once (group commit), then wakes their request threads, each on a
lock of its own. A new segment is fsynced into the directory before its first record is acknowledged.

The log is written with O_DIRECT, a block at a time through one page-aligned buffer of the log thread's, so the
kernel neither copies the records into its page cache nor writes them back at the fsync; the last block is
padded with zeros, and the next round writes it again with the records that follow. Where the file system takes
no O_DIRECT, the log goes through the page cache. A segment whose records are all committed (or set aside in
`rejected/`) is kept as a spare, `NNNNNNNNNNNNNNNN.spare`, while the spares hold less than `spare_bytes`, else
deleted; the next segment is a spare renamed and written over from its start, as PostgreSQL recycles its WAL
segments: its blocks are allocated already (ext4 allocates a new file's in the thread that fsyncs, and frees
them in the one that unlinks), so `fdatasync` has no metadata to commit. Records of a spare's earlier use, left
after the new ones, are told apart by their segment number, always lower: a new segment's number is above every
file's in the directory. Spares go when an append fails (their space may be what the disk lacks) and at a stop,
which, with everything committed, leaves the directory empty. Together these take the log thread from about
0.40 to 0.10 CPU seconds per million spans (its CPU clock, under benchmarks/ingest_throughput.py's load).

At open, every segment left is read back for replay, and new records go to a new segment. When a record does not
check out but some record of the segment does after it, the record was damaged (a flipped bit, a zeroed block):
its bytes, up to the next record that checks out, are copied to `rejected/` for inspection, and the records after
them are replayed as the ones before, so that one damaged record costs only itself. Otherwise it is the segment's
end: a torn last record, from a crash during its append (never acknowledged, since the acknowledgement comes
after the fsync), the zeros that pad its last block, or records of the file's earlier use; it is cut off.

Replaying a record that was committed before a crash (its segment was not yet deleted) adds no rows: the store's
writes are idempotent. What it does count again: the counters that came with the request (tier resolution,
placement, decoding skips) and, for its rows, `requests_duplicate`, `samples_duplicate`, `histograms_duplicate`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sloscope.files import fsync_directory

from sloscope.analytics.intake_record import CorruptRecord, Record, later_record, read_record

log = logging.getLogger("sloscope.intake_log")
FILE_NUMBER = re.compile(r"[0-9]{16}")  # a segment's or a spare's name, before its suffix
SEGMENT_BYTES = 16 * 2**20  # a crash replays at most about this much that was already committed
SPARE_BYTES = 256 * 2**20  # serve's default --queue-bytes: at most what the log may hold uncommitted anyway
REJECTED = "rejected"
IOV_MAX = os.sysconf("SC_IOV_MAX")
BLOCK = 4096  # O_DIRECT's unit of buffer address, file offset and length: a multiple of every device's block
DIRECT_BUFFER_BYTES = 8 * 2**20  # what one direct write takes at most; a round writes as many as it needs
# While appends fail (a full disk), how often the log thread writes a block of its own to see whether the cause has
# gone: readiness then comes back with no request, which a not-ready pod behind a Service would never get.
PROBE_S = 1.0
PROBE_NAME = ".probe"


class LogAppendError(OSError):
    """The record could not be made durable (disk full, I/O error); nothing of it is left in the log."""


@dataclass(eq=False)
class Segment:
    path: Path
    fd: int | None = None  # open while records are appended to it
    size: int = 0  # of its records, every one of them fsynced
    outstanding: int = 0  # records in it not yet committed or set aside
    reusable: bool = True  # as a spare: not one left by an earlier process, which may hold unnumbered records
    direct: bool = False  # written with O_DIRECT, a block at a time
    tail: bytes = b""  # with O_DIRECT, its records' bytes in their last, partly filled block

    @property
    def number(self) -> int:
        return int(self.path.stem)


@dataclass(frozen=True)
class Entry:
    """Where one record lies in the log."""

    segment: Segment
    offset: int
    length: int


@dataclass(eq=False)
class _Append:
    """One request's record on its way into the log; `done` is released once it is durable or has failed."""

    record: Record
    entry: Entry | None = None
    error: OSError | None = None
    done: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class IntakeLog:
    directory: Path
    segment_bytes: int = SEGMENT_BYTES
    spare_bytes: int = SPARE_BYTES
    recovered: list[tuple[Entry, bytes]] = field(default_factory=list)  # (entry, payload) to replay, in order
    failure: str | None = None  # why the last append failed, until one succeeds

    def __post_init__(self):
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self.directory)
        self._lock = threading.Lock()  # the queue, segments and spares: held for renames and unlinks, not writes
        self._work = threading.Condition(self._lock)
        self._queue: list[_Append] = []
        self._closing = False
        self._highest_taken = 0  # the highest number a file of the directory wears, the log's own or not
        self._segments: list[Segment] = []
        self._spares: list[Path] = self._own_files(".spare")  # left by a crash
        self._direct = hasattr(os, "O_DIRECT")  # until the file system refuses it
        self._buffer: mmap.mmap | None = None  # page-aligned, for O_DIRECT writes; the log thread's alone
        self._active: Segment | None = None
        for path in self._own_files(".log"):
            self._recover(Segment(path, reusable=False))
        self._thread = threading.Thread(target=self._run, name="sloscope-intake-log", daemon=True)
        self._thread.start()

    # --- recovery ----------------------------------------------------------------------------------------

    def _own_files(self, suffix: str) -> list[Path]:
        """The log's own files of `suffix` (NNNNNNNNNNNNNNNN.log, .spare), in order. Anything else that wears the
        suffix (notes.log, a directory named like a segment) is left alone and said once: it must never stop
        serve from starting. A new segment is numbered above it all the same (_highest_taken)."""
        own = []
        for path in sorted(self.directory.glob(f"*{suffix}")):
            numbered = FILE_NUMBER.fullmatch(path.stem) is not None
            if numbered:
                self._highest_taken = max(self._highest_taken, int(path.stem))
            if numbered and path.is_file() and not path.is_symlink():
                own.append(path)
            else:
                log.warning("%s: not one of the intake log's files (a regular file named NNNNNNNNNNNNNNNN%s); left "
                            "alone", path, suffix)
        return own

    def _recover(self, segment: Segment) -> None:
        raw, at = segment.path.read_bytes(), 0
        while at < len(raw):
            try:
                payload, end = read_record(raw, at, segment.number)
            except CorruptRecord as exc:
                resume = later_record(raw, at, segment.number)
                if resume is None:
                    self._cut(segment, raw, at, exc)
                    break
                self._set_damaged_aside(segment, raw, at, resume, exc)
                at = resume
                continue
            self.recovered.append((Entry(segment, at, end - at), payload))
            at = end
        segment.size = at
        segment.outstanding = sum(1 for entry, _ in self.recovered if entry.segment is segment)
        self._segments.append(segment)
        self._retire_if_done(segment)

    def _set_damaged_aside(self, segment: Segment, raw: bytes, at: int, resume: int, why: CorruptRecord) -> None:
        """Copy the damaged bytes [at, resume) to rejected/; the segment keeps them, between records it replays,
        until it is deleted with them."""
        kept = self._set_aside(f"{segment.path.stem}-{at}.damaged", raw[at:resume])
        log.warning("%s: record at byte %d does not check out (%s), though the one at byte %d does; its %d bytes "
                    "copied to %s, and the records after them replayed", segment.path, at, why, resume, resume - at,
                    kept)

    def _cut(self, segment: Segment, raw: bytes, at: int, why: CorruptRecord) -> None:
        """End the segment at `at`: nothing of the segment checks out after it."""
        log.info("%s: its records end at byte %d; %d bytes after them (a torn append or an earlier use of the file: "
                 "%s) cut off", segment.path, at, len(raw) - at, why)
        with segment.path.open("r+b") as f:
            f.truncate(at)
            os.fsync(f.fileno())

    # --- appending ---------------------------------------------------------------------------------------

    def append(self, record: Record) -> Entry:
        """Write a record and return once it is fsynced; LogAppendError when it cannot be, with nothing of it
        left behind. Every append waiting meanwhile shares the log thread's next write and fsync."""
        append = _Append(record)
        append.done.acquire()
        with self._lock:
            if self._closing:
                raise LogAppendError(errno.ESHUTDOWN, "intake log append failed: the log is closed")
            self._queue.append(append)
            self._work.notify()
        append.done.acquire()  # one wake-up per request, from the log thread: no herd on a shared lock
        if append.error is not None:
            exc = append.error
            raise LogAppendError(exc.errno, f"intake log append failed: {exc.strerror or exc}")
        return append.entry

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    if self.failure is None:
                        self._work.wait()
                    elif not self._work.wait(PROBE_S):
                        break
                batch, self._queue = self._queue, []
                closing = self._closing
            if batch:
                self._log(batch)
            elif closing:
                return
            else:
                self._probe()

    def _probe(self) -> None:
        """Write and fsync a block of a file of its own in the log's directory: where that works, the appends'
        failure is over (the next append finds out for sure)."""
        path = self.directory / PROBE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, [bytes(BLOCK)])
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self.failure = None
        except OSError as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                path.unlink(missing_ok=True)
            except OSError:  # gone with the directory: the next append says so
                pass

    def _log(self, batch: list[_Append]) -> None:
        """Write a batch into the segments, fsynced; each append is then durable or failed, and woken."""
        group: list[_Append] = []  # the appends bound for the active segment
        try:
            for append in batch:
                active = self._active
                if active is None or (active.size and active.size + len(append.record) > self.segment_bytes):
                    self._write(group)
                    group = []
                    self._next_segment()
                group.append(append)
            self._write(group)
            self.failure = None
        except OSError as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            for append in batch:
                if append.entry is None:
                    append.error = exc
            with self._lock:
                self._drop_spares()
        finally:
            for append in batch:
                append.done.release()

    def _write(self, group: list[_Append]) -> None:
        """Append the group's records to the active segment and fsync it; on failure, none of them is left."""
        if not group:
            return
        segment = self._active
        pieces = [piece for append in group for piece in (append.record.header(segment.number), *append.record.pieces)]
        try:
            if segment.direct:
                tail = self._write_direct(segment, pieces)
            else:
                tail = b""  # the page cache takes any length: no block to write again
                _write_all(segment.fd, pieces)
            os.fdatasync(segment.fd)
        except OSError as exc:  # the bytes after the last good fsync are of no certain state: take them all back
            os.ftruncate(segment.fd, segment.size)
            os.lseek(segment.fd, segment.size, os.SEEK_SET)  # else the next write leaves a hole where they were
            if not (segment.direct and exc.errno == errno.EINVAL):
                raise
            self._without_direct(segment)  # a file system that opens with O_DIRECT but refuses its writes
            return self._write(group)
        offset = segment.size
        with self._lock:
            for append in group:
                append.entry = Entry(segment, offset, len(append.record))
                offset += len(append.record)
            segment.size, segment.outstanding, segment.tail = offset, segment.outstanding + len(group), tail

    def _write_direct(self, segment: Segment, pieces: list) -> bytes:
        """Write the pieces after the segment's records with O_DIRECT, through the page-aligned buffer: whole
        blocks, the last one padded with zeros, beginning with the block the segment's records end in. No page
        cache: the kernel neither copies the bytes nor writes them back at the fsync, and the log's memory stays
        the same buffer. Returns the bytes of the new last, partly filled block."""
        if self._buffer is None:
            self._buffer = mmap.mmap(-1, DIRECT_BUFFER_BYTES)
        buffer, filled = self._buffer, len(segment.tail)
        offset = segment.size - filled
        buffer[:filled] = segment.tail
        for piece in pieces:
            view = memoryview(piece)
            while view:
                taken = min(len(view), len(buffer) - filled)
                buffer[filled:filled + taken] = view[:taken]
                filled, view = filled + taken, view[taken:]
                if filled == len(buffer):
                    _pwrite_all(segment.fd, memoryview(buffer), offset)
                    offset, filled = offset + filled, 0
        blocks = -(-filled // BLOCK) * BLOCK
        buffer[filled:blocks] = bytes(blocks - filled)
        _pwrite_all(segment.fd, memoryview(buffer)[:blocks], offset)
        return buffer[filled - filled % BLOCK:filled]

    def _next_segment(self) -> None:
        """Close the active segment (fsynced with its last group) and start the next one, a spare if there is
        one, numbered above every file of the directory."""
        with self._lock:
            if self._active is not None:
                self._close(self._active)
            numbers = [s.number for s in self._segments] + [int(p.stem) for p in self._spares]
            spare = self._spares.pop() if self._spares else None
        segment = Segment(self.directory / f"{max([*numbers, self._highest_taken]) + 1:016d}.log")
        if spare is None:
            self._open(segment, os.O_CREAT | os.O_EXCL)
        else:
            os.rename(spare, segment.path)
            self._open(segment, 0)
        try:
            fsync_directory(self.directory)  # else a crash may lose the file with acknowledged records in it
        except OSError:
            os.close(segment.fd)
            segment.path.unlink(missing_ok=True)
            raise
        with self._lock:
            self._segments.append(segment)
            self._active = segment

    def _open(self, segment: Segment, flags: int) -> None:
        """Open the segment for writing, with O_DIRECT unless its file system refuses it (tmpfs before Linux 6.6,
        some network and FUSE file systems), which the log then no longer asks for."""
        flags |= os.O_WRONLY | os.O_CLOEXEC
        if self._direct:
            try:
                segment.fd, segment.direct = os.open(segment.path, flags | os.O_DIRECT, 0o644), True
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.info("%s: the file system refuses O_DIRECT; the log is written through the page cache",
                         self.directory)
                self._direct = False
                flags &= ~os.O_EXCL  # the refused open may have created the file already
        segment.fd = os.open(segment.path, flags, 0o644)

    def _without_direct(self, segment: Segment) -> None:
        log.info("%s: the file system refuses O_DIRECT writes; the log is written through the page cache",
                 self.directory)
        fcntl.fcntl(segment.fd, fcntl.F_SETFL, fcntl.fcntl(segment.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        segment.direct, segment.tail, self._direct = False, b"", False

    def _close(self, segment: Segment) -> None:
        os.close(segment.fd)
        segment.fd = None
        if self._active is segment:
            self._active = None
        self._retire_if_done(segment)

    # --- after the store ---------------------------------------------------------------------------------

    def release(self, entries: list[Entry]) -> None:
        """These records are committed (or set aside): delete the segments nothing else is waiting in."""
        with self._lock:
            for entry in entries:
                entry.segment.outstanding -= 1
            for segment in {entry.segment for entry in entries}:
                self._retire_if_done(segment)

    def reject(self, entry: Entry, why: str) -> Path:
        """Keep a record the store refuses in rejected/ (it was acknowledged: it must not be lost); the caller
        then releases it."""
        with entry.segment.path.open("rb") as f:
            f.seek(entry.offset)
            record = f.read(entry.length)
        kept = self._set_aside(f"{entry.segment.path.stem}-{entry.offset}.rec", record)
        log.warning("a logged request the store refuses is kept in %s: %s", kept, why)
        return kept

    def close(self) -> None:
        """Log what is queued, close the active segment (deleted when everything in it is committed) and let the
        directory go."""
        with self._lock:
            self._closing = True
            self._work.notify()
        self._thread.join()
        with self._lock:
            if self._active is not None:
                self._close(self._active)
            self._drop_spares()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _retire_if_done(self, segment: Segment) -> None:
        """A segment all of whose records are committed becomes a spare, or is deleted (the lock is held)."""
        if segment.outstanding or segment.fd is not None:
            return
        self._segments.remove(segment)
        room = (len(self._spares) + 1) * self.segment_bytes <= self.spare_bytes
        if segment.reusable and room and not self._closing:
            spare = segment.path.with_suffix(".spare")
            segment.path.rename(spare)
            self._spares.append(spare)
        else:
            segment.path.unlink(missing_ok=True)

    def _drop_spares(self) -> None:
        while self._spares:
            self._spares.pop().unlink(missing_ok=True)

    def _set_aside(self, name: str, data: bytes) -> Path:
        directory = self.directory / REJECTED
        directory.mkdir(exist_ok=True)
        path = directory / name
        with path.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_directory(directory)
        return path


def _write_all(fd: int, pieces: list) -> None:
    """Write every piece, in order, with as few system calls as the kernel allows."""
    while pieces:
        written = os.writev(fd, pieces[:IOV_MAX])
        while pieces and written >= len(pieces[0]):
            written -= len(pieces.pop(0))
        if written:
            pieces[0] = memoryview(pieces[0])[written:]


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _lock_directory(directory: Path) -> int:
    """Two processes appending to one log would each replay and delete the other's records."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(f"{directory}: in use by another process") from None
    return fd

