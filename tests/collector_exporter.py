"""The rows the clickhouseexporter inserts for an OTLP/JSON export request, from its documented mapping: each span
and each data point one row, the resource's and the item's attributes as they came (values as text), span kinds
and status codes by name, metric temporality and monotonicity as they came. Unlike `sloscope ingest`, nothing of
sloscope's catalog is applied: what a Collector wrote is what sloscope's queries must read by its rules."""

import gzip
import json
from pathlib import Path

import pyarrow as pa

from sloscope.analytics.exporter_tables import (EXP_HISTOGRAM, GAUGE, HISTOGRAM, MAP_TYPE, NS, SUM, TRACES,
                                                attribute_text)

SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
STATUS_CODES = ("Unset", "Ok", "Error")
KINDS = {"gauge": GAUGE, "sum": SUM, "histogram": HISTOGRAM, "exponentialHistogram": EXP_HISTOGRAM}
TYPES = {"ResourceAttributes": MAP_TYPE, "SpanAttributes": MAP_TYPE, "Attributes": MAP_TYPE, "Timestamp": NS,
         "StartTimeUnix": NS, "TimeUnix": NS, "Duration": pa.uint64(), "Value": pa.float64(), "Count": pa.uint64(),
         "Sum": pa.float64(), "Min": pa.float64(), "Max": pa.float64(), "Scale": pa.int32(),
         "ZeroCount": pa.uint64(), "PositiveOffset": pa.int32(), "PositiveBucketCounts": pa.list_(pa.uint64()),
         "NegativeOffset": pa.int32(), "NegativeBucketCounts": pa.list_(pa.uint64()),
         "BucketCounts": pa.list_(pa.uint64()), "ExplicitBounds": pa.list_(pa.float64()),
         "AggregationTemporality": pa.int32(), "IsMonotonic": pa.bool_(), "Flags": pa.uint32()}


def _attributes(items: list[dict]) -> list[tuple[str, str]]:
    return [(item["key"], attribute_text(_value(item["value"]))) for item in items or []]


def _value(value: dict):
    if not value:
        return None
    (kind, raw), = value.items()
    if kind == "intValue":
        return int(raw)
    if kind == "arrayValue":
        return [_value(v) for v in raw.get("values", [])]
    if kind == "kvlistValue":
        return {item["key"]: _value(item["value"]) for item in raw.get("values", [])}
    return raw


def _service(resource: list[tuple[str, str]]) -> str:
    return dict(resource).get("service.name", "")


def rows(request: dict) -> dict[str, pa.Table]:
    """table -> the rows the exporter inserts there for `request`."""
    out: dict[str, list[dict]] = {}
    for block in request.get("resourceSpans", []):
        resource = _attributes(block["resource"].get("attributes"))
        for scope in block["scopeSpans"]:
            out.setdefault(TRACES, []).extend(_span(resource, span) for span in scope["spans"])
    for block in request.get("resourceMetrics", []):
        resource = _attributes(block["resource"].get("attributes"))
        for scope in block["scopeMetrics"]:
            for metric in scope["metrics"]:
                key = next(k for k in KINDS if k in metric)
                out.setdefault(KINDS[key], []).extend(
                    _point(resource, metric["name"], key, metric[key], point) for point in metric[key]["dataPoints"])
    return {table: _table(found) for table, found in out.items() if found}


def rows_of_files(files: list[Path]) -> dict[str, pa.Table]:
    """table -> the rows the exporter inserts for every request of these OTLP/JSON files (gzip recognised)."""
    found: dict[str, list[pa.Table]] = {}
    for path in files:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as lines:
            for line in lines:
                for table, data in rows(json.loads(line)).items():
                    found.setdefault(table, []).append(data)
    return {table: pa.concat_tables(parts, promote_options="default") for table, parts in found.items()}


def _span(resource, span: dict) -> dict:
    start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
    return {"Timestamp": start, "TraceId": span["traceId"], "SpanId": span["spanId"],
            "ParentSpanId": span.get("parentSpanId", ""), "SpanName": span["name"],
            "SpanKind": SPAN_KINDS[span.get("kind", 0)], "ServiceName": _service(resource),
            "ResourceAttributes": resource, "SpanAttributes": _attributes(span.get("attributes")),
            "Duration": end - start, "StatusCode": STATUS_CODES[span.get("status", {}).get("code", 0)]}


def _point(resource, name: str, kind: str, data: dict, point: dict) -> dict:
    row = {"ResourceAttributes": resource, "ServiceName": _service(resource), "MetricName": name,
           "Attributes": _attributes(point.get("attributes")), "StartTimeUnix": int(point.get("startTimeUnixNano", 0)),
           "TimeUnix": int(point["timeUnixNano"]), "Flags": int(point.get("flags", 0))}
    if kind in ("gauge", "sum"):
        row["Value"] = float(point["asDouble"] if "asDouble" in point else point["asInt"])
    else:
        row |= {"Count": int(point["count"]), "Sum": float(point.get("sum", 0.0)),
                "Min": float(point.get("min", 0.0)), "Max": float(point.get("max", 0.0))}
    if kind == "histogram":
        row |= {"BucketCounts": [int(c) for c in point["bucketCounts"]], "ExplicitBounds": point["explicitBounds"]}
    if kind == "exponentialHistogram":
        positive, negative = point.get("positive", {}), point.get("negative", {})
        row |= {"Scale": point.get("scale", 0), "ZeroCount": int(point.get("zeroCount", 0)),
                "PositiveOffset": positive.get("offset", 0),
                "PositiveBucketCounts": [int(c) for c in positive.get("bucketCounts", [])],
                "NegativeOffset": negative.get("offset", 0),
                "NegativeBucketCounts": [int(c) for c in negative.get("bucketCounts", [])]}
    if kind != "gauge":
        row["AggregationTemporality"] = data["aggregationTemporality"]
    if kind == "sum":
        row["IsMonotonic"] = data.get("isMonotonic", False)
    return row


def _table(found: list[dict]) -> pa.Table:
    return pa.table({name: pa.array([row[name] for row in found], TYPES.get(name, pa.string())) for name in found[0]})
