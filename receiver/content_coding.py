"""Request bodies in the content codings an OpenTelemetry Collector's otlphttp exporter may send (its confighttp
`compression`), inflated to at most a limit and reserved against the receiver's in-flight budget as they grow, so
that a small bomb never inflates past the limit:

- gzip: members one after another, as gzip writes them;
- zstd and lz4 (the LZ4 frame format): frames one after another;
- zlib, and deflate, which RFC 9110 and the Collector write as zlib's format (a raw DEFLATE stream, as some
  clients send it for deflate, is read too);
- snappy: the block format, or the framing format where the body begins with the framing's stream identifier,
  as the Collector reads it (its writers used the framing format under this name before v0.125);
- x-snappy-framed: the framing format (https://github.com/google/snappy/blob/main/framing_format.txt), each
  chunk's CRC-32C checked.

A body that does not decode is a 400 (counted as bad_gzip for gzip, bad_compression for the others); one that
inflates past the limit is a 413.
"""

from __future__ import annotations

import zlib

import cramjam
import google_crc32c
import lz4.frame

from sloscope.edge.budget import Reservation
from sloscope.edge.http_body import BodyError, too_large

from sloscope.receiver.zstd_module import zstd

INFLATE_STEP = 2**16  # decompressed bytes reserved at a time (zlib is several times slower at 1 MiB steps)
CODINGS = ("gzip", "zstd", "zlib", "deflate", "snappy", "x-snappy-framed", "lz4")
# Codings whose streams (gzip's members, zstd's and lz4's frames) may follow one another in a body; a producer
# writes one, and a few are taken. Each next stream starts on a copy of the rest of the body, so a body of many
# tiny ones would cost time as the square of its size.
MULTI_STREAM = frozenset({"gzip", "zstd", "lz4"})
MAX_STREAMS = 16
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
SNAPPY_CHUNK_MAX = 65536  # the framing format's bound on a chunk's uncompressed data


def decode(coding: str, data: bytes, limit: int, held: Reservation) -> bytes:
    """The body `data` sent with Content-Encoding `coding` (one of CODINGS, lower case), decoded."""
    if coding in ("snappy", "x-snappy-framed"):
        framed = coding == "x-snappy-framed" or data.startswith(SNAPPY_STREAM_IDENTIFIER)
        return _snappy_framed(data, limit, held) if framed else _snappy_block(data, limit, held)
    return _inflate(coding, data, limit, held)


def _bad(coding: str, problem: str) -> BodyError:
    counter = "requests_bad_gzip" if coding == "gzip" else "requests_bad_compression"
    return BodyError(400, counter, f"bad {coding} body: {problem}")


def _decompressor(coding: str, data: bytes, limit: int):
    """A fresh decompressor for the stream at the start of `data`, with zlib's interface or the one zstd's and
    lz4's share."""
    if coding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding in ("zlib", "deflate"):
        raw = coding == "deflate" and not _zlib_header(data)
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    if coding == "zstd":
        return _zstd_decompressor(data, limit)
    return lz4.frame.LZ4FrameDecompressor()


def _zstd_decompressor(data: bytes, limit: int):
    """A decompressor for the zstd frame at the start of `data`. A frame that states a content size past the limit
    is refused before it is inflated. The window a frame may ask for is bounded by the limit, but never below the
    8 MiB that zstd's levels up to 19 and the Collector's encoder use: it is memory held while the body decodes."""
    try:
        stated = zstd.get_frame_info(data).decompressed_size
    except zstd.ZstdError:
        stated = None  # not a frame header: the decompressor says what is wrong with it
    if stated is not None and stated > limit:
        raise too_large(limit, "decompressed body")
    window_log = min(max(23, (limit - 1).bit_length()), 31)
    return zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: window_log})


def _zlib_header(data: bytes) -> bool:
    """Whether `data` begins with a zlib header (RFC 1950: DEFLATE, and a check that divides by 31)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def _inflate(coding: str, data: bytes, limit: int, held: Reservation) -> bytes:
    """Inflate stream after stream, INFLATE_STEP bytes of output at a time. zlib's decompressor hands back the
    input it has not taken yet (unconsumed_tail); zstd's and lz4's keep it, and say whether they need more
    (needs_input): both kinds are driven by the one loop."""
    parts, total, streams = [], 0, 1
    inflater = _decompressor(coding, data, limit)
    pending = data
    while True:
        try:
            chunk = inflater.decompress(pending, INFLATE_STEP)
        except (zlib.error, zstd.ZstdError, RuntimeError) as exc:  # lz4's errors are RuntimeErrors
            raise _bad(coding, str(exc)) from None
        total += len(chunk)
        if total > limit:
            raise too_large(limit, "decompressed body")
        held.reserve(len(chunk))
        parts.append(chunk)
        pending = getattr(inflater, "unconsumed_tail", b"")
        if inflater.eof:
            if not inflater.unused_data:
                return b"".join(parts)
            if coding not in MULTI_STREAM:
                raise _bad(coding, "data after the end of the stream")
            streams += 1
            if streams > MAX_STREAMS:
                raise _bad(coding, f"more than {MAX_STREAMS} streams (members or frames) one after another")
            pending = inflater.unused_data
            inflater = _decompressor(coding, pending, limit)
        elif not pending and not chunk and getattr(inflater, "needs_input", True):
            raise _bad(coding, "cut off before its end")


def _snappy_block(data: bytes, limit: int, held: Reservation) -> bytes:
    length = _snappy_stated_length(data, "snappy")
    if length > limit:  # the block format states its length first: nothing is inflated past the limit
        raise too_large(limit, "decompressed body")
    held.reserve(length)
    return _snappy_raw(data, "snappy")


def _snappy_stated_length(data, coding: str) -> int:
    """The uncompressed length a snappy block states before its data."""
    try:
        return cramjam.snappy.decompress_raw_len(data)
    except cramjam.DecompressionError as exc:
        raise _bad(coding, str(exc)) from None


def _snappy_raw(data, coding: str) -> bytes:
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as exc:
        raise _bad(coding, str(exc)) from None


def _snappy_framed(data: bytes, limit: int, held: Reservation) -> bytes:
    coding = "x-snappy-framed"
    if not data.startswith(SNAPPY_STREAM_IDENTIFIER):
        raise _bad(coding, "the stream does not begin with the stream identifier")
    view, parts, total, at = memoryview(data), [], 0, 0
    while at < len(data):
        if at + 4 > len(data):
            raise _bad(coding, "chunk header cut off")
        kind, size = data[at], int.from_bytes(data[at + 1:at + 4], "little")
        body, at = view[at + 4:at + 4 + size], at + 4 + size
        if len(body) < size:
            raise _bad(coding, "chunk cut off before its end")
        if kind == 0xFF:
            if bytes(body) != SNAPPY_STREAM_IDENTIFIER[4:]:
                raise _bad(coding, "bad stream identifier")
        elif kind in (0x00, 0x01):
            chunk = _snappy_chunk(kind, body, coding)
            total += len(chunk)
            if total > limit:
                raise too_large(limit, "decompressed body")
            held.reserve(len(chunk))
            parts.append(chunk)
        elif kind < 0x80:
            raise _bad(coding, f"reserved unskippable chunk type {kind:#04x}")
        # 0x80-0xfe: padding and reserved skippable chunks carry nothing
    return b"".join(parts)


def _snappy_chunk(kind: int, body: memoryview, coding: str) -> bytes:
    """A compressed (0x00) or uncompressed (0x01) chunk's data, its masked CRC-32C checked."""
    if len(body) < 4:
        raise _bad(coding, "chunk shorter than its checksum")
    if kind == 0x00:
        length = _snappy_stated_length(body[4:], coding)
        if length > SNAPPY_CHUNK_MAX:
            raise _bad(coding, f"a chunk of {length} bytes, past the format's {SNAPPY_CHUNK_MAX}")
        chunk = _snappy_raw(body[4:], coding)
    else:
        chunk = bytes(body[4:])
        if len(chunk) > SNAPPY_CHUNK_MAX:
            raise _bad(coding, f"a chunk of {len(chunk)} bytes, past the format's {SNAPPY_CHUNK_MAX}")
    crc = google_crc32c.value(chunk)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    if masked != int.from_bytes(body[:4], "little"):
        raise _bad(coding, "chunk checksum does not match its data")
    return chunk
