"""The records of the intake log (analytics/intake_log.py): a decoded request's frames and counters, encoded once
by the request thread and written by the log thread, which puts the header on; all integers big-endian:

    offset  size  field
         0     4  magic    b"SLIL"
         4     2  version  5 (1 to 4 are read too)
         6     8  length   of the payload in bytes
        14     4  CRC-32C  of the payload (versions 1 to 3: zlib's CRC-32)
        18     8  segment  the number of the segment the record was written into (version 5 only)
        26     4  CRC-32C  of the header's bytes before it (version 5 only)
        30     -  payload: four lengths (8 bytes each), then the spans, points and histograms frames as Arrow
                  IPC streams (version 1: IPC files; none, length 0, for an empty frame), then the request's
                  ingest counters as a JSON object. Versions 1 and 2 held the ids as hex text, read as words.
                  Versions 1 to 4 have no segment number and no header CRC: their payload begins at offset 18.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from dataclasses import dataclass

import google_crc32c
import polars as pl

from sloscope.analytics.ids import SPAN_WORDS, TRACE_WORDS, words_of_hex

from sloscope.analytics.frames import Frames, with_span_defaults

MAGIC = b"SLIL"
VERSION = 5
READS = (1, 2, 3, 4, 5)  # 1 wrote Arrow IPC files: four times the encoding's cost of a stream, for a footer unused
# CRC-32C has an instruction of its own on x86-64 and arm64: a fifth of zlib's CRC-32 time on a request's bytes.
CHECKSUMS = {1: zlib.crc32, 2: zlib.crc32, 3: zlib.crc32, 4: google_crc32c.value, 5: google_crc32c.value}
ARROW_FILE_MAGIC = b"ARROW1"
PREFIX = struct.Struct(">4sH")
HEADER = struct.Struct(">4sHQI")  # versions 1 to 4
NUMBERED = struct.Struct(">4sHQIQ")  # version 5, which the header's own CRC-32C follows
HEADER_CRC = struct.Struct(">I")
HEADER_V5_BYTES = NUMBERED.size + HEADER_CRC.size
PARTS = struct.Struct(">4Q")


class CorruptRecord(ValueError):
    """Bytes that are not a record this version can trust (torn, damaged, or of a later version)."""


class StaleRecord(CorruptRecord):
    """A record that checks out but was written in an earlier use of its file, a spare's."""


@dataclass(frozen=True)
class Record:
    """A record's payload as the buffers it is written from (joining them would copy a request's bytes once more,
    which costs as much as encoding them), with its length and CRC-32C. Its header names the segment the log
    thread writes it into."""

    pieces: tuple[bytes, ...]
    length: int
    crc: int

    def __len__(self) -> int:
        return HEADER_V5_BYTES + self.length

    def header(self, segment: int) -> bytes:
        numbered = NUMBERED.pack(MAGIC, VERSION, self.length, self.crc, segment)
        return numbered + HEADER_CRC.pack(google_crc32c.value(numbered))


def encode(frames: Frames, counts: dict) -> Record:
    """The record of a request. polars' `serialize` writes each frame as an Arrow IPC stream in one call.
    `write_ipc_stream` calls back into Python for each of its writes, each call waiting for the interpreter lock
    behind every busy request thread; Arrow's own writer took 1.5-2 times the CPU per record with ten threads
    encoding at once (benchmarks/intake_log_append.py)."""
    parts = [frame.serialize(format="binary") if not frame.is_empty() else b""  # an empty frame is a third of
             for frame in (frames.spans, frames.points, frames.histograms)]  # a one-signal record's time
    parts.append(json.dumps({k: int(v) for k, v in counts.items() if v}).encode())
    lengths = PARTS.pack(*map(len, parts))
    crc = google_crc32c.value(lengths)
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return Record((lengths, *parts), len(lengths) + sum(map(len, parts)), crc)


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
                      for part, name in zip(parts, ("spans", "points", "histograms"))))
    if "trace_id" in frames.spans.columns:
        frames.spans = _id_words(frames.spans)
    frames.spans = with_span_defaults(frames.spans)
    return frames, json.loads(parts[3])


def _id_words(requests: pl.DataFrame) -> pl.DataFrame:
    """Requests of a version 1 or 2 record, its ids hex text, with the ids as words."""
    trace = words_of_hex(requests["trace_id"].to_list(), TRACE_WORDS)
    span = words_of_hex(requests["span_id"].to_list(), SPAN_WORDS)
    return requests.with_columns(trace_hi=pl.Series(trace[:, 0]), trace_lo=pl.Series(trace[:, 1]),
                                 span_id=pl.Series(span[:, 0])).drop("trace_id")


def read_record(raw: bytes | memoryview, at: int, segment: int | None = None) -> tuple[bytes, int]:
    """(payload, offset of the next record) of the record at `at`; CorruptRecord when it cannot be trusted,
    StaleRecord when its header checks out and names a segment other than `segment` (a spare's earlier use)."""
    if len(raw) - at < PREFIX.size:
        raise CorruptRecord(f"{len(raw) - at} bytes: shorter than a header")
    magic, version = PREFIX.unpack_from(raw, at)
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic {bytes(magic)!r}")
    if version not in READS:
        raise CorruptRecord(f"format version {version}; this version reads {', '.join(map(str, READS))}")
    number, header_bytes = _header(raw, at, version)
    if number is not None and segment is not None and number != segment:
        raise StaleRecord(f"written into segment {number}, not {segment}")
    length, crc = HEADER.unpack_from(raw, at)[2:]  # every version begins with these fields
    end = at + header_bytes + length
    if end > len(raw):
        raise CorruptRecord(f"payload of {len(raw) - at - header_bytes} bytes, header says {length}")
    payload = bytes(raw[at + header_bytes:end])
    if CHECKSUMS[version](payload) != crc:
        raise CorruptRecord("checksum mismatch")
    return payload, end


def _header(raw: bytes | memoryview, at: int, version: int) -> tuple[int | None, int]:
    """(segment number or None, header bytes) of the record at `at`, its version read."""
    size = HEADER.size if version < 5 else HEADER_V5_BYTES
    if len(raw) - at < size:
        raise CorruptRecord(f"{len(raw) - at} bytes: shorter than the {size}-byte header")
    if version < 5:
        return None, size
    numbered = bytes(raw[at:at + NUMBERED.size])
    if google_crc32c.value(numbered) != HEADER_CRC.unpack_from(raw, at + NUMBERED.size)[0]:
        raise CorruptRecord("header checksum mismatch")
    return NUMBERED.unpack(numbered)[4], size


def later_record(raw: bytes, at: int, segment: int) -> int | None:
    """Where a record of `segment` that checks out begins after `at` (any record, in a segment of versions 1 to 4),
    or None: whether the bytes at `at` were damaged in the middle of the segment or are its end."""
    found = raw.find(MAGIC, at + 1)
    while found != -1:
        try:
            read_record(raw, found, segment)
            return found
        except CorruptRecord:
            found = raw.find(MAGIC, found + 1)
    return None
