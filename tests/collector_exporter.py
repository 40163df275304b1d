"""The rows the clickhouseexporter inserts for an OTLP/JSON metrics request of gauges, sums and explicit-bucket
histograms, from its documented mapping: each data point one row, the resource's and the point's attributes as they came (values as text), the
metric's temporality and monotonicity as they came. Unlike `sloscope ingest`, nothing of sloscope's catalog is
applied: what a Collector wrote is what sloscope's queries must read by its rules."""

import pyarrow as pa

from analytics.exporter_tables import GAUGE, HISTOGRAM, MAP_TYPE, NS, SUM, attribute_text


def _attributes(items: list[dict]) -> list[tuple[str, str]]:
    return [(item["key"], attribute_text(_value(item["value"]))) for item in items]


def _value(value: dict):
    (kind, raw), = value.items()
    return int(raw) if kind == "intValue" else raw


def rows(request: dict) -> dict[str, pa.Table]:
    """table -> the rows the exporter inserts there for `request`."""
    out = {GAUGE: [], SUM: [], HISTOGRAM: []}
    for block in request["resourceMetrics"]:
        resource = _attributes(block["resource"]["attributes"])
        for scope in block["scopeMetrics"]:
            for metric in scope["metrics"]:
                table = next(t for key, t in (("gauge", GAUGE), ("sum", SUM), ("histogram", HISTOGRAM)) if key in metric)
                data = metric[{GAUGE: "gauge", SUM: "sum", HISTOGRAM: "histogram"}[table]]
                for point in data["dataPoints"]:
                    row = {"ResourceAttributes": resource, "MetricName": metric["name"],
                           "Attributes": _attributes(point["attributes"]),
                           "StartTimeUnix": int(point.get("startTimeUnixNano", 0)),
                           "TimeUnix": int(point["timeUnixNano"])}
                    if table == HISTOGRAM:
                        row |= {"Count": int(point["count"]), "Sum": float(point.get("sum", 0.0)),
                                "BucketCounts": [int(c) for c in point["bucketCounts"]],
                                "ExplicitBounds": point["explicitBounds"],
                                "AggregationTemporality": data["aggregationTemporality"]}
                    else:
                        row["Value"] = float(point["asDouble"] if "asDouble" in point else point["asInt"])
                    if table == SUM:
                        row |= {"AggregationTemporality": data["aggregationTemporality"],
                                "IsMonotonic": data.get("isMonotonic", False)}
                    out[table].append(row)
    return {table: _table(found) for table, found in out.items() if found}


def _table(found: list[dict]) -> pa.Table:
    types = {"ResourceAttributes": MAP_TYPE, "Attributes": MAP_TYPE, "StartTimeUnix": NS, "TimeUnix": NS,
             "Value": pa.float64(), "MetricName": pa.string(), "AggregationTemporality": pa.int32(),
             "IsMonotonic": pa.bool_(), "Count": pa.uint64(), "Sum": pa.float64(),
             "BucketCounts": pa.list_(pa.uint64()), "ExplicitBounds": pa.list_(pa.float64())}
    return pa.table({name: pa.array([row[name] for row in found], types[name]) for name in found[0]})
