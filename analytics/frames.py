"""A decoded batch as data frames (spans of every kind in one frame, points and histograms as received), and the
schemas the store's tables and the intake log share."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import polars as pl
import pyarrow as pa

from sloscope.analytics.ids import SPAN_WORDS, TRACE_WORDS, words_of_hex
from sloscope.records import SPAN_KIND_SERVER, Batch, SpanColumns, SpanTable


# Span fields as stored (times become start_time and duration_ms; ids are words, as analytics/ids.py says).
SPAN_SCHEMA = {"trace_hi": pl.UInt64, "trace_lo": pl.UInt64, "span_id": pl.UInt64, "parent_id": pl.UInt64,
               "kind": pl.UInt8, "service": pl.String, "node": pl.String, "gpu_id": pl.String, "pod": pl.String,
               "namespace": pl.String, "pod_ip": pl.String, "route": pl.String, "tier": pl.String,
               "status_code": pl.Int16, "failed": pl.Boolean, "peer": pl.String, "model": pl.String,
               "ttft_ms": pl.Float64, "tpot_ms": pl.Float64, "queue_ms": pl.Float64, "prompt_tokens": pl.Int64,
               "output_tokens": pl.Int64}
REQUEST_KEY = ["trace_hi", "trace_lo", "span_id"]
# The frame's columns, in the order of the receiver's fast path (receiver/otlp_spans.c). The SERVER spans are
# the requests table's rows (REQUEST_COLUMNS); the others the spans table's (GRAPH_COLUMNS), which keeps of them
# what the trace graph needs.
TOKEN_COLUMNS = ("model", "ttft_ms", "tpot_ms", "queue_ms", "prompt_tokens", "output_tokens")  # inference requests'
SPAN_COLUMNS = (*REQUEST_KEY, "parent_id", "kind", "start_time", "duration_ms", "service", "node", "pod",
                "namespace", "pod_ip", "gpu_id", "tier", "route", "status_code", "failed", "peer", *TOKEN_COLUMNS)
REQUEST_COLUMNS = tuple(c for c in SPAN_COLUMNS if c not in ("kind", "peer"))
GRAPH_COLUMNS = (*REQUEST_KEY, "parent_id", "kind", "start_time", "duration_ms", "service", "node", "pod", "tier",
                 "failed", "peer")
# What a frame of an earlier intake-log record lacks: it held SERVER spans only, with no parents, then no token
# timings.
SPAN_DEFAULTS = {"parent_id": None, "kind": SPAN_KIND_SERVER, "peer": None, **dict.fromkeys(TOKEN_COLUMNS)}
POINT_SCHEMA = {"node": pl.String, "metric": pl.String, "attributes": pl.String, "is_sum": pl.Boolean,
                "cumulative": pl.Boolean, "start_ns": pl.Int64, "time_ns": pl.Int64, "value": pl.Float64}
HISTOGRAM_SCHEMA = {"node": pl.String, "metric": pl.String, "attributes": pl.String, "cumulative": pl.Boolean,
                    "start_ns": pl.Int64, "time_ns": pl.Int64, "count": pl.Int64, "sum": pl.Float64,
                    "min": pl.Float64, "max": pl.Float64, "buckets": pl.List(pl.Int64)}


@dataclass
class Frames:
    """A decoded batch as data frames: spans of every kind (SPAN_COLUMNS), points and histograms as received
    (cumulative ones become deltas only when written, against the stored state)."""

    spans: pl.DataFrame
    points: pl.DataFrame
    histograms: pl.DataFrame

    @classmethod
    def of(cls, batch: Batch) -> "Frames":
        return cls(_spans(batch.spans), _frame(batch.points, POINT_SCHEMA),
                   _frame(batch.histograms, HISTOGRAM_SCHEMA))

    @classmethod
    def concat(cls, parts: list["Frames"]) -> "Frames":
        if not parts:
            return cls.of(Batch())
        return cls(*(pl.concat([getattr(p, f.name) for p in parts], rechunk=False) for f in fields(cls)))

    def __len__(self) -> int:
        return len(self.spans) + len(self.points) + len(self.histograms)

    @property
    def requests(self) -> pl.DataFrame:
        """The SERVER spans, in the requests table's shape."""
        return self.spans.filter(pl.col("kind") == SPAN_KIND_SERVER).select(REQUEST_COLUMNS)

    @property
    def graph_spans(self) -> pl.DataFrame:
        """The spans of other kinds, in the spans table's shape."""
        return self.spans.filter(pl.col("kind") != SPAN_KIND_SERVER).select(GRAPH_COLUMNS)


def with_span_defaults(spans: pl.DataFrame) -> pl.DataFrame:
    """A spans frame of an earlier intake-log record (SERVER spans without parents or token timings) in
    SPAN_COLUMNS."""
    missing = [pl.lit(value, SPAN_SCHEMA[name]).alias(name) for name, value in SPAN_DEFAULTS.items()
               if name not in spans.columns]
    return spans.with_columns(missing).select(SPAN_COLUMNS) if missing else spans


def _spans(spans: SpanColumns | SpanTable) -> pl.DataFrame:
    """Spans with resolved tiers in SPAN_COLUMNS."""
    if isinstance(spans, SpanTable):
        return _spans_of_table(spans)
    start, end = np.array(spans.start_ns, dtype=np.int64), np.array(spans.end_ns, dtype=np.int64)
    trace, span = words_of_hex(spans.trace_id, TRACE_WORDS), words_of_hex(spans.span_id, SPAN_WORDS)
    columns = {"trace_hi": trace[:, 0], "trace_lo": trace[:, 1], "span_id": span[:, 0],
               "parent_id": _parent_words(spans.parent_id),
               "start_time": (start // 1000).astype("datetime64[us]"), "duration_ms": (end - start) / 1e6}
    return pl.DataFrame([pl.Series(name, columns[name], dtype=SPAN_SCHEMA.get(name)) if name in columns else
                         pl.Series(name, getattr(spans, name), dtype=SPAN_SCHEMA[name]) for name in SPAN_COLUMNS])


def _parent_words(parents: list) -> pl.Series:
    """Parent span ids (hex, None for a root) as words, null for a root."""
    words = pl.Series(words_of_hex([p or "0" * 16 for p in parents], SPAN_WORDS)[:, 0], dtype=pl.UInt64)
    return pl.select(pl.when(pl.Series([p is not None for p in parents], dtype=pl.Boolean)).then(words)).to_series()


def _spans_of_table(spans: SpanTable) -> pl.DataFrame:
    """The fast path's record batch, which polars takes through the Arrow stream interface in one call (a
    Series per column, or pl.from_arrow, costs two to three times as much per request)."""
    return pl.DataFrame(_ArrowStream(spans.batch(spans.tiers)))


class _ArrowStream:
    """Only the Arrow PyCapsule stream interface of a record batch: polars converts a pyarrow object through
    its Python-level path, but a stream in Rust."""

    __slots__ = ("batch",)

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch

    def __arrow_c_stream__(self, requested_schema=None):
        return self.batch.__arrow_c_stream__(requested_schema)


_EMPTY: dict[int, pl.DataFrame] = {}


def _frame(columns, schema: dict) -> pl.DataFrame:
    """A request carries one signal: the other kinds' empty frames are shared (building one costs as much as
    converting a thousand spans)."""
    if len(columns):
        return pl.DataFrame(columns.as_dict(), schema=schema)
    if id(schema) not in _EMPTY:
        _EMPTY[id(schema)] = pl.DataFrame(schema=schema)
    return _EMPTY[id(schema)]
