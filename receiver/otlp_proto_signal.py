"""Which signal an OTLP protobuf export request carries, told from its bytes alone.

The Collector's file exporter (`format: proto`) writes traces, metrics and logs requests to one file when one
exporter serves several pipelines, and nothing beside a request names its signal. The three requests are alike
down to their items (request, resource block and scope block each hold the next level in field 1 or 2), so the
signal is told by the items themselves. An item fits a signal when each of its fields numbered up to that
signal's highest has the number and wire type the signal's message gives it (higher numbers are fields added in
later OTLP versions) and it has what only that signal's item has:

- a span: a 16-byte trace_id (field 1) and an 8-byte span_id (field 2);
- a metric: a name (field 1) in UTF-8 and exactly one of gauge, sum, histogram, exponential histogram or summary;
- a log record: a field that is not length-delimited (a time, the severity number, the flags, the dropped
  attributes count), as body, attributes and ids alone would fit a metric without a name as well; its trace_id and
  span_id, if any, 16 and 8 bytes.

The first item that fits exactly one signal decides the request; items that fit none (an invalid span, say) are
passed over, and the decoder refuses them one by one as it would in a request that named its signal. A request
none of whose items decides (none at all, or all of them fitting none or several) is refused whole.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sloscope.records import Batch

from sloscope.receiver.otlp_common import DecodeError
from sloscope.receiver.otlp_proto import ProtoDecoder, parse
from sloscope.receiver.wire import FIXED32, FIXED64, FIXED_SIZES, LENGTH_DELIMITED, VARINT, NotWireFormat, varint

_FIXED64_TYPES = {FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_DOUBLE}
_FIXED32_TYPES = {FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_FLOAT}
_LENGTH_DELIMITED_TYPES = {FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES}
NOT_PROTOBUF = "neither JSON nor protobuf"  # a length-prefixed request not beginning with `{` is taken for protobuf
_METRIC_DATA = frozenset(field.number for field in Metric.DESCRIPTOR.oneofs_by_name["data"].fields)


def _wire_type(field: FieldDescriptor) -> int:
    """How a field is written (none of the items has a repeated number field, which would be packed)."""
    if field.type in _LENGTH_DELIMITED_TYPES:
        return LENGTH_DELIMITED
    if field.type in _FIXED64_TYPES:
        return FIXED64
    return FIXED32 if field.type in _FIXED32_TYPES else VARINT


def _wire_types(message) -> dict[int, int]:
    return {field.number: _wire_type(field) for field in message.DESCRIPTOR.fields}


_ITEM_FIELDS = {"traces": _wire_types(Span), "metrics": _wire_types(Metric), "logs": _wire_types(LogRecord)}
_NEWEST_FIELD = {signal: max(known) for signal, known in _ITEM_FIELDS.items()}  # above it: fields added since


def decode_request(decoder: ProtoDecoder, body: bytes) -> Batch:
    """A batch from a protobuf export request whose signal only its bytes tell."""
    return decoder.decode(parse(signal_of(body), body))


def signal_of(body: bytes) -> str:
    """The signal ("traces", "metrics" or "logs") of the first item that fits exactly one (see the module's
    docstring); DecodeError when none decides or the bytes are not protobuf."""
    items = fitting_several = 0
    try:
        for item in _items(memoryview(body)):
            items += 1
            fields = list(_fields(item))
            fits = [signal for signal in _ITEM_FIELDS if _fits(signal, fields)]
            if len(fits) == 1:
                return fits[0]
            fitting_several += len(fits) > 1
    except NotWireFormat as exc:
        raise DecodeError(f"{NOT_PROTOBUF}: {exc}") from None
    if not items:
        raise DecodeError("a protobuf request holding no span, metric or log record, so of no signal to read it as")
    if fitting_several:
        raise DecodeError(f"a protobuf request none of whose {items} items tells its signal: {fitting_several} of "
                          "them could each be more than one of span, metric and log record")
    raise DecodeError(f"a protobuf request whose {items} items are neither spans, metrics nor log records")


def _items(body: memoryview) -> Iterator[memoryview]:
    """The spans, metrics or log records of a request: field 2 of each scope block (field 2) of each resource
    block (field 1)."""
    for resource_block in _nested(body, 1):
        for scope_block in _nested(resource_block, 2):
            yield from _nested(scope_block, 2)


def _nested(message: memoryview, number: int) -> Iterator[memoryview]:
    for field, wire_type, value in _fields(message):
        if field == number and wire_type == LENGTH_DELIMITED:
            yield value


def _fits(signal: str, fields: list[tuple[int, int, memoryview | int]]) -> bool:
    known, newest = _ITEM_FIELDS[signal], _NEWEST_FIELD[signal]
    if any(number <= newest and known.get(number) != wire_type for number, wire_type, _ in fields):
        return False
    present = {number: value for number, _, value in fields}
    if signal == "traces":
        return _length(present.get(1)) == 16 and _length(present.get(2)) == 8
    if signal == "metrics":
        return _is_text(present.get(1)) and len(_METRIC_DATA & present.keys()) == 1
    return (any(wire_type != LENGTH_DELIMITED for _, wire_type, _ in fields)
            and _length(present.get(9)) in (None, 0, 16) and _length(present.get(10)) in (None, 0, 8))


def _length(value) -> int | None:
    return None if value is None else len(value)


def _is_text(value) -> bool:
    if value is None or not len(value):
        return False
    try:
        str(value, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fields(message: memoryview) -> Iterator[tuple[int, int, memoryview | int]]:
    """(field number, wire type, value) of each field of a message, its value an int for a varint and the bytes
    (not copied) otherwise."""
    position, end = 0, len(message)
    while position < end:
        key, position = varint(message, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise NotWireFormat("a field numbered 0")
        if wire_type == VARINT:
            value, position = varint(message, position)
        else:
            size, position = _size(message, position, wire_type)
            value, position = message[position:position + size], position + size
            if position > end:
                raise NotWireFormat("a field running past the end of the request")
        yield number, wire_type, value


def _size(message: memoryview, position: int, wire_type: int) -> tuple[int, int]:
    """The size of a field's value that is not a varint, and where the value starts."""
    if wire_type == LENGTH_DELIMITED:
        return varint(message, position)
    if wire_type in FIXED_SIZES:
        return FIXED_SIZES[wire_type], position
    raise NotWireFormat(f"wire type {wire_type} (groups and unknown types are not OTLP)")

