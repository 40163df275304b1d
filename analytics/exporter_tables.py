"""Decoded frames as rows of the clickhouseexporter's tables (analytics/sql/clickhouse/exporter_tables.sql).

The exporter writes every attribute value as text, as pcommon's Value.AsString renders it: strings as they are,
booleans as true/false, integers in decimal, doubles as JSON numbers, lists and maps as their JSON. Spans carry
the tier already resolved by enrich/tiers.py (an allowed tier resolves to itself, so the query's tier rules give
the same answer), the node in the resource's k8s.node.name, and their route as the span name.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from sloscope.analytics.ids import hex_of_words
from sloscope.records import HISTOGRAM_OFFSET

from sloscope.analytics.frames import Frames

TRACES, GAUGE, SUM, EXP_HISTOGRAM, HISTOGRAM = ("otel_traces", "otel_metrics_gauge", "otel_metrics_sum",
                                                "otel_metrics_exponential_histogram", "otel_metrics_histogram")
READ_TABLES = (TRACES, GAUGE, SUM)
# The times a DateTime64(9) column holds (the exporter's): a bound outside them overflows in the comparison.
FIRST_TIME, LAST_TIME = datetime(1900, 1, 1), datetime(2262, 4, 11, 23, 47, 16)
# Read where present: sloscope before 0.5.8 made no explicit-bucket histogram table, and a Collector run with
# `create_schema: false` has only the tables its administrator made (no exponential histograms where no producer
# sends them). Where one is absent, its queries read no rows of these columns instead.
_POINT_COLUMNS = {
    "ResourceAttributes": "Map(LowCardinality(String), String)", "MetricName": "String",
    "Attributes": "Map(LowCardinality(String), String)", "StartTimeUnix": "DateTime64(9)", "TimeUnix": "DateTime64(9)",
    "Count": "UInt64", "Sum": "Float64", "Flags": "UInt32", "AggregationTemporality": "Int32"}
OPTIONAL_TABLES = {
    HISTOGRAM: {**_POINT_COLUMNS, "BucketCounts": "Array(UInt64)", "ExplicitBounds": "Array(Float64)"},
    EXP_HISTOGRAM: {**_POINT_COLUMNS, "Scale": "Int32", "ZeroCount": "UInt64", "PositiveOffset": "Int32",
                    "PositiveBucketCounts": "Array(UInt64)"}}
# The exporter's settings that name its tables (its config.go), as a store URL's query takes them: each table by
# its own setting, or the metric tables by the older `metrics_table_name` prefix, which the exporter refuses beside
# `metrics_tables`.
TABLE_SETTINGS = {"traces_table_name": TRACES, "metrics_tables.gauge.name": GAUGE, "metrics_tables.sum.name": SUM,
                  "metrics_tables.histogram.name": HISTOGRAM,
                  "metrics_tables.exponential_histogram.name": EXP_HISTOGRAM}
METRICS_PREFIX_SETTING, DEFAULT_METRICS_PREFIX = "metrics_table_name", "otel_metrics"
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
TEMPORALITY = {False: 1, True: 2}  # OTLP's AggregationTemporality: delta, cumulative
MAP_TYPE = pa.map_(pa.string(), pa.string())
NS = pa.timestamp("ns")


def table_names(settings: dict[str, str]) -> dict[str, str]:
    """Default table name -> the name the exporter's settings give it; ValueError says which setting is wrong."""
    unknown = sorted(set(settings) - set(TABLE_SETTINGS) - {METRICS_PREFIX_SETTING})
    if unknown:
        raise ValueError(f"unknown setting {', '.join(unknown)} (the exporter's table settings: "
                         f"{', '.join([*TABLE_SETTINGS, METRICS_PREFIX_SETTING])})")
    for key, name in settings.items():
        if not TABLE_NAME.fullmatch(name):
            raise ValueError(f"{key}={name!r}: a table name is a letter or _, then letters, digits and _")
    prefix = settings.get(METRICS_PREFIX_SETTING)
    if prefix is not None and any(key.startswith("metrics_tables.") for key in settings):
        raise ValueError(f"{METRICS_PREFIX_SETTING} is the exporter's older setting: give it or metrics_tables.*, "
                         "not both")
    names = {default: settings.get(key, default) for key, default in TABLE_SETTINGS.items()}
    if prefix is not None:
        names.update({default: prefix + default.removeprefix(DEFAULT_METRICS_PREFIX) for default in names
                      if default != TRACES})
    if len(set(names.values())) < len(names):
        raise ValueError("two of the exporter's tables are given one name")
    return names


def renaming(names: dict[str, str]):
    """A function of SQL text written with the default table names that gives it with `names` (table_names)."""
    changed = {default: name for default, name in names.items() if name != default}
    if not changed:
        return lambda text: text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, changed)) + r")\b")
    return lambda text: pattern.sub(lambda m: changed[m.group(1)], text)


def attribute_text(value) -> str:
    """An attribute value as the exporter stores it in a Map(String, String)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_number(value)
    if value is None:
        return ""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _json_number(value: float) -> str:
    """As ES6 (and Go's encoding/json) render a double: integral values without a fraction, exponents from 1e21."""
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{'-' if exponent.startswith('-') else '+'}{exponent.lstrip('+-').lstrip('0') or '0'}"
    return text


def _keyed_map(columns: dict[str, pl.Series]) -> pa.Array:
    """A Map column from one nullable text column per key: each row holds the keys whose value it has."""
    keys = list(columns)
    if not keys:
        return pa.array([], MAP_TYPE)
    values = np.stack([columns[k].cast(pl.String).to_numpy().astype(object) for k in keys], axis=1)
    present = np.vectorize(lambda v: v is not None, otypes=[bool])(values)
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    names = np.broadcast_to(np.array(keys, dtype=object), values.shape)
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(names[present], pa.string()),
                                   pa.array(values[present], pa.string()))


def _json_maps(texts: pl.Series) -> pa.Array:
    """A Map column from canonical JSON attribute texts, each distinct text converted once."""
    distinct = texts.unique().sort()
    index = texts.rank("dense").cast(pl.Int64) - 1  # the position of each row's text in `distinct`
    parsed = [orjson.loads(t) for t in distinct.to_list()]
    maps = pa.array([[(k, attribute_text(v)) for k, v in p.items()] for p in parsed], MAP_TYPE)
    return maps.take(index.to_arrow())


def _node_resource(nodes: pl.Series) -> pa.Array:
    return _keyed_map({"k8s.node.name": nodes})


# The exporter's names of OTLP's span kinds (ptrace.SpanKind's String).
KIND_NAMES = {0: "Unspecified", 1: "Internal", 2: "Server", 3: "Client", 4: "Producer", 5: "Consumer"}


def traces(spans: pl.DataFrame) -> pa.Table:
    r = spans
    start_ns = r["start_time"].dt.cast_time_unit("ns").cast(pl.Int64).to_numpy()
    status = r["status_code"].cast(pl.Int64).cast(pl.String)
    return pa.table({
        "Timestamp": pa.array(start_ns, pa.int64()).cast(NS),
        "TraceId": hex_of_words(r["trace_hi"].to_numpy(), r["trace_lo"].to_numpy()),
        "SpanId": hex_of_words(r["span_id"].to_numpy()),
        "ParentSpanId": _parent_ids(r["parent_id"]),
        "SpanName": r["route"].fill_null("").to_arrow(),
        "SpanKind": r["kind"].replace_strict(KIND_NAMES, return_dtype=pl.String).to_arrow(),
        "ServiceName": r["service"].to_arrow(),
        "ResourceAttributes": _keyed_map({"service.name": r["service"], "k8s.node.name": r["node"],
                                          "k8s.pod.name": r["pod"], "k8s.namespace.name": r["namespace"],
                                          "k8s.pod.ip": r["pod_ip"]}),
        "SpanAttributes": _keyed_map({"http.request.header.x-slo-tier": r["tier"], "http.route": r["route"],
                                      "http.response.status_code": status, "hw.id": r["gpu_id"],
                                      "peer.service": r["peer"], **_token_attributes(r)}),
        "Duration": pa.array(np.rint(r["duration_ms"].to_numpy() * 1e6).astype(np.uint64), pa.uint64()),
        "StatusCode": pa.array(np.where(r["failed"].to_numpy(), "Error", "Unset"), pa.string()),
    })


def _token_attributes(r: pl.DataFrame) -> dict[str, pl.Series]:
    """An inference request's token timings under vLLM's and the GenAI conventions' names, in seconds as vLLM
    writes them; TPOT as given, since it may have been derived from attributes not kept (the decode time)."""
    seconds = {"gen_ai.latency.time_to_first_token": "ttft_ms", "gen_ai.latency.time_in_queue": "queue_ms",
               "time_per_token": "tpot_ms"}
    return {"gen_ai.response.model": r["model"], "gen_ai.usage.input_tokens": r["prompt_tokens"],
            "gen_ai.usage.output_tokens": r["output_tokens"],
            **{key: r[column] / 1e3 for key, column in seconds.items()}}


def _parent_ids(parents: pl.Series) -> pa.Array:
    """ParentSpanId as the exporter writes it: the id's hex, empty for a root."""
    known = hex_of_words(parents.fill_null(0).to_numpy())
    return pc.if_else(parents.is_not_null().to_arrow(), known, pa.scalar("", pa.string()))


def _metric_columns(frame: pl.DataFrame) -> dict:
    return {
        "ResourceAttributes": _node_resource(frame["node"]),
        "MetricName": frame["metric"].to_arrow(),
        "Attributes": _json_maps(frame["attributes"]),
        "StartTimeUnix": frame["start_ns"].fill_null(0).to_arrow().cast(pa.int64()).cast(NS),
        "TimeUnix": frame["time_ns"].to_arrow().cast(pa.int64()).cast(NS),
    }


def gauges(points: pl.DataFrame) -> pa.Table:
    frame = points.filter(~pl.col("is_sum"))
    return pa.table({**_metric_columns(frame), "Value": frame["value"].to_arrow()})


def sums(points: pl.DataFrame) -> pa.Table:
    frame = points.filter(pl.col("is_sum"))
    return pa.table({**_metric_columns(frame), "Value": frame["value"].to_arrow(),
                     "AggregationTemporality": frame["cumulative"].replace_strict(TEMPORALITY, return_dtype=pl.Int32)
                     .to_arrow(),
                     "IsMonotonic": pa.array([True] * len(frame), pa.bool_())})


def exponential_histograms(histograms: pl.DataFrame) -> pa.Table:
    """Histograms as decoded: at scale 0 over the store's fixed range, the zero bucket folded into the first."""
    h = histograms
    return pa.table({
        **_metric_columns(h),
        "Count": h["count"].cast(pl.UInt64).to_arrow(), "Sum": h["sum"].to_arrow(),
        "Scale": pa.array([0] * len(h), pa.int32()),
        "PositiveOffset": pa.array([HISTOGRAM_OFFSET] * len(h), pa.int32()),
        "PositiveBucketCounts": h["buckets"].cast(pl.List(pl.UInt64)).to_arrow(),
        "Min": h["min"].fill_null(0.0).to_arrow(), "Max": h["max"].fill_null(0.0).to_arrow(),
        "AggregationTemporality": h["cumulative"].replace_strict(TEMPORALITY, return_dtype=pl.Int32).to_arrow(),
    })


def tables_of(frames: Frames) -> list[tuple[str, pa.Table]]:
    """(table, rows) for each exporter table the frames have rows for."""
    out = []
    if not frames.spans.is_empty():
        out.append((TRACES, traces(frames.spans)))
    if not frames.points.is_empty():
        out += [(GAUGE, gauges(frames.points)), (SUM, sums(frames.points))]
    if not frames.histograms.is_empty():
        out.append((EXP_HISTOGRAM, exponential_histograms(frames.histograms)))
    return out
