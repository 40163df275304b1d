"""A lean view of OTLP trace export requests for the receiver's hot path.

Reading a field of a parsed protobuf message from Python creates a wrapper object per sub-message, and a span's
attributes are a handful of sub-messages each: most of the cost of decoding a span. This view declares the
same field numbers as opentelemetry-proto's trace.proto, but a span's attributes and status as raw bytes, so
that the receiver looks at the key of each attribute without decoding it, and decodes the few it keeps once per
distinct encoding (they repeat: routes, status codes, tier headers). The request is still parsed in full first
(`otlp_proto.parse`), so what is valid is decided by the real message types alone.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "sloscope.otlp_lean"

# (message, [(field name, number, type, label, message type)]), the numbers of trace.proto and
# trace_service.proto; fields left out are kept as unknown fields and never read.
_MESSAGES = (
    ("ExportTraceServiceRequest", [("resource_spans", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ResourceSpans")]),
    ("ResourceSpans", [("resource", 1, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
                       ("scope_spans", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ScopeSpans")]),
    ("ScopeSpans", [("spans", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Span")]),
    ("Span", [("trace_id", 1, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
              ("span_id", 2, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
              ("name", 5, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
              ("kind", 6, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
              ("start_time_unix_nano", 7, _F.TYPE_FIXED64, _F.LABEL_OPTIONAL, None),
              ("end_time_unix_nano", 8, _F.TYPE_FIXED64, _F.LABEL_OPTIONAL, None),
              ("attributes", 9, _F.TYPE_BYTES, _F.LABEL_REPEATED, None),
              ("status", 15, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None)]),
)


def _message_classes() -> dict:
    file = descriptor_pb2.FileDescriptorProto(name="sloscope/otlp_lean_trace.proto", package=_PACKAGE,
                                              syntax="proto3")
    for name, fields in _MESSAGES:
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name, _ in _MESSAGES}


LeanTraceRequest = _message_classes()["ExportTraceServiceRequest"]

_KEY_TAG, _VALUE_TAG = 0x0A, 0x12  # KeyValue: field 1 (key), field 2 (value), both length-delimited
_CACHE_LIMIT = 50_000


class AttributeReader:
    """Selected span attributes from their encoded KeyValues. Each distinct encoding is looked at once: its
    key read without decoding it, and only a kept one decoded; after that it is a dictionary lookup."""

    def __init__(self, keys: frozenset[str], decode_value):
        self.keys = keys
        self._key_bytes = frozenset(k.encode() for k in keys)
        self._decode_value = decode_value  # AnyValue message -> Python value (may raise DecodeError)
        self._seen: dict[bytes, tuple[str, object] | None] = {}  # encoding -> (key, value), None: not kept

    def selected(self, encoded_items) -> dict:
        out, seen = {}, self._seen.get
        for item in encoded_items:
            decoded = seen(item, _UNSEEN)
            if decoded is _UNSEEN:
                decoded = self._first_sight(item)
            if decoded is not None:
                out[decoded[0]] = decoded[1]
        return out

    def _first_sight(self, item: bytes) -> tuple[str, object] | None:
        key = _plain_key(item)
        if key is not None and key not in self._key_bytes:
            decoded = None
        else:
            kv = KeyValue.FromString(item)
            decoded = (kv.key, self._decode_value(kv.value)) if kv.key in self.keys else None
        if len(self._seen) >= _CACHE_LIMIT:  # unique values (request ids, say) would grow it without end
            self._seen.clear()
        self._seen[item] = decoded
        return decoded


_UNSEEN = object()


def _plain_key(item: bytes) -> bytes | None:
    """The key of an encoded KeyValue when it is encoded plainly (key, then value, short lengths), else None."""
    if len(item) < 4 or item[0] != _KEY_TAG or item[1] >= 0x80:
        return None
    end = 2 + item[1]
    if len(item) <= end + 1 or item[end] != _VALUE_TAG or item[end + 1] >= 0x80 \
            or item[end + 1] != len(item) - end - 2:
        return None
    return item[2:end]


_STATUS_CODES = {b"": 0}


def status_code(encoded: bytes) -> int:
    code = _STATUS_CODES.get(encoded)
    if code is None:
        code = Status.FromString(encoded).code
        if len(_STATUS_CODES) < 1024:
            _STATUS_CODES[encoded] = code
    return code
