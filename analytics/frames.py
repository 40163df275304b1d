"""A decoded batch as data frames (requests in the shape of their table, points and histograms as received), and
the schemas the store's tables and the intake log share."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import polars as pl
import pyarrow as pa

from sloscope.analytics.ids import SPAN_WORDS, TRACE_WORDS, words_of_hex
from sloscope.records import Batch, SpanColumns, SpanTable


# Span fields as stored (times become start_time and duration_ms; ids are words, as analytics/ids.py says).
SPAN_SCHEMA = {"trace_hi": pl.UInt64, "trace_lo": pl.UInt64, "span_id": pl.UInt64, "service": pl.String,
               "node": pl.String, "gpu_id": pl.String, "pod": pl.String, "namespace": pl.String, "pod_ip": pl.String,
               "route": pl.String, "tier": pl.String, "status_code": pl.Int16, "failed": pl.Boolean}
REQUEST_KEY = ["trace_hi", "trace_lo", "span_id"]
REQUEST_COLUMNS = (*REQUEST_KEY, "start_time", "duration_ms", "service", "node", "pod", "namespace", "pod_ip",
                   "gpu_id", "tier", "route", "status_code", "failed")
POINT_SCHEMA = {"node": pl.String, "metric": pl.String, "attributes": pl.String, "is_sum": pl.Boolean,
                "cumulative": pl.Boolean, "start_ns": pl.Int64, "time_ns": pl.Int64, "value": pl.Float64}
HISTOGRAM_SCHEMA = {"node": pl.String, "metric": pl.String, "attributes": pl.String, "cumulative": pl.Boolean,
                    "start_ns": pl.Int64, "time_ns": pl.Int64, "count": pl.Int64, "sum": pl.Float64,
                    "min": pl.Float64, "max": pl.Float64, "buckets": pl.List(pl.Int64)}


@dataclass
class Frames:
    """A decoded batch as data frames: requests in the shape of their table, points and histograms as
    received (cumulative ones become deltas only when written, against the stored state)."""

    requests: pl.DataFrame
    points: pl.DataFrame
    histograms: pl.DataFrame

    @classmethod
    def of(cls, batch: Batch) -> "Frames":
        return cls(_requests(batch.spans), _frame(batch.points, POINT_SCHEMA),
                   _frame(batch.histograms, HISTOGRAM_SCHEMA))

    @classmethod
    def concat(cls, parts: list["Frames"]) -> "Frames":
        if not parts:
            return cls.of(Batch())
        return cls(*(pl.concat([getattr(p, f.name) for p in parts], rechunk=False) for f in fields(cls)))

    def __len__(self) -> int:
        return len(self.requests) + len(self.points) + len(self.histograms)


def _requests(spans: SpanColumns | SpanTable) -> pl.DataFrame:
    """Spans with resolved tiers in the shape of the requests table."""
    if isinstance(spans, SpanTable):
        return _requests_of_table(spans)
    start, end = np.array(spans.start_ns, dtype=np.int64), np.array(spans.end_ns, dtype=np.int64)
    trace, span = words_of_hex(spans.trace_id, TRACE_WORDS), words_of_hex(spans.span_id, SPAN_WORDS)
    columns = {"trace_hi": trace[:, 0], "trace_lo": trace[:, 1], "span_id": span[:, 0],
               "start_time": (start // 1000).astype("datetime64[us]"), "duration_ms": (end - start) / 1e6}
    return pl.DataFrame([pl.Series(name, columns[name], dtype=SPAN_SCHEMA.get(name)) if name in columns else
                         pl.Series(name, getattr(spans, name), dtype=SPAN_SCHEMA[name]) for name in REQUEST_COLUMNS])


def _requests_of_table(spans: SpanTable) -> pl.DataFrame:
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
