"""Reading an HTTP request body within limits: framed by Content-Length or chunked transfer coding, bounded in
bytes throughout and reserved against the server's in-flight budget (budget.py) as its bytes arrive, never as
declared, so that a client which declares a large body and then stalls holds of the budget only what it sent.

Framing is checked as strictly as RFC 9112 lets a server be, since a body whose end two parties see differently
is how requests get smuggled past a proxy: a Content-Length that is not one plain decimal number, or one beside a
Transfer-Encoding, is refused.
"""

from __future__ import annotations

import re

from sloscope.edge.budget import Reservation

_DECIMAL = re.compile(rb"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,15}")
MAX_CHUNK_LINE = 4096  # a chunk size with its extensions
MAX_TRAILER_LINES = 64


class BodyError(Exception):
    """A request whose body cannot be taken: the HTTP status, the server's counter and what to tell the client."""

    def __init__(self, status: int, counter: str, message: str):
        super().__init__(message)
        self.status, self.counter = status, counter


def declared_length(headers) -> int | None:
    """The body's length by Content-Length, or None for a chunked body; BodyError for anything else."""
    lengths = headers.get_all("Content-Length") or []
    encodings = headers.get_all("Transfer-Encoding") or []
    if encodings:
        if lengths:
            raise BodyError(400, "requests_bad_framing", "Content-Length and Transfer-Encoding together")
        codings = [c.strip().lower() for value in encodings for c in value.split(",")]
        # RFC 9112: without chunked last (and once) the body has no length: 400. A coding before it (gzip,
        # chunked) is well-formed, and not implemented here: 501.
        if codings.count("chunked") != 1 or codings[-1] != "chunked":
            raise BodyError(400, "requests_bad_framing", "Transfer-Encoding must end with chunked, once")
        if codings != ["chunked"]:
            raise BodyError(501, "requests_bad_framing", "Transfer-Encoding must be chunked alone")
        return None
    if not lengths:
        raise BodyError(411, "requests_bad_framing", "Content-Length or Transfer-Encoding: chunked required")
    if len(lengths) > 1 or "," in lengths[0]:
        raise BodyError(400, "requests_bad_framing", "Content-Length given more than once")
    length = plain_length(lengths[0])
    if length is None:
        raise BodyError(400, "requests_bad_framing", "Content-Length must be one non-negative decimal number")
    return length


def plain_length(text: str) -> int | None:
    """A Content-Length value as RFC 9112 writes it, one plain decimal number; None for anything else (a sign, a
    `_`, a fraction), which int() would take or read otherwise than a proxy in front."""
    value = text.strip().encode("latin-1", "replace")
    return int(value) if _DECIMAL.fullmatch(value) else None


def too_large(limit: int, what: str = "body") -> BodyError:
    return BodyError(413, "requests_too_large", f"{what} larger than {limit} bytes")


def read_body(rfile, length: int | None, limit: int, held: Reservation) -> bytes:
    """The framed body (not yet decompressed), reserved piece by piece as it arrives."""
    if length is None:
        return _read_chunked(rfile, limit, held)
    if length > limit:
        raise too_large(limit)
    body = _received(rfile, length, held)
    if len(body) < length:
        raise BodyError(400, "requests_truncated", f"body ended after {len(body)} of {length} bytes")
    return body


def _read_chunked(rfile, limit: int, held: Reservation) -> bytes:
    parts, total = [], 0
    while True:
        size = _chunk_size(_line(rfile, "chunk size"))
        if size == 0:
            break
        if total + size > limit:
            raise too_large(limit)
        data = _received(rfile, size, held)
        if len(data) < size or _line(rfile, "chunk end") != b"":
            raise BodyError(400, "requests_bad_framing", "chunk shorter than its size or not ended by CRLF")
        parts.append(data)
        total += size
    for _ in range(MAX_TRAILER_LINES):  # trailers carry nothing these servers use; read past them
        if _line(rfile, "trailer") == b"":
            return b"".join(parts)
    raise BodyError(400, "requests_bad_framing", f"more than {MAX_TRAILER_LINES} trailer lines")


def _received(rfile, n: int, held: Reservation) -> bytes:
    """The next `n` bytes, or fewer where the client stops sending, reserved as they arrive: what the buffered
    reader already holds first, then each read of its raw reader (http_conn.DeadlineReader). One read of
    `n` fills one buffer, whose pages are touched only as bytes arrive; reading piece by piece into pieces of their
    own cost ten times as much."""
    if n == 0:
        return b""
    held.reserve(min(len(rfile.peek(1)), n))
    rfile.raw.on_arrival = held.reserve
    try:
        return rfile.read(n)
    finally:
        rfile.raw.on_arrival = None


def _line(rfile, what: str) -> bytes:
    line = rfile.readline(MAX_CHUNK_LINE + 1)
    if not line.endswith(b"\r\n"):
        problem = "too long" if len(line) > MAX_CHUNK_LINE else "cut off"
        raise BodyError(400, "requests_bad_framing", f"chunked body: {what} line {problem}")
    return line[:-2]


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", 1)[0].strip()
    if not _HEX.fullmatch(size):
        raise BodyError(400, "requests_bad_framing", "chunked body: chunk size is not a hexadecimal number")
    return int(size, 16)
