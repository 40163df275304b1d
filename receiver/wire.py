"""Protobuf's wire format at the byte level, for the two places that read a request before (or instead of)
parsing it with its schema: telling a file exporter request's signal (otlp_proto_signal.py) and cutting away
nesting past the parser's limit (nesting.py)."""

from __future__ import annotations

VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
FIXED_SIZES = {FIXED64: 8, FIXED32: 4}
MAX_VARINT_BYTES = 10


class NotWireFormat(ValueError):
    """The bytes are not protobuf wire format throughout (a string, a bytes value, or garbage)."""


def varint(data: memoryview, pos: int) -> tuple[int, int]:
    """(the varint at `pos`, where it ends); raises NotWireFormat for one cut off or longer than 10 bytes."""
    value, shift, end = 0, 0, min(pos + MAX_VARINT_BYTES, len(data))
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise NotWireFormat("a number cut off or longer than 10 bytes")


def encoded_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
