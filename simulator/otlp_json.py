"""OTLP/JSON encoding, as the OpenTelemetry Collector's file exporter writes it: one
ExportMetricsServiceRequest / ExportTracesServiceRequest object per line, lowerCamelCase keys, 64-bit
integers as decimal strings, enums as integers, trace/span ids as lowercase hex.

Lines are assembled from pre-built string templates (one per series and segment), so a data point costs one
`%` formatting and nothing else.
"""

from __future__ import annotations

import json

import numpy as np

from sloscope import catalog

SCOPE_NAME = "sloscope"
SCOPE_VERSION = "0.1.0"
TEMPORALITY_DELTA = 1
TEMPORALITY_CUMULATIVE = 2
SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


def any_value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, (int, np.integer)):
        return {"intValue": str(int(value))}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(x) for x in value]}}
    return {"stringValue": str(value)}


def attribute(key: str, value) -> str:
    return json.dumps({"key": key, "value": any_value(value)}, separators=(",", ":"), ensure_ascii=False)


def attributes(pairs) -> str:
    """`[{...},{...}]` for an iterable of (key, value)."""
    return "[" + ",".join(attribute(k, v) for k, v in pairs) + "]"


def _esc(s: str) -> str:
    """Make a constant safe inside a %-template."""
    return s.replace("%", "%%")


def resource(pairs) -> str:
    return '{"attributes":' + attributes(pairs) + "}"


# ------------------------------------------------------------------------------------------------ metrics


class SeriesRender:
    """Everything needed to print one metric series' data points, cumulative where the instrument is."""

    __slots__ = ("name", "kind", "integer", "tmpl", "tmpl_after", "reset_at", "values", "counts", "count", "sum",
                 "min", "max", "offset")

    def __init__(self, name: str, attrs, kind: str, start_before: int | None = None,
                 start_after: int | None = None, reset_at: int | None = None, integer: bool = False,
                 value_format: str = "%r"):
        """`value_format` prints a double: "%r" (shortest exact), "%.6g" for values known to carry at most
        six significant digits, "%d" for whole numbers (`values` then holds integers)."""
        self.name, self.kind, self.integer, self.reset_at = name, kind, integer, reset_at
        head = '{"attributes":' + _esc(attributes(attrs)) + ","
        if kind == "gauge":
            self.tmpl = head + '"timeUnixNano":"%s","asDouble":' + value_format + "}"
            self.tmpl_after = self.tmpl
            return
        if kind == "counter":
            tail = ('"timeUnixNano":"%s","asInt":"%d"}' if integer else
                    '"timeUnixNano":"%s","asDouble":' + value_format + "}")
        else:
            tail = ('"timeUnixNano":"%s","count":"%d","sum":%r,"scale":0,"zeroCount":"0",'
                    '"positive":{"offset":%d,"bucketCounts":[%s]},"min":%r,"max":%r}')
        self.tmpl = head + '"startTimeUnixNano":"%d",' % start_before + tail
        self.tmpl_after = head + '"startTimeUnixNano":"%d",' % (start_after or start_before) + tail

    def points(self, ts: list, a: int, b: int) -> list:
        """Point strings for samples [a, b); `ts` holds the time strings of those samples."""
        if self.reset_at is None or self.reset_at >= b:
            return self._points(self.tmpl, ts, a, b)
        if self.reset_at <= a:
            return self._points(self.tmpl_after, ts, a, b)
        r = self.reset_at
        return self._points(self.tmpl, ts[:r - a], a, r) + self._points(self.tmpl_after, ts[r - a:], r, b)

    def _points(self, tmpl: str, ts: list, a: int, b: int) -> list:
        if a >= b:
            return []
        if self.kind != "histogram":
            return [tmpl % tv for tv in zip(ts, self.values[a:b].tolist())]
        buckets = ['"' + '","'.join(map(str, row)) + '"' for row in self.counts[a:b].tolist()]
        off = self.offset
        return [tmpl % (t, c, s, off, bk, mn, mx) for t, c, s, bk, mn, mx in zip(
            ts, self.count[a:b].tolist(), self.sum[a:b].tolist(), buckets, self.min[a:b].tolist(),
            self.max[a:b].tolist())]


def metric_head(name: str) -> tuple[str, str]:
    """The text around a metric's joined data points."""
    sig = catalog.signal(name)
    head = '{"name":%s,"description":%s,"unit":%s,' % (json.dumps(name), json.dumps(sig.description),
                                                        json.dumps(sig.unit))
    if sig.instrument is catalog.Instrument.GAUGE:
        return head + '"gauge":{"dataPoints":[', "]}}"
    if sig.instrument is catalog.Instrument.COUNTER:
        return head + '"sum":{"dataPoints":[', '],"aggregationTemporality":%d,"isMonotonic":true}}' % \
            TEMPORALITY_CUMULATIVE
    return head + '"exponentialHistogram":{"dataPoints":[', '],"aggregationTemporality":%d}}' % TEMPORALITY_CUMULATIVE


def metrics_line_head(resource_pairs) -> str:
    return ('{"resourceMetrics":[{"resource":' + resource(resource_pairs) + ',"scopeMetrics":[{"scope":{"name":"'
            + SCOPE_NAME + '","version":"' + SCOPE_VERSION + '"},"metrics":[')


METRICS_LINE_TAIL = "]}]}]}"


def traces_resource_head(resource_pairs, scope: str = "envoy") -> str:
    return '{"resource":' + resource(resource_pairs) + ',"scopeSpans":[{"scope":{"name":"' + scope + '"},"spans":['


TRACES_RESOURCE_TAIL = "]}]}"
