"""Reading the files the OpenTelemetry Collector's file exporter writes, each recognised by its first bytes,
whatever the file is called:

- `format: json`: one OTLP/JSON export request per line, plain or gzip; with `compression: zstd` and the
  exporter's native compression (its `exporter.file.nativeCompression` gate), the whole file one zstd stream of
  such lines;
- `format: proto`: each request in protobuf after its length (4 bytes, big-endian), and the same in a zstd stream
  with native compression;
- `compression: zstd` as the exporter writes it by default, in either format: each request a zstd frame after
  the frame's length.

A length-prefixed request is yielded as bytes when it is JSON (it begins with `{`, as the exporter's JSON
always does) and as a ProtobufRequest otherwise, whose signal the decoder tells from its items
(receiver/otlp_proto_signal.py): one exporter serving several pipelines writes traces, metrics and logs to one file.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from sloscope.receiver.zstd_module import zstd

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PREFIX_BYTES = 4  # the exporter's length before each request it does not write as a line
MAX_REQUEST_BYTES = 256 * 2**20  # a length past it is a damaged file, not a request to allocate for
READ_ERRORS = (OSError, EOFError, zstd.ZstdError)


class ProtobufRequest(bytes):
    """A length-prefixed request that is not JSON: protobuf, as the exporter writes it with format: proto."""


class FileReadError(OSError):
    pass


def read_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, line) for every non-blank line; for length-prefixed requests, (request number,
    request), a ProtobufRequest when it is not JSON. A file that cannot be opened or whose compression or framing
    is broken raises FileReadError after the requests read before the damage."""
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            head = raw.read(PREFIX_BYTES + len(ZSTD_MAGIC))
    except OSError as exc:
        raise FileReadError(f"{path}: {exc.strerror or exc}") from None
    if head.startswith(GZIP_MAGIC):
        return _requests(path, gzip.open)
    if head.startswith(ZSTD_MAGIC):
        return _requests(path, zstd.open)
    return _requests(path, open)


def _length_prefixed(head: bytes) -> bool:
    """Whether the file begins with a length (its first byte 0 below 16 MiB requests) and a request that is a zstd
    frame or protobuf (its first field's tag, 0x0a), as the exporter writes what it cannot write as lines."""
    request = head[PREFIX_BYTES:]
    return head[:1] == b"\0" and (request.startswith(ZSTD_MAGIC) or request.startswith(b"\x0a"))


def _requests(path: Path, opener) -> Iterator[tuple[int, bytes]]:
    """The lines or length-prefixed requests of a file as `opener` (open, gzip.open, zstd.open) reads it."""
    try:
        with opener(path, "rb") as handle:
            framed = _length_prefixed(handle.read(PREFIX_BYTES + len(ZSTD_MAGIC)))
            handle.seek(0)
            yield from _prefixed(path, handle) if framed else _lines(path, handle)
    except FileReadError:
        raise
    except READ_ERRORS as exc:  # before the first line or request
        raise FileReadError(f"{path}:1: cannot read further: {exc}") from None


def _lines(path: Path, handle) -> Iterator[tuple[int, bytes]]:
    lineno = 0
    try:
        for lineno, line in enumerate(handle, start=1):
            if line.strip():
                yield lineno, line
    except READ_ERRORS as exc:
        raise FileReadError(f"{path}:{lineno + 1}: cannot read further: {exc}") from None


def _prefixed(path: Path, handle) -> Iterator[tuple[int, bytes]]:
    number = 1  # of the request being read, which a damaged stream may break in its length
    try:
        while prefix := handle.read(PREFIX_BYTES):
            if len(prefix) < PREFIX_BYTES:
                raise FileReadError(f"{path}:{number}: request cut off before its end (in its length)")
            length = int.from_bytes(prefix, "big")
            if length > MAX_REQUEST_BYTES:
                raise FileReadError(f"{path}:{number}: a request of {length} bytes: the file is damaged")
            request = handle.read(length)
            if len(request) < length:
                raise FileReadError(f"{path}:{number}: request cut off before its end ({len(request)} of its "
                                    f"{length} bytes)")
            if request.startswith(ZSTD_MAGIC):
                request = _unpacked(path, number, request)
            yield number, (request if request.startswith(b"{") else ProtobufRequest(request))
            number += 1
    except FileReadError:
        raise
    except READ_ERRORS as exc:
        raise FileReadError(f"{path}:{number}: cannot read further: {exc}") from None


def _unpacked(path: Path, number: int, frame: bytes) -> bytes:
    """A request's zstd frame inflated, to at most MAX_REQUEST_BYTES."""
    unpacker = zstd.ZstdDecompressor()
    request = unpacker.decompress(frame, MAX_REQUEST_BYTES + 1)
    if len(request) > MAX_REQUEST_BYTES:
        raise FileReadError(f"{path}:{number}: a request inflating past {MAX_REQUEST_BYTES} bytes")
    if not unpacker.eof:
        raise FileReadError(f"{path}:{number}: request cut off before its end")
    return request

