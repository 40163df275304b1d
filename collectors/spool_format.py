"""The spool's file format: one OTLP `ExportMetricsServiceRequest` per file, behind a small header that lets a
reader tell a damaged file from one it merely could not read.

Version 1 (what this version writes), all integers big-endian:

    offset  size  field
         0     4  magic   b"SLSP"
         4     2  version 1
         6     8  length  of the payload in bytes
        14    32  SHA-256 of the payload
        46     -  payload: the serialized ExportMetricsServiceRequest, exactly an OTLP/HTTP request body

Version 0 (what earlier versions wrote) is the bare payload, and still replays. The two never look alike: a
serialized request starts with field 1's tag (0x0A) or is empty, never with "S". A file that starts with "S"
but has another magic or version, a short header, a length or a checksum that does not match is corrupt; so
is a version 0 file that does not parse.

To read a version 1 file by hand: `tail -c +47 FILE` is the request.
"""

from __future__ import annotations

import hashlib
import struct

MAGIC = b"SLSP"
VERSION = 1
HEADER = struct.Struct(">4sHQ32s")


class CorruptRecord(ValueError):
    """The file's bytes are not a batch this version can trust (damaged, truncated, or of a later version)."""


def encode_record(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def decode_record(raw: bytes) -> bytes:
    """The payload of a file's bytes; CorruptRecord when they cannot be trusted. Version 0 files are returned
    whole (whether they parse is for the caller to find out)."""
    if not raw:  # no batch is empty: a file cut to nothing (a crash between create and write)
        raise CorruptRecord("empty file")
    if not raw.startswith(MAGIC[:1]):
        return raw  # version 0: no header
    if len(raw) < HEADER.size:
        raise CorruptRecord(f"{len(raw)} bytes: shorter than the {HEADER.size}-byte header")
    magic, version, length, digest = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic {magic!r}")
    if version != VERSION:
        raise CorruptRecord(f"format version {version}; this version reads 0 and {VERSION}")
    payload = raw[HEADER.size:]
    if len(payload) != length:
        raise CorruptRecord(f"payload of {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptRecord("checksum mismatch")
    return payload
