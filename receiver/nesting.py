"""Export request bodies with what is nested past their parser's depth limit cut away, so that such nesting costs
the item holding it, not the whole request.

upb refuses a protobuf message nested past 100 levels and orjson a JSON document nested past 1024, and either
refusal is of the whole body: one hostile or broken attribute value would turn every good span beside it into a
400. Nothing OTLP defines nests deeper than a few levels except an AnyValue (an attribute value, a log body), and
the decoders refuse an attribute value nested past MAX_ATTRIBUTE_DEPTH (8) where they read it, item by item, and
ignore it where they do not. So once a parser has refused a body for its depth, and only then (nothing is walked
on the happy path), every value nested deeper than a level far above anything legitimate but within the parser's
limit is cut away and the body parsed again. What is cut lies inside an attribute value already too deep for the
decoders, and what is left of it is still too deep: the item holding it is refused alone, counted under its
reason (spans_invalid_attribute, points_invalid_attribute, ..._invalid_resource), or, where the attribute is not
read, kept as one nested 20 levels is; everything else parses exactly as sent.

The walks are single passes, since the body may be a hostile 32 MiB: each protobuf field is read once, by the level
that holds it (a payload too short to reach the cut not at all), and the JSON walk steps by a compiled pattern
through runs of brackets, not bytes; neither recurses in Python deeper than the level it cuts at. A body that is
not wire format (or JSON) throughout, or that still does not parse, keeps its parser's own error. So does one
whose groups nest past upb's limit: upb calls that corrupt wire format, not depth, and as OTLP has no groups, only
garbage has them; walking every corrupt body in Python on the chance would cost more than it could save.
"""

from __future__ import annotations

import re

from sloscope.receiver.wire import (END_GROUP, FIXED_SIZES, LENGTH_DELIMITED, START_GROUP, VARINT, NotWireFormat,
                                    encoded_varint, varint)

# Message levels kept (the request is level 0): upb takes 100. The deepest legitimate content, a depth-8 attribute
# value of a histogram exemplar, ends by level 33; what lies past level 64 is at least 20 AnyValues deep.
PROTOBUF_LEVELS = 64
# Arrays and objects kept (the request object is level 1): orjson takes 1024. The deepest legitimate value ends by
# level 50; what lies past level 128 is at least 30 AnyValues deep.
JSON_LEVELS = 128

_DEPTH_ERROR = re.compile("depth|recursion", re.IGNORECASE)


def is_depth_error(error: Exception) -> bool:
    """Whether a parser refused a body for nesting past its limit (upb: "Exceeded upb_DecodeOptions_MaxDepth";
    orjson: "depth limit exceeded"), the one refusal that pruning can answer."""
    return bool(_DEPTH_ERROR.search(str(error)))


# --- protobuf -------------------------------------------------------------------------------------------------


def pruned_protobuf(body: bytes, levels: int = PROTOBUF_LEVELS) -> bytes | None:
    """The body with every length-delimited field nested deeper than `levels` messages emptied and every group
    reaching past that level dropped; None when that changes nothing or the body is not wire format."""
    try:
        pruned = _pruned_message(memoryview(body), 0, levels)
    except NotWireFormat:
        return None
    return None if pruned is None else bytes(pruned)


def _pruned_message(data: memoryview, level: int, levels: int) -> bytearray | None:
    """The message at `level` with what lies past `levels` cut away, or None when nothing is; raises
    NotWireFormat. Each field is read once; a payload is walked only by the call for its own level."""
    out, copied_to, pos, end = None, 0, 0, len(data)
    while pos < end:
        field_start = pos
        tag, tag_end = varint(data, pos)
        wire_type, field, pos = tag & 7, tag >> 3, tag_end
        if field == 0:
            raise NotWireFormat
        if wire_type == LENGTH_DELIMITED:
            length, payload_start = varint(data, pos)
            pos = payload_start + length
            if pos > end:
                raise NotWireFormat
            replacement = _pruned_payload(data[payload_start:pos], level + 1, levels)
            if replacement is None:
                continue
            out = out if out is not None else bytearray()
            out += data[copied_to:tag_end]
            out += encoded_varint(len(replacement))
            out += replacement
        elif wire_type == START_GROUP:
            pos, nesting = _group_end(data, pos, field)
            if level + nesting <= levels:
                continue
            out = out if out is not None else bytearray()
            out += data[copied_to:field_start]  # the group is left out: nothing reads a group, OTLP has none
        elif wire_type == VARINT:
            pos = varint(data, pos)[1]
            continue
        elif wire_type in FIXED_SIZES:
            pos += FIXED_SIZES[wire_type]
            continue
        else:  # an end-group outside its group, or no wire type at all
            raise NotWireFormat
        copied_to = pos
    if pos != end:
        raise NotWireFormat
    if out is not None:
        out += data[copied_to:]
    return out


def _pruned_payload(payload: memoryview, level: int, levels: int) -> bytes | bytearray | None:
    """What a length-delimited field at `level` becomes, or None: it stays as it is. Past `levels` it is
    emptied, whatever it holds; above, it is read as a message only if it is wire format throughout, since it
    may as well be a string. One too short to reach past `levels` even if every two of its bytes opened a level
    (a tag and a length) is left unread."""
    if level > levels:
        return b"" if payload else None
    if level + len(payload) // 2 <= levels:
        return None
    try:
        return _pruned_message(payload, level, levels)
    except NotWireFormat:
        return None


def _group_end(data: memoryview, pos: int, field: int) -> tuple[int, int]:
    """(where the group opened before `pos` ends, how many groups deep it nests); raises NotWireFormat. A loop
    with a stack, not recursion, as a group may nest thousands deep. What the group holds stays unread: upb keeps
    it as unknown bytes, which nest no deeper."""
    open_groups, deepest, end = [field], 1, len(data)
    while open_groups:
        tag, pos = varint(data, pos)
        wire_type, inner = tag & 7, tag >> 3
        if inner == 0:
            raise NotWireFormat
        if wire_type == START_GROUP:
            open_groups.append(inner)
            deepest = max(deepest, len(open_groups))
        elif wire_type == END_GROUP:
            if open_groups.pop() != inner:
                raise NotWireFormat
        elif wire_type == LENGTH_DELIMITED:
            length, pos = varint(data, pos)
            pos += length
        elif wire_type == VARINT:
            pos = varint(data, pos)[1]
        elif wire_type in FIXED_SIZES:
            pos += FIXED_SIZES[wire_type]
        else:
            raise NotWireFormat
        if pos > end:
            raise NotWireFormat
    return pos, deepest


# --- JSON -----------------------------------------------------------------------------------------------------

# The steps of the walk, each matched in C: a run of openers, or one of closers, with what lies between them (no
# bracket outside a string, and strings with no bracket in them: its brackets are counted by bytes.count); else a
# string, which may hold brackets (an unterminated one to the end, so that no scan restarts inside it).
_BETWEEN = rb'(?:[^"\[\]{}]++|"(?:[^"\\\[\]{}]++|\\[^\[\]{}])*+")*+'
_JSON_TOKENS = re.compile(rb"[\[{](?:" + _BETWEEN + rb"[\[{])*+"
                          rb"|[\]}](?:" + _BETWEEN + rb"[\]}])*+"
                          rb'|"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_OPENERS_AS_ONE = bytes.maketrans(b"{", b"[")
_CLOSERS_AS_ONE = bytes.maketrans(b"}", b"]")


def pruned_json(text: bytes, levels: int = JSON_LEVELS) -> bytes | None:
    """The JSON text with every array or object nested deeper than `levels` replaced by null; None when that
    changes nothing or its brackets do not balance. Brackets inside strings are no nesting."""
    pieces, copied_to, depth, cut_from = [], 0, 0, None
    for token in _JSON_TOKENS.finditer(text):
        first = text[token.start()]
        if first == 0x22:  # '"'
            continue
        run = token.group()
        if first in b"[{":
            opened = run.count(b"[") + run.count(b"{")
            if cut_from is None and depth + opened > levels:
                cut_from = token.start() + _nth(run.translate(_OPENERS_AS_ONE), b"[", levels - depth + 1)
            depth += opened
            continue
        after = depth - run.count(b"]") - run.count(b"}")
        if cut_from is not None and after <= levels:
            # the closer that brings the depth back to `levels`, counted from the run's end (levels - after
            # closers follow it), so that a run of millions is not counted through
            cut_to = token.start() + _nth_from_end(run.translate(_CLOSERS_AS_ONE), b"]", levels - after + 1) + 1
            pieces += [text[copied_to:cut_from], b"null"]
            copied_to, cut_from = cut_to, None
        depth = after
    if cut_from is not None or depth != 0 or not pieces:
        return None
    pieces.append(text[copied_to:])
    return b"".join(pieces)


def _nth(run: bytes, bracket: bytes, n: int) -> int:
    """Where the n-th `bracket` of the run is."""
    pos = -1
    for _ in range(n):
        pos = run.index(bracket, pos + 1)
    return pos


def _nth_from_end(run: bytes, bracket: bytes, n: int) -> int:
    """Where the n-th `bracket` of the run, counted from its end, is."""
    pos = len(run)
    for _ in range(n):
        pos = run.rindex(bracket, 0, pos)
    return pos
