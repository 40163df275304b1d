"""The intake log of `sloscope serve`: decoded requests appended and fsynced before they are acknowledged, then
committed to the store in the background, and replayed at start when serve stopped before committing them.

A directory of segment files, `NNNNNNNNNNNNNNNN.log`, each a sequence of records; all integers big-endian:

    offset  size  field
         0     4  magic    b"SLIL"
         4     2  version  3 (1 and 2 are read too)
         6     8  length   of the payload in bytes
        14     4  CRC-32   of the payload
        18     -  payload: four lengths (8 bytes each), then the requests, points and histograms frames as Arrow
                  IPC streams (version 1: IPC files; none, length 0, for an empty frame), then the request's
                  ingest counters as a JSON object. Versions 1 and 2 held the ids as hex text, read as words.

The frames are those handed to the writer (tiers resolved, requests placed on their node), so a replay needs no
decoder and stores what the first attempt would have. Appends are serialised by a lock and made durable by group
fsync: one appender fsyncs for all that wrote before it, the others wait for it. A new segment is fsynced into
the directory before its first record is acknowledged. A segment is deleted once every record in it is committed
(or set aside in `rejected/`); a clean stop, with everything committed, leaves the directory empty.

At open, every segment left is read back for replay, and new records go to a new segment. A record that does not
check out (a torn last record, from a crash during its append: never acknowledged, since the acknowledgement comes
after the fsync; or damaged bytes) ends its segment: the bytes from it on are moved to `rejected/` and cut off.

Replaying a record that was committed before a crash (its segment was not yet deleted) adds no rows: the store's
writes are idempotent. What it does count again: the counters that came with the request (tier resolution,
placement, decoding skips) and, for its rows, `requests_duplicate`, `samples_duplicate`, `histograms_duplicate`.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from sloscope.files import fsync_directory
from sloscope.ids import SPAN_WORDS, TRACE_WORDS, words_of_hex

from analytics.store import REQUEST_COLUMNS, Frames

log = logging.getLogger("sloscope.intake_log")
MAGIC = b"SLIL"
VERSION = 3
READS = (1, 2, 3)  # 1 wrote Arrow IPC files: four times the encoding's cost of a stream, for a footer unused
ARROW_FILE_MAGIC = b"ARROW1"
HEADER = struct.Struct(">4sHQI")
PARTS = struct.Struct(">4Q")
SEGMENT_BYTES = 16 * 2**20  # a crash replays at most about this much that was already committed
REJECTED = "rejected"


class CorruptRecord(ValueError):
    """Bytes that are not a record this version can trust (torn, damaged, or of a later version)."""


class LogAppendError(OSError):
    """The record could not be made durable (disk full, I/O error); nothing of it is left in the log."""


def encode(frames: Frames, counts: dict) -> memoryview:
    """The record of a request, built in one buffer: copying a request's bytes costs as much as encoding them."""
    out = io.BytesIO()
    out.seek(HEADER.size + PARTS.size)
    lengths = []
    for frame in (frames.requests, frames.points, frames.histograms):
        at = out.tell()
        if not frame.is_empty():  # a third of the encoding's time for a request of one signal
            frame.write_ipc_stream(out, compression="uncompressed")
        lengths.append(out.tell() - at)
    lengths.append(out.write(json.dumps({k: int(v) for k, v in counts.items() if v}).encode()))
    record = out.getbuffer()
    PARTS.pack_into(record, HEADER.size, *lengths)
    payload = record[HEADER.size:]
    HEADER.pack_into(record, 0, MAGIC, VERSION, len(payload), zlib.crc32(payload))
    return record


def _frame(part: bytes) -> pl.DataFrame:
    read = pl.read_ipc if part.startswith(ARROW_FILE_MAGIC) else pl.read_ipc_stream
    return read(io.BytesIO(part))


def decode(payload: bytes) -> tuple[Frames, dict]:
    lengths, at, parts = PARTS.unpack_from(payload), PARTS.size, []
    for length in lengths:
        parts.append(payload[at:at + length])
        at += length
    empty = Frames.concat([])
    frames = Frames(*(_frame(part) if part else getattr(empty, name)
                      for part, name in zip(parts, ("requests", "points", "histograms"))))
    if "trace_id" in frames.requests.columns:
        frames.requests = _id_words(frames.requests)
    return frames, json.loads(parts[3])


def _id_words(requests: pl.DataFrame) -> pl.DataFrame:
    """Requests of a version 1 or 2 record, its ids hex text, with the ids as words."""
    trace = words_of_hex(requests["trace_id"].to_list(), TRACE_WORDS)
    span = words_of_hex(requests["span_id"].to_list(), SPAN_WORDS)
    return requests.with_columns(trace_hi=pl.Series(trace[:, 0]), trace_lo=pl.Series(trace[:, 1]),
                                 span_id=pl.Series(span[:, 0])).select(REQUEST_COLUMNS)


def read_record(raw: bytes | memoryview, at: int) -> tuple[bytes, int]:
    """(payload, offset of the next record) of the record at `at`; CorruptRecord when it cannot be trusted."""
    if len(raw) - at < HEADER.size:
        raise CorruptRecord(f"{len(raw) - at} bytes: shorter than the {HEADER.size}-byte header")
    magic, version, length, crc = HEADER.unpack_from(raw, at)
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic {bytes(magic)!r}")
    if version not in READS:
        raise CorruptRecord(f"format version {version}; this version reads {', '.join(map(str, READS))}")
    end = at + HEADER.size + length
    if end > len(raw):
        raise CorruptRecord(f"payload of {len(raw) - at - HEADER.size} bytes, header says {length}")
    payload = bytes(raw[at + HEADER.size:end])
    if zlib.crc32(payload) != crc:
        raise CorruptRecord("checksum mismatch")
    return payload, end


@dataclass(eq=False)
class Segment:
    path: Path
    fd: int | None = None  # open while records are appended to it
    size: int = 0
    synced_size: int = 0
    outstanding: int = 0  # records in it not yet committed or set aside


@dataclass(frozen=True)
class Entry:
    """Where one record lies in the log."""

    segment: Segment
    offset: int
    length: int


@dataclass(eq=False)
class _SyncRound:
    """Appenders whose bytes one fsync makes durable."""

    done: bool = False
    error: OSError | None = None


@dataclass
class IntakeLog:
    directory: Path
    segment_bytes: int = SEGMENT_BYTES
    recovered: list[tuple[Entry, bytes]] = field(default_factory=list)  # (entry, payload) to replay, in order
    failure: str | None = None  # why the last append failed, until one succeeds

    def __post_init__(self):
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self.directory)
        self._cond = threading.Condition()
        self._segments: list[Segment] = []
        self._active: Segment | None = None
        self._round = _SyncRound()
        self._syncing = False
        for path in sorted(self.directory.glob("*.log")):
            self._recover(Segment(path))

    # --- recovery ----------------------------------------------------------------------------------------

    def _recover(self, segment: Segment) -> None:
        raw, at = segment.path.read_bytes(), 0
        while at < len(raw):
            try:
                payload, end = read_record(raw, at)
            except CorruptRecord as exc:
                self._cut(segment, raw, at, exc)
                break
            self.recovered.append((Entry(segment, at, end - at), payload))
            at = end
        segment.size = segment.synced_size = at
        segment.outstanding = sum(1 for entry, _ in self.recovered if entry.segment is segment)
        self._segments.append(segment)
        self._delete_if_done(segment)

    def _cut(self, segment: Segment, raw: bytes, at: int, why: CorruptRecord) -> None:
        kept = self._set_aside(f"{segment.path.stem}-{at}.tail", raw[at:])
        log.warning("%s: record at byte %d does not check out (%s); %d bytes from it on moved to %s",
                    segment.path, at, why, len(raw) - at, kept)
        with segment.path.open("r+b") as f:
            f.truncate(at)
            os.fsync(f.fileno())

    # --- appending ---------------------------------------------------------------------------------------

    def append(self, record: bytes | memoryview) -> Entry:
        """Write a record and return once it is fsynced; LogAppendError when it cannot be, with nothing of it
        left behind."""
        with self._cond:
            written = False
            try:
                segment = self._segment_for(len(record))
                offset = segment.size
                self._write(segment, record)
                segment.outstanding, written = segment.outstanding + 1, True
                self._await_sync(self._round)
            except OSError as exc:
                if written:  # taken back with its round's failed fsync
                    segment.outstanding -= 1
                self.failure = f"{type(exc).__name__}: {exc}"
                raise LogAppendError(exc.errno, f"intake log append failed: {exc.strerror or exc}") from None
            self.failure = None
        return Entry(segment, offset, len(record))

    def _segment_for(self, length: int) -> Segment:
        while True:
            active = self._active
            if active is not None and (active.size == 0 or active.size + length <= self.segment_bytes):
                return active
            if not self._syncing:
                break
            self._cond.wait()  # the fsync in flight uses the active segment's descriptor
        if active is not None:
            self._sync_now(active)
            self._close(active)
        number = int(self._segments[-1].path.stem) + 1 if self._segments else 1
        segment = Segment(self.directory / f"{number:016d}.log")
        segment.fd = os.open(segment.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._segments.append(segment)
        self._active = segment
        try:
            fsync_directory(self.directory)  # else a crash may lose the file with acknowledged records in it
        except OSError:
            self._close(segment)
            raise
        return segment

    def _write(self, segment: Segment, record: bytes) -> None:
        view, written = memoryview(record), 0
        try:
            while written < len(record):
                written += os.write(segment.fd, view[written:])
        except OSError:
            os.ftruncate(segment.fd, segment.size)  # a disk-full write may have left part of the record
            raise
        segment.size += len(record)

    def _await_sync(self, round_: _SyncRound) -> None:
        """Wait until an fsync covers this appender's bytes, doing it when no one else is (the lock is held)."""
        while not round_.done:
            if self._syncing:
                self._cond.wait()
                continue
            self._syncing, self._round = True, _SyncRound()
            segment, size = self._active, self._active.size
            self._cond.release()
            try:
                os.fsync(segment.fd)
                error = None
            except OSError as exc:
                error = exc
            finally:
                self._cond.acquire()
                self._syncing = False
            self._finish(round_, segment, size, error)
        if round_.error is not None:
            raise round_.error

    def _finish(self, round_: _SyncRound, segment: Segment, size: int, error: OSError | None) -> None:
        if error is None:
            segment.synced_size = size
        else:  # the bytes after the last good fsync are of no certain state: take them all back, and fail them
            for failed in (round_, self._round):
                failed.error = error
                failed.done = True
            self._round = _SyncRound()
            os.ftruncate(segment.fd, segment.synced_size)
            segment.size = segment.synced_size
        round_.done = True
        self._cond.notify_all()

    def _sync_now(self, segment: Segment) -> None:
        """fsync a segment that is being closed, for the round waiting on it (the lock is held)."""
        try:
            os.fsync(segment.fd)
            error = None
        except OSError as exc:
            error = exc
        self._finish(self._round, segment, segment.size, error)
        self._round = _SyncRound()
        if error is not None:
            raise error

    def _close(self, segment: Segment) -> None:
        os.close(segment.fd)
        segment.fd = None
        if self._active is segment:
            self._active = None
        self._delete_if_done(segment)

    # --- after the store ---------------------------------------------------------------------------------

    def release(self, entries: list[Entry]) -> None:
        """These records are committed (or set aside): delete the segments nothing else is waiting in."""
        with self._cond:
            for entry in entries:
                entry.segment.outstanding -= 1
            for segment in {entry.segment for entry in entries}:
                self._delete_if_done(segment)

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
        """Close the active segment (deleted when everything in it is committed) and let the directory go."""
        with self._cond:
            while self._syncing:
                self._cond.wait()
            if self._active is not None:
                self._close(self._active)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _delete_if_done(self, segment: Segment) -> None:
        if segment.outstanding or segment.fd is not None:
            return
        segment.path.unlink(missing_ok=True)
        self._segments.remove(segment)

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


def _lock_directory(directory: Path) -> int:
    """Two processes appending to one log would each replay and delete the other's records."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(f"{directory}: in use by another process") from None
    return fd

