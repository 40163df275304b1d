"""The receiver's fast path for OTLP/protobuf trace requests: the spans, of every kind, read straight from the
request bytes into columns by a C extension (otlp_spans.c), with no Python object per span.

`spans_and_counts` gives None when the extension declines a request (an encoding other than the canonical one, a
span the receiver would refuse, a token timing only the general path reads) or was not built; the general path
(otlp_proto.py) then does all the work. Both give the same rows and decoding counts for every request they
accept; tests/receiver/test_otlp_spans.py and test_token_timings_fast_path.py hold them to it.
"""

from __future__ import annotations

import pyarrow as pa

from sloscope import catalog
from sloscope.records import SpanTable

from sloscope.receiver import token_timings
from sloscope.receiver.otlp_common import (CANONICAL_SERVICE_ATTRIBUTE, ENVOY_NODE_ATTRIBUTE, GPU_ATTRIBUTE,
                                           NAMESPACE_ATTRIBUTE, PEER_ATTRIBUTES, POD_ATTRIBUTE, POD_IP_ATTRIBUTE,
                                           ROUTE_ATTRIBUTE, STATUS_ATTRIBUTES, TIER_ATTRIBUTES)
from sloscope.receiver.token_timings import (ABSENT, DECODE_ATTRIBUTES, INVALID, MODEL_ATTRIBUTES,
                                             OUTPUT_TOKEN_ATTRIBUTES, PROMPT_TOKEN_ATTRIBUTES, QUEUE_ATTRIBUTES,
                                             TPOT_ATTRIBUTES, TTFT_ATTRIBUTES)

try:
    from sloscope.receiver import _otlp_spans
except ImportError:  # installed where no C compiler was found: every request takes the general path
    _otlp_spans = None

# pyarrow imports pandas (over half a second) when it makes its first array: do that as the receiver loads, not
# while the first request waits.
pa.array([0])

# The token timings' groups of attribute keys, in otlp_spans.c's TokenGroup order (TG_TTFT, ...): each is read
# from the first of its keys a span gives, as token_timings.py reads them.
TOKEN_GROUPS = (TTFT_ATTRIBUTES, QUEUE_ATTRIBUTES, TPOT_ATTRIBUTES, DECODE_ATTRIBUTES, PROMPT_TOKEN_ATTRIBUTES,
                OUTPUT_TOKEN_ATTRIBUTES, MODEL_ATTRIBUTES)
# The attribute keys in otlp_spans.c's slot order: the eighteen of its SLOT_* enum, then each token group's keys in
# turn, in the group's own order; the extension takes the groups' sizes (TOKEN_GROUP_SIZES) to tell them apart.
# So a key added to a group in token_timings.py needs nothing here or in C, as long as all the keys number at
# most 64 (_otlp_spans.MAX_SLOTS: the bits of its slot masks).
BASE_KEYS = (*catalog.NODE_ATTRIBUTES, GPU_ATTRIBUTE, POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE, POD_IP_ATTRIBUTE,
             "service.name", *STATUS_ATTRIBUTES, ROUTE_ATTRIBUTE, *TIER_ATTRIBUTES, ENVOY_NODE_ATTRIBUTE,
             CANONICAL_SERVICE_ATTRIBUTE, *PEER_ATTRIBUTES)
SLOT_KEYS = tuple(key.encode() for key in (*BASE_KEYS, *(key for group in TOKEN_GROUPS for key in group)))
TOKEN_GROUP_SIZES = tuple(len(group) for group in TOKEN_GROUPS)


def _built_for_these_token_timings(module) -> bool:
    """Whether the extension reads token timings with token_timings.py's bounds and can take all the keys (an
    extension built from an older otlp_spans.c reads none: the general path is right where it is not)."""
    return (getattr(module, "SLACK_MS", None) == token_timings.SLACK_MS
            and getattr(module, "MAX_TOKENS", None) == token_timings.MAX_TOKENS
            and getattr(module, "MAX_MODEL_LENGTH", None) == token_timings.MAX_MODEL_LENGTH
            and len(SLOT_KEYS) <= getattr(module, "MAX_SLOTS", 0))


if _otlp_spans is not None and not _built_for_these_token_timings(_otlp_spans):
    _otlp_spans = None  # tests/receiver/test_otlp_spans.py's test_the_extension_is_built says so


def available() -> bool:
    return _otlp_spans is not None


def count_items(body: bytes, signal: int, maxima: tuple[int, int, int]) -> tuple[int, int, int, bool]:
    """(items, attributes, buckets, whether the walk read the whole body) of a protobuf export request, the walk
    stopped once one passes its maximum (request_items.py; only where available())."""
    return _otlp_spans.count(body, signal, maxima)


def spans_and_counts(body: bytes) -> tuple[SpanTable, dict[str, int]] | None:
    """The request's spans and its decoding counts (as the general path's `skipped`: token_timings' INVALID and
    ABSENT, where any span counts into them), or None: take the general path."""
    if _otlp_spans is None:
        return None
    decoded = _otlp_spans.decode(body, SLOT_KEYS, TOKEN_GROUP_SIZES)
    if decoded is None:
        return None
    columns = decoded["columns"]

    def batch(tiers: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch._import_from_c_capsule(*_otlp_spans.batch(columns, tiers))

    counts = {name: n for name, n in zip((INVALID, ABSENT), decoded["token_timings"]) if n}
    return SpanTable(decoded["rows"], decoded["tier_headers"], decoded["tier_counts"], batch), counts

