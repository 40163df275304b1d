"""What decoding an export request would build, counted from its bytes before anything decodes it, and the
receiver's limits on those counts (--max-request-items, --max-request-attributes, --max-request-buckets).

A request's bytes do not bound what it costs: an empty span is 2 bytes of protobuf, and a 32 KiB deflate body
inflates within the 32 MiB body limit to 16 million of them, each a message the parser builds and the decoder
refuses (about 180 bytes and 2 us each). So the items, attributes and histogram buckets of a request are counted
first, by a walk that stops as soon as one of them passes its limit: a request past a limit is refused (413,
RESOURCE_EXHAUSTED) having cost a pass over its bytes, and one within them reserves what its decoding holds
(`decode_bytes`) against the in-flight budget beside its bytes, so that the budget bounds decoding's memory too.

- protobuf: the wire format, walked by otlp_spans.c's count() (in C, without the interpreter lock), or by the
  same walk here where the extension was not built (as slow as the general decoder, which then does the rest);
- JSON: the parser builds an object for every value, so items are the JSON values other than attributes' and
  buckets': at most the commas and twice the brackets (brackets in strings too, which only overcount; where
  that passes a limit, the text without its strings is counted again). Attributes are the `"key"` members of
  key-values, buckets the elements of bucketCounts and explicitBounds; the values of a key-value written whole
  (`{"key": "k", "value": {`) are its attribute's, not items.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from sloscope.receiver import otlp_spans
from sloscope.receiver.limits import Limits
from sloscope.receiver.wire import FIXED_SIZES, LENGTH_DELIMITED, VARINT, NotWireFormat, varint

SIGNAL_INDEX = {"traces": 0, "metrics": 1, "logs": 2}  # otlp_spans.c's count()
# What decoding holds per counted thing, at its peak, on the general path (the fast path holds less), measured
# with requests of empty items: an empty span is ~180 bytes of parsed message and refusal, a key-value with an
# integer ~90, a bucket count ~15 (a protobuf number and its share of the decoder's lists).
ITEM_BYTES, ATTRIBUTE_BYTES, BUCKET_BYTES = 192, 96, 16
EMPTY_ITEM_BYTES = 2  # the smallest item on the wire: an empty message's tag and length


class Counts(NamedTuple):
    items: int
    attributes: int
    buckets: int


# What each count is, and the flag of its limit, in the order of Counts.
KINDS = (("items (resources, scopes, spans, span events and links, metrics, data points, exemplars, log records)",
          "--max-request-items"),
         ("attributes (key-values, and values in arrays)", "--max-request-attributes"),
         ("histogram buckets (bucket counts, explicit bounds, summary quantiles)", "--max-request-buckets"))


class TooManyItems(ValueError):
    """A request holding more of something than the receiver decodes in one request: a 413 / RESOURCE_EXHAUSTED,
    not worth retrying as it is."""

    COUNTER = "requests_too_many_items"


def maxima_of(limits: Limits) -> Counts:
    return Counts(limits.max_request_items, limits.max_request_attributes, limits.max_request_buckets)


def decode_bytes(counts: Counts) -> int:
    """Bytes that decoding a request of these counts holds, at most, beside the request's own."""
    return counts.items * ITEM_BYTES + counts.attributes * ATTRIBUTE_BYTES + counts.buckets * BUCKET_BYTES


def counted(signal: str, body: bytes, is_json: bool, limits: Limits) -> Counts:
    """The request's counts; TooManyItems once one passes its limit. A protobuf body the walk cannot read through
    (not wire format as it reads it, though the parser may differ) is taken to hold as many items as its bytes
    could: EMPTY_ITEM_BYTES each."""
    maxima = maxima_of(limits)
    counts = _json_counts(body, maxima) if is_json else _protobuf_counts(signal, body, maxima)
    for (what, flag), n, most in zip(KINDS, counts, maxima):
        if n > most:
            raise TooManyItems(f"more than {most} {what} in one request ({flag})")
    return counts


# --- protobuf -------------------------------------------------------------------------------------------------


def _protobuf_counts(signal: str, body: bytes, maxima: Counts) -> Counts:
    if otlp_spans.available():
        *counts, read_through = otlp_spans.count_items(body, SIGNAL_INDEX[signal], tuple(maxima))
    else:
        counts, read_through = _walked(signal, body, maxima)
    counts = Counts(*counts)
    if read_through or any(n > most for n, most in zip(counts, maxima)):
        return counts
    # Where the walk stopped, the parser might read on (a varint it takes and the walk does not): what it could
    # build there is bounded by the bytes alone.
    return counts._replace(items=max(counts.items, len(body) // EMPTY_ITEM_BYTES))


def _walked(signal: str, body: bytes, maxima: Counts) -> tuple[list[int], bool]:
    walk = _Walk(list(maxima), ITEM_KINDS[signal])
    try:
        walk.message(memoryview(body), "request", 0)
    except NotWireFormat:
        return walk.counts, False
    except _Over:
        pass
    return walk.counts, True


ITEMS, ATTRIBUTES, BUCKETS = range(3)
MAX_LEVELS = 100  # the parser's depth limit: deeper is refused, or cut away (nesting.py)
ITEM_KINDS = {"traces": "span", "metrics": "metric", "logs": "log"}
PACKED_VARINT, PACKED_FIXED64 = "varint", "fixed64"
_ATTRIBUTE = ("key_value", ATTRIBUTES, None)
# otlp_spans.c's counted_field(): per message kind, per field number, (the kind it holds or None, the count each
# occurrence adds to or None, how its numbers are packed or None).
_FIELDS = {
    "request": {1: ("resource_block", ITEMS, None)},
    "resource_block": {1: ("resource", None, None), 2: ("scope_block", ITEMS, None)},
    "resource": {1: _ATTRIBUTE},
    "scope_block": {1: ("scope", None, None), 2: ("item", ITEMS, None)},
    "scope": {3: _ATTRIBUTE},
    "span": {9: _ATTRIBUTE, 11: ("event", ITEMS, None), 13: ("link", ITEMS, None)},
    "event": {3: _ATTRIBUTE},
    "link": {4: _ATTRIBUTE},
    "metric": {5: ("numbers", None, None), 7: ("numbers", None, None), 9: ("histogram", None, None),
               10: ("exponential", None, None), 11: ("summary", None, None), 12: _ATTRIBUTE},
    "numbers": {1: ("number_point", ITEMS, None)},
    "histogram": {1: ("histogram_point", ITEMS, None)},
    "exponential": {1: ("exponential_point", ITEMS, None)},
    "summary": {1: ("summary_point", ITEMS, None)},
    "number_point": {7: _ATTRIBUTE, 5: ("exemplar", ITEMS, None)},
    "histogram_point": {9: _ATTRIBUTE, 8: ("exemplar", ITEMS, None), 6: (None, BUCKETS, PACKED_FIXED64),
                        7: (None, BUCKETS, PACKED_FIXED64)},
    "exponential_point": {1: _ATTRIBUTE, 8: ("buckets", None, None), 9: ("buckets", None, None),
                          11: ("exemplar", ITEMS, None)},
    "buckets": {2: (None, BUCKETS, PACKED_VARINT)},
    "summary_point": {7: _ATTRIBUTE, 6: (None, BUCKETS, None)},
    "exemplar": {7: _ATTRIBUTE},
    "log": {6: _ATTRIBUTE, 5: ("any_value", None, None)},
    "key_value": {2: ("any_value", None, None)},
    "any_value": {5: ("array", None, None), 6: ("key_value_list", None, None)},
    "array": {1: ("any_value", ATTRIBUTES, None)},
    "key_value_list": {1: _ATTRIBUTE},
}
_START_GROUP, _END_GROUP = 3, 4
_LOW_BYTES = bytes(range(0x80))


class _Over(Exception):
    """A count passed its limit: the walk stops."""


class _Walk:
    """otlp_spans.c's count() in Python, for where the extension was not built."""

    def __init__(self, maxima: list[int], item: str):
        self.maxima = maxima
        self.item = item  # what a scope block holds
        self.counts = [0, 0, 0]

    def add(self, which: int, n: int) -> None:
        self.counts[which] += n
        if self.counts[which] > self.maxima[which]:
            raise _Over

    def message(self, data: memoryview, kind: str, level: int) -> None:
        fields, pos, end = _FIELDS[kind], 0, len(data)
        while pos < end:
            key, pos = varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise NotWireFormat("a field numbered 0")
            child, which, packed = fields.get(number, (None, None, None))
            if wire_type == _START_GROUP:
                pos = _group_end(data, pos)
                continue
            if wire_type != LENGTH_DELIMITED:
                pos = _number_end(data, pos, wire_type)
                if packed:
                    self.add(BUCKETS, 1)
                continue
            size, pos = varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
            if pos > end:
                raise NotWireFormat("a field running past the end of its message")
            if packed:
                self.add(BUCKETS, len(value) // 8 if packed == PACKED_FIXED64 else _varints_in(value))
                continue
            if which is not None:
                self.add(which, 1)
            if child is not None and level < MAX_LEVELS:
                self.message(value, self.item if child == "item" else child, level + 1)


def _varints_in(packed: memoryview) -> int:
    """How many varints a packed field holds: one ends at each byte below 0x80."""
    return len(packed) - len(bytes(packed).translate(None, _LOW_BYTES))


def _number_end(data: memoryview, pos: int, wire_type: int) -> int:
    if wire_type == VARINT:
        return varint(data, pos)[1]
    if wire_type not in FIXED_SIZES:
        raise NotWireFormat(f"wire type {wire_type}")
    return pos + FIXED_SIZES[wire_type]


def _group_end(data: memoryview, pos: int) -> int:
    """Where the group opened before `pos` ends: a loop, as groups may nest deep."""
    open_groups = 1
    while open_groups:
        key, pos = varint(data, pos)
        wire_type = key & 7
        if wire_type == _START_GROUP:
            open_groups += 1
        elif wire_type == _END_GROUP:
            open_groups -= 1
        elif wire_type == LENGTH_DELIMITED:
            size, pos = varint(data, pos)
            pos += size
        else:
            pos = _number_end(data, pos, wire_type)
    return pos


# --- JSON -----------------------------------------------------------------------------------------------------

_BUCKET_KEYS = (b'"bucketCounts"', b'"bucket_counts"', b'"explicitBounds"', b'"explicit_bounds"')
_LIST_OPENS = re.compile(rb"\s*:\s*\[")
_NOT_SPACE = re.compile(rb"\S")
_STRINGS = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_KEYS = re.compile(rb'"key"\s*:')  # a member name: inside a string its quotes would be escaped
# A key-value written whole: its values are one comma and two objects (two each by the count of brackets), none of
# them items; only where they are really there, so that no other shape can lower the count of items.
_KEY_VALUES = re.compile(rb'"key"\s*:\s*"(?:[^"\\]++|\\.)*+"\s*,\s*"value"\s*:\s*\{')
VALUES_PER_ATTRIBUTE = 5


def _json_counts(body: bytes, maxima: Counts) -> Counts:
    attributes, buckets = _occurrences(_KEYS, body), _json_buckets(body)
    whole = _occurrences(_KEY_VALUES, body)
    counts = _json_items(body, attributes, whole, buckets)
    if counts.items > maxima.items:  # perhaps only for brackets and commas in strings
        counts = _json_items(_STRINGS.sub(b'""', body), attributes, whole, buckets)
    return counts


def _occurrences(pattern: re.Pattern, body: bytes) -> int:
    return pattern.subn(b"", body)[1]  # counted in C, where a loop over matches would be one in Python


def _json_items(text: bytes, attributes: int, whole: int, buckets: int) -> Counts:
    values = text.count(b",") + 2 * (text.count(b"{") + text.count(b"["))
    return Counts(max(values - VALUES_PER_ATTRIBUTE * whole - buckets, 0), attributes, buckets)


def _json_buckets(body: bytes) -> int:
    """The elements of every list of bucket counts or explicit bounds (lists of numbers, or of numbers' texts)."""
    total = 0
    for key in _BUCKET_KEYS:
        at = body.find(key)
        while at >= 0:
            opened = _LIST_OPENS.match(body, at + len(key))
            if opened:
                start = opened.end()
                end = body.find(b"]", start)
                end = len(body) if end < 0 else end
                total += body.count(b",", start, end) + bool(_NOT_SPACE.search(body, start, end))
            at = body.find(key, at + len(key))
    return total
