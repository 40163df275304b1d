"""Decoding of OTLP/JSON export requests (the OpenTelemetry Collector file exporter's lines, OTLP/HTTP JSON
bodies) into protocol-neutral records.

OTLP/JSON differs from protobuf's canonical JSON: ids are hex, not base64; 64-bit integers arrive as
strings (or numbers); enums are integers; keys are lowerCamelCase (snake_case is accepted as the spec
allows). A request is decoded as a whole or rejected as a whole with a `DecodeError` saying why, so a bad
line never half-loads.
"""

from __future__ import annotations

import math
import re

import orjson

from sloscope import catalog
from sloscope.records import Batch

from collectors.otlp_common import (
    FLAG_NO_RECORDED_VALUE, MAX_ATTRIBUTE_DEPTH, MAX_INT64, SPAN_ATTRIBUTES, SPAN_KIND_SERVER, STATUS_CODE_ERROR,
    TEMPORALITY_CUMULATIVE, TEMPORALITY_DELTA, DecodeError, Skips, SpanResource, append_span, node_of, scale0_buckets)

_HEX_TRACE = re.compile(r"^[0-9a-fA-F]{32}$")
_HEX_SPAN = re.compile(r"^[0-9a-fA-F]{16}$")


def _get(obj: dict, camel: str, snake: str | None = None, default=None):
    if type(obj) is not dict:
        raise DecodeError(f"expected an object holding {camel}, got {type(obj).__name__}")
    value = obj.get(camel)
    if value is None and snake is not None:
        value = obj.get(snake)
    return default if value is None else value


def _list(obj: dict, camel: str, snake: str | None = None) -> list:
    value = _get(obj, camel, snake, [])
    if not isinstance(value, list):
        raise DecodeError(f"{camel}: expected a list, got {type(value).__name__}")
    return value


def _int(value, what: str) -> int:
    kind = type(value)
    if kind is int:
        number = value
    elif kind is str and value.lstrip("-").isdigit():
        number = int(value)
    elif kind is float and value.is_integer():
        number = int(value)
    else:
        raise DecodeError(f"{what}: expected an integer, got {str(value)[:40]!r}")
    if not -MAX_INT64 - 1 <= number <= MAX_INT64:  # every integer is stored as a signed 64-bit one
        raise DecodeError(f"{what}: {str(number)[:40]} is out of the 64-bit range")
    return number


def _float(value, what: str) -> float:
    kind = type(value)
    if kind is float or kind is int:
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # also "NaN", "Infinity" as OTLP/JSON writes them
        except ValueError:
            pass
    raise DecodeError(f"{what}: expected a number, got {str(value)[:40]!r}")


def any_value(value, depth: int = 0):
    """An OTLP AnyValue as a plain Python value (str, bool, int, float, list, dict)."""
    if depth > MAX_ATTRIBUTE_DEPTH:
        raise DecodeError(f"attribute value nested deeper than {MAX_ATTRIBUTE_DEPTH}")
    if not isinstance(value, dict):
        raise DecodeError(f"attribute value: expected an AnyValue object, got {type(value).__name__}")
    if "stringValue" in value:
        text = value["stringValue"]
        if not isinstance(text, str):
            raise DecodeError("stringValue: expected a string")
        return text
    if "intValue" in value:
        return _int(value["intValue"], "intValue")
    if "doubleValue" in value:
        return _float(value["doubleValue"], "doubleValue")
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise DecodeError("boolValue: expected true or false")
        return value["boolValue"]
    if "arrayValue" in value:
        values = _list(value["arrayValue"] or {}, "values")
        return [any_value(v, depth + 1) for v in values]
    if "kvlistValue" in value:
        return attributes(_list(value["kvlistValue"] or {}, "values"), depth + 1)
    if "bytesValue" in value:
        return str(value["bytesValue"])
    return None


def attributes(items, depth: int = 0) -> dict:
    if not isinstance(items, list):
        raise DecodeError(f"attributes: expected a list, got {type(items).__name__}")
    out = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise DecodeError("attributes: expected {key, value} objects")
        out[item["key"]] = any_value(item.get("value", {}), depth)
    return out


def _selected_attributes(items, wanted: frozenset) -> dict:
    """Only the attributes analytics reads; the others are neither decoded nor kept."""
    if type(items) is not list:
        raise DecodeError(f"attributes: expected a list, got {type(items).__name__}")
    out = {}
    for item in items:
        if type(item) is not dict:
            raise DecodeError("attributes: expected {key, value} objects")
        key = item.get("key")
        if type(key) is str and key in wanted:
            out[key] = any_value(item.get("value", {}))
    return out


def _resource_attributes(resource_block: dict) -> dict:
    resource = _get(resource_block, "resource", None, {})
    if not isinstance(resource, dict):
        raise DecodeError("resource: expected an object")
    return attributes(_get(resource, "attributes", None, []))


class Decoder(Skips):
    """Turns export requests into a Batch. Keeps a cache of canonical attribute texts, which repeat for
    every data point of a series."""

    def __init__(self):
        super().__init__()
        self._attr_text: dict[bytes, str] = {}

    def _canonical(self, raw) -> str:
        """Canonical JSON text (sorted keys) of a data point's raw attribute list, cached by its raw form."""
        key = orjson.dumps(raw) if raw else b""
        text = self._attr_text.get(key)
        if text is None:
            text = orjson.dumps(attributes(raw or []), option=orjson.OPT_SORT_KEYS).decode()
            if len(self._attr_text) < 100_000:
                self._attr_text[key] = text
        return text

    def decode(self, request) -> Batch:
        if not isinstance(request, dict):
            raise DecodeError(f"expected a JSON object, got {type(request).__name__}")
        batch = Batch()
        known = False
        if "resourceSpans" in request or "resource_spans" in request:
            known = True
            for block in _list(request, "resourceSpans", "resource_spans"):
                self._resource_spans(block, batch)
        if "resourceMetrics" in request or "resource_metrics" in request:
            known = True
            for block in _list(request, "resourceMetrics", "resource_metrics"):
                self._resource_metrics(block, batch)
        if "resourceLogs" in request or "resource_logs" in request:
            known = True
            _list(request, "resourceLogs", "resource_logs")  # logs carry no SLI or catalog signal
        if not known:
            raise DecodeError("not an OTLP export request (no resourceSpans, resourceMetrics or resourceLogs)")
        return batch

    # --- traces ---------------------------------------------------------------------------------------

    def _resource_spans(self, block, batch: Batch) -> None:
        if not isinstance(block, dict):
            raise DecodeError("resourceSpans: expected objects")
        resource = SpanResource(_resource_attributes(block))
        for scope in _list(block, "scopeSpans", "scope_spans"):
            if not isinstance(scope, dict):
                raise DecodeError("scopeSpans: expected objects")
            for span in _list(scope, "spans"):
                self._span(span, resource, batch)

    def _span(self, span, resource: SpanResource, batch: Batch) -> None:
        if not isinstance(span, dict):
            raise DecodeError("spans: expected objects")
        kind = _int(_get(span, "kind", None, 0), "span kind")
        if kind != SPAN_KIND_SERVER:
            self._skip("spans_not_server")
            return
        trace_id, span_id = _get(span, "traceId", "trace_id", ""), _get(span, "spanId", "span_id", "")
        if not isinstance(trace_id, str) or not _HEX_TRACE.match(trace_id):
            raise DecodeError(f"traceId: expected 32 hex digits, got {str(trace_id)[:40]!r}")
        if not isinstance(span_id, str) or not _HEX_SPAN.match(span_id):
            raise DecodeError(f"spanId: expected 16 hex digits, got {str(span_id)[:40]!r}")
        start = _int(_get(span, "startTimeUnixNano", "start_time_unix_nano", 0), "startTimeUnixNano")
        end = _int(_get(span, "endTimeUnixNano", "end_time_unix_nano", 0), "endTimeUnixNano")
        attrs = _selected_attributes(_get(span, "attributes", None, []), SPAN_ATTRIBUTES)
        span_status = _get(span, "status", None, {})
        status_error = _get(span_status, "code", None, 0) in (STATUS_CODE_ERROR, "STATUS_CODE_ERROR")
        append_span(batch.spans, trace_id.lower(), span_id.lower(), resource, attrs, start, end,
                    status_error, str(_get(span, "name", None, "")))

    # --- metrics --------------------------------------------------------------------------------------

    def _resource_metrics(self, block, batch: Batch) -> None:
        if not isinstance(block, dict):
            raise DecodeError("resourceMetrics: expected objects")
        resource = _resource_attributes(block)
        node = node_of(resource)
        if node is None:
            raise DecodeError("resource has neither k8s.node.name nor host.name")
        for scope in _list(block, "scopeMetrics", "scope_metrics"):
            if not isinstance(scope, dict):
                raise DecodeError("scopeMetrics: expected objects")
            for metric in _list(scope, "metrics"):
                self._metric(metric, node, batch)

    def _metric(self, metric, node: str, batch: Batch) -> None:
        if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
            raise DecodeError("metrics: expected objects with a name")
        name = metric["name"]
        if name not in catalog.BY_NAME:
            self._skip("points_not_in_catalog")
            return
        if "gauge" in metric:
            self._number_points(metric["gauge"], name, node, batch, is_sum=False)
        elif "sum" in metric:
            self._number_points(metric["sum"], name, node, batch, is_sum=True)
        elif "exponentialHistogram" in metric or "exponential_histogram" in metric:
            self._exp_histogram(_get(metric, "exponentialHistogram", "exponential_histogram"), name, node, batch)
        else:
            self._skip("points_unsupported_type")

    def _number_points(self, data, name: str, node: str, batch: Batch, is_sum: bool) -> None:
        if not isinstance(data, dict):
            raise DecodeError(f"{name}: expected an object")
        cumulative = is_sum and self._temporality(data, name) == TEMPORALITY_CUMULATIVE
        cols = batch.points
        points = _list(data, "dataPoints", "data_points")
        canonical, time_of = self._canonical, self._time
        values, times, starts, attrs = [], [], [], []
        for point in points:
            if type(point) is not dict:
                raise DecodeError(f"{name}: dataPoints: expected objects")
            flags = point.get("flags")
            if flags and _int(flags, "flags") & FLAG_NO_RECORDED_VALUE:
                continue
            raw = _get(point, "asDouble", "as_double")
            if raw is not None:
                value = raw if type(raw) is float else _float(raw, f"{name}: asDouble")
            else:
                raw = _get(point, "asInt", "as_int")
                if raw is None:
                    raise DecodeError(f"{name}: data point has neither asDouble nor asInt")
                value = float(_int(raw, f"{name}: asInt"))
            if not math.isfinite(value):
                self._skip("points_not_finite")
                continue
            values.append(value)
            times.append(time_of(point, name))
            starts.append(_int(_get(point, "startTimeUnixNano", "start_time_unix_nano", 0), "startTimeUnixNano"))
            attrs.append(canonical(point.get("attributes")))
        n = len(values)
        cols.node.extend([node] * n)
        cols.metric.extend([name] * n)
        cols.is_sum.extend([is_sum] * n)
        cols.cumulative.extend([cumulative] * n)
        cols.attributes.extend(attrs)
        cols.start_ns.extend(starts)
        cols.time_ns.extend(times)
        cols.value.extend(values)

    def _exp_histogram(self, data, name: str, node: str, batch: Batch) -> None:
        if not isinstance(data, dict):
            raise DecodeError(f"{name}: expected an object")
        cumulative = self._temporality(data, name) == TEMPORALITY_CUMULATIVE
        cols = batch.histograms
        for point in _list(data, "dataPoints", "data_points"):
            if not isinstance(point, dict):
                raise DecodeError(f"{name}: dataPoints: expected objects")
            if _int(_get(point, "flags", None, 0), "flags") & FLAG_NO_RECORDED_VALUE:
                continue
            cols.node.append(node)
            cols.metric.append(name)
            cols.attributes.append(self._canonical(point.get("attributes")))
            cols.cumulative.append(cumulative)
            cols.start_ns.append(_int(_get(point, "startTimeUnixNano", "start_time_unix_nano", 0), "startTimeUnixNano"))
            cols.time_ns.append(self._time(point, name))
            cols.count.append(_int(_get(point, "count", None, 0), f"{name}: count"))
            cols.sum.append(_float(_get(point, "sum", None, 0.0), f"{name}: sum"))
            cols.min.append(_float(point["min"], f"{name}: min") if "min" in point else None)
            cols.max.append(_float(point["max"], f"{name}: max") if "max" in point else None)
            cols.buckets.append(self._buckets(point, name))

    @staticmethod
    def _buckets(point: dict, name: str) -> list[int]:
        positive = _get(point, "positive", None, {})
        return scale0_buckets(
            name, _int(_get(point, "scale", None, 0), f"{name}: scale"),
            _int(_get(point, "zeroCount", "zero_count", 0), f"{name}: zeroCount"),
            _int(_get(positive, "offset", None, 0), f"{name}: positive.offset"),
            [_int(raw, f"{name}: bucketCounts") for raw in _list(positive, "bucketCounts", "bucket_counts")])

    @staticmethod
    def _temporality(data: dict, name: str) -> int:
        temporality = _get(data, "aggregationTemporality", "aggregation_temporality", 0)
        if temporality in ("AGGREGATION_TEMPORALITY_DELTA", TEMPORALITY_DELTA):
            return TEMPORALITY_DELTA
        if temporality in ("AGGREGATION_TEMPORALITY_CUMULATIVE", TEMPORALITY_CUMULATIVE):
            return TEMPORALITY_CUMULATIVE
        raise DecodeError(f"{name}: aggregationTemporality must be 1 (delta) or 2 (cumulative), got {temporality!r}")

    @staticmethod
    def _time(point: dict, name: str) -> int:
        raw = point.get("timeUnixNano")
        t = int(raw) if type(raw) is str and raw.isdigit() else _int(
            _get(point, "timeUnixNano", "time_unix_nano", 0), f"{name}: timeUnixNano")
        if not 0 < t <= MAX_INT64:
            raise DecodeError(f"{name}: data point without timeUnixNano, or one past 2**63")
        return t


def decode_line(decoder: Decoder, line: bytes) -> Batch:
    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None
    return decoder.decode(request)
