"""The receiver's fast path for OTLP/protobuf trace requests: the SERVER spans read straight from the request
bytes into columns by a C extension (otlp_spans.c), with no Python object per span.

`span_table` gives None when the extension declines a request (an encoding other than the canonical one, or a
span the receiver would refuse) or was not built; the general path (otlp_proto.py) then does all the work. Both
give the same rows for every request they accept; tests/test_otlp_spans.py holds them to it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sloscope import catalog
from sloscope.records import SpanTable

from receiver.otlp_common import (
    CANONICAL_SERVICE_ATTRIBUTE, ENVOY_NODE_ATTRIBUTE, GPU_ATTRIBUTE, NAMESPACE_ATTRIBUTE, POD_ATTRIBUTE,
    POD_IP_ATTRIBUTE, ROUTE_ATTRIBUTE, STATUS_ATTRIBUTES, TIER_ATTRIBUTES)

try:
    from receiver import _otlp_spans
except ImportError:  # installed where no C compiler was found: every request takes the general path
    _otlp_spans = None

# pyarrow imports pandas (over half a second) when it makes its first array: do that as the receiver loads, not
# while the first request waits.
pa.array([0])

# The attribute keys in otlp_spans.c's slot order.
SLOT_KEYS = tuple(key.encode() for key in (*catalog.NODE_ATTRIBUTES, GPU_ATTRIBUTE, POD_ATTRIBUTE,
                                           NAMESPACE_ATTRIBUTE, POD_IP_ATTRIBUTE, "service.name", *STATUS_ATTRIBUTES,
                                           ROUTE_ATTRIBUTE, *TIER_ATTRIBUTES, ENVOY_NODE_ATTRIBUTE,
                                           CANONICAL_SERVICE_ATTRIBUTE))
ID_COLUMNS = ("trace_hi", "trace_lo", "span_id")  # sloscope/ids.py
TEXT_COLUMNS = ("service", "node", "gpu_id", "pod", "namespace", "pod_ip", "route")


def available() -> bool:
    return _otlp_spans is not None


def span_table(body: bytes) -> tuple[SpanTable, int] | None:
    """(the SERVER spans, how many spans were not SERVER spans), or None: take the general path."""
    if _otlp_spans is None:
        return None
    decoded = _otlp_spans.decode(body, SLOT_KEYS)
    if decoded is None:
        return None
    rows = decoded["rows"]
    columns = {
        **{name: np.frombuffer(decoded[name], np.uint64) for name in ID_COLUMNS},
        **{name: _string_array(*decoded[name], rows) for name in TEXT_COLUMNS},
        "tier_header": pa.DictionaryArray.from_arrays(np.frombuffer(decoded["tier_header"], np.int32),
                                                      pa.array(decoded["tier_headers"], pa.large_string())),
        "start_ns": np.frombuffer(decoded["start_ns"], np.int64),
        "end_ns": np.frombuffer(decoded["end_ns"], np.int64),
        "status_code": pa.array(np.frombuffer(decoded["status_code"], np.int16),
                                mask=~np.frombuffer(decoded["status_valid"], np.bool_)),
        "failed": np.frombuffer(decoded["failed"], np.bool_),
    }
    return SpanTable(columns), decoded["not_server"]


def _string_array(views: bytes, data: bytes, valid: bytes, rows: int) -> pa.Array:
    validity = np.packbits(np.frombuffer(valid, np.bool_), bitorder="little")
    return pa.Array.from_buffers(pa.string_view(), rows, [pa.py_buffer(validity), pa.py_buffer(views),
                                                          pa.py_buffer(data)])

