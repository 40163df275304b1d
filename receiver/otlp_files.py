"""Reading OTLP-JSON files as the OpenTelemetry Collector's file exporter writes them (`format: json`), each
recognised by its first bytes, whatever the file is called:

- one export request per line, plain or gzip;
- `compression: zstd` with the exporter's native compression: the whole file one zstd stream of such lines;
- `compression: zstd` as the exporter writes it by default: each request a zstd frame after its length (4 bytes,
  big-endian).

The exporter's `format: proto` (requests as length-prefixed protobuf) is refused with a message saying so.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from receiver.zstd_module import zstd

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PREFIX_BYTES = 4  # the exporter's length before each request it does not write as a line
MAX_REQUEST_BYTES = 256 * 2**20  # a length past it is a damaged file, not a request to allocate for
PROTO_FORMAT = "requests in protobuf (the file exporter's format: proto) are not read: set format: json"


class FileReadError(OSError):
    pass


def read_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, line) for every non-blank line; for length-prefixed requests, (request number,
    request). A file that cannot be opened, whose compression is broken or that holds protobuf raises
    FileReadError after the requests read before the damage."""
    path = Path(path)
    try:
        with open(path, "rb") as raw:
            head = raw.read(PREFIX_BYTES + len(ZSTD_MAGIC))
    except OSError as exc:
        raise FileReadError(f"{path}: {exc.strerror or exc}") from None
    if head.startswith(GZIP_MAGIC):
        return _lines(path, gzip.open)
    if head.startswith(ZSTD_MAGIC):
        return _lines(path, zstd.open)
    if _length_prefixed(head):
        return _prefixed(path)
    return _lines(path, open)


def _length_prefixed(head: bytes) -> bool:
    """Whether the file begins with a length (its first byte 0 below 16 MiB requests) and a request that is a zstd
    frame or protobuf (its first field's tag, 0x0a), as the exporter writes what it cannot write as lines."""
    request = head[PREFIX_BYTES:]
    return head[:1] == b"\0" and (request.startswith(ZSTD_MAGIC) or request.startswith(b"\x0a"))


def _lines(path: Path, opener) -> Iterator[tuple[int, bytes]]:
    lineno = 0
    try:
        with opener(path, "rb") as handle:
            if _length_prefixed(handle.read(PREFIX_BYTES + len(ZSTD_MAGIC))):  # native zstd around protobuf
                raise FileReadError(f"{path}:1: {PROTO_FORMAT}")
            handle.seek(0)
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    yield lineno, line
    except FileReadError:
        raise
    except (OSError, EOFError, zstd.ZstdError) as exc:
        raise FileReadError(f"{path}:{lineno + 1}: cannot read further: {exc}") from None


def _prefixed(path: Path) -> Iterator[tuple[int, bytes]]:
    number = 0
    try:
        with open(path, "rb") as handle:
            while prefix := handle.read(PREFIX_BYTES):
                number += 1
                length = int.from_bytes(prefix, "big")
                if length > MAX_REQUEST_BYTES:
                    raise FileReadError(f"{path}:{number}: a request of {length} bytes: the file is damaged")
                request = handle.read(length)
                if len(prefix) < PREFIX_BYTES or len(request) < length:
                    raise FileReadError(f"{path}:{number}: request cut off before its end")
                if request.startswith(ZSTD_MAGIC):
                    request = _unpacked(path, number, request)
                _refuse_protobuf(path, number, request)
                yield number, request
    except FileReadError:
        raise
    except (OSError, zstd.ZstdError) as exc:
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


def _refuse_protobuf(path: Path, number: int, request: bytes) -> None:
    """A protobuf request begins with its first field's tag (resource spans, metrics or logs: 0x0a), never a
    JSON document's `{` or blank."""
    if request.startswith(b"\x0a"):
        raise FileReadError(f"{path}:{number}: {PROTO_FORMAT}")
