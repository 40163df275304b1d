"""The receiver's fast path for OTLP/protobuf trace requests: the spans, of every kind, read straight from the
request bytes into columns by a C extension (otlp_spans.c), with no Python object per span.

`span_table` gives None when the extension declines a request (an encoding other than the canonical one, or a
span the receiver would refuse) or was not built; the general path (otlp_proto.py) then does all the work. Both
give the same rows for every request they accept; tests/receiver/test_otlp_spans.py holds them to it.
"""

from __future__ import annotations

import pyarrow as pa

from sloscope import catalog
from sloscope.records import SpanTable

from sloscope.receiver.otlp_common import (CANONICAL_SERVICE_ATTRIBUTE, ENVOY_NODE_ATTRIBUTE, GPU_ATTRIBUTE,
                                           NAMESPACE_ATTRIBUTE, PEER_ATTRIBUTES, POD_ATTRIBUTE, POD_IP_ATTRIBUTE,
                                           ROUTE_ATTRIBUTE, STATUS_ATTRIBUTES, TIER_ATTRIBUTES)

try:
    from sloscope.receiver import _otlp_spans
except ImportError:  # installed where no C compiler was found: every request takes the general path
    _otlp_spans = None

# pyarrow imports pandas (over half a second) when it makes its first array: do that as the receiver loads, not
# while the first request waits.
pa.array([0])

# The attribute keys in otlp_spans.c's slot order.
SLOT_KEYS = tuple(key.encode() for key in (*catalog.NODE_ATTRIBUTES, GPU_ATTRIBUTE, POD_ATTRIBUTE,
                                           NAMESPACE_ATTRIBUTE, POD_IP_ATTRIBUTE, "service.name", *STATUS_ATTRIBUTES,
                                           ROUTE_ATTRIBUTE, *TIER_ATTRIBUTES, ENVOY_NODE_ATTRIBUTE,
                                           CANONICAL_SERVICE_ATTRIBUTE, *PEER_ATTRIBUTES))


def available() -> bool:
    return _otlp_spans is not None


def count_items(body: bytes, signal: int, maxima: tuple[int, int, int]) -> tuple[int, int, int, bool]:
    """(items, attributes, buckets, whether the walk read the whole body) of a protobuf export request, the walk
    stopped once one passes its maximum (request_items.py; only where available())."""
    return _otlp_spans.count(body, signal, maxima)


def span_table(body: bytes) -> SpanTable | None:
    """The request's spans, or None: take the general path."""
    if _otlp_spans is None:
        return None
    decoded = _otlp_spans.decode(body, SLOT_KEYS)
    if decoded is None:
        return None
    columns = decoded["columns"]

    def batch(tiers: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch._import_from_c_capsule(*_otlp_spans.batch(columns, tiers))

    return SpanTable(decoded["rows"], decoded["tier_headers"], decoded["tier_counts"], batch)
