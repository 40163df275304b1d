"""Decoding of OTLP/JSON export requests (the OpenTelemetry Collector file exporter's lines, OTLP/HTTP JSON
bodies) into protocol-neutral records.

OTLP/JSON differs from protobuf's canonical JSON: ids are hex, not base64; 64-bit integers arrive as
strings (or numbers); enums are integers; keys are lowerCamelCase (snake_case is accepted as the spec
allows). An invalid span or data point is refused alone and counted by reason; a request that is not an export
request, or has nothing good in it, raises a `DecodeError` saying why.

A document that orjson refuses only for nesting past its depth limit is parsed again with that nesting replaced
by null (receiver/nesting.py): such nesting can only sit in an attribute value, and refusing the whole request
for it would refuse every good item beside the bad one. The item holding the value is then refused alone (or the
value ignored, where its attribute is not read), as one nested 20 levels would be.
"""

from __future__ import annotations

import re
from functools import partial
from typing import NamedTuple

import orjson

from sloscope.metric_rules import kept_metrics
from sloscope.records import Batch

from sloscope.receiver import nesting
from sloscope.receiver.otlp_common import (FLAG_NO_RECORDED_VALUE, MAX_ATTRIBUTE_DEPTH, MAX_INT64, SPAN_ATTRIBUTES,
                                           STATUS_CODE_ERROR, TEMPORALITY_CUMULATIVE, TEMPORALITY_DELTA, DecodeError,
                                           MetricResource, MetricSeries, Skips, SpanResource, TextCache, append_span,
                                           explicit_buckets, histogram_totals, point_times, scale0_buckets, span_kind,
                                           valueless_point)

_HEX_TRACE = re.compile(r"[0-9a-fA-F]{32}")
_HEX_SPAN = re.compile(r"[0-9a-fA-F]{16}")
_NO_PARENT = "0" * 16  # an all-zero parent id is no parent
_INTEGER = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only, and no more than a 64-bit integer has


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
    elif kind is str and _INTEGER.fullmatch(value):
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


class Blocks(NamedTuple):
    """The names of one signal's nesting in OTLP/JSON, and the reason a malformed level is refused for."""

    resources: str
    scopes: tuple[str, str]  # the JSON name, then the protobuf field name that JSON encoders may also write
    items: str
    refusal: str


SPAN_BLOCKS = Blocks("resourceSpans", ("scopeSpans", "scope_spans"), "spans", "spans_invalid_resource")
METRIC_BLOCKS = Blocks("resourceMetrics", ("scopeMetrics", "scope_metrics"), "metrics", "points_invalid_resource")


def _refusable(default: str, exc: DecodeError) -> DecodeError:
    """The error as the refusal of one item: its own reason, else the item kind's general one."""
    exc.reason = exc.reason or default
    return exc


def _points_in(metric: dict, *kinds: str) -> int:
    """How many data points the metric holds under the first of `kinds` it has; at least one."""
    for kind in kinds:
        block = metric.get(kind)
        if type(block) is dict:
            points = block.get("dataPoints", block.get("data_points"))
            return max(len(points), 1) if type(points) is list else 1
    return 1


def _items_in(block, *path: str) -> int:
    """How many items a block holds at the end of `path` (lists of objects along it), for refusing them all;
    at least one, however malformed the block."""
    level = [block]
    for key in path:
        level = [item for obj in level if type(obj) is dict and type(obj.get(key)) is list for item in obj[key]]
    return max(len(level), 1)


class Decoder(Skips):
    """Turns export requests into a Batch: each invalid span or data point refused alone (counted by reason),
    a request with nothing good in it refused whole. Keeps a bounded cache of canonical attribute texts.
    `declared`: metric names kept beside the catalog's (those an SLO spec declares as evidence)."""

    def __init__(self, cache_bytes: int = TextCache.MAX_BYTES, declared: frozenset = frozenset()):
        super().__init__()
        self.attribute_texts = TextCache(cache_bytes)
        self.kept = kept_metrics(declared)

    def _canonical(self, raw, series: MetricSeries) -> str:
        """Canonical JSON text (sorted keys) of a data point's raw attribute list as its series' rule keeps it,
        cached by their raw form."""
        return self.attribute_texts.canonical((orjson.dumps(raw) if raw else b"") + series.text_key,
                                              lambda: attributes(raw or []), series.rule, series.resource_part)

    def _node(self, series: MetricSeries, raw) -> str:
        """The node of a data point: its resource's, else the point attribute its rule names."""
        node, key = series.resource.node, series.rule.node_attribute
        if node is None and key and type(raw) is list:
            named = _selected_attributes(raw, frozenset((key,))).get(key)
            node = named if isinstance(named, str) and named else None
        return self._placed(node)

    def decode(self, request) -> Batch:
        if not isinstance(request, dict):
            raise DecodeError(f"expected a JSON object, got {type(request).__name__}")
        self._start_request()
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
        self._check_something_good(batch)
        return batch

    # --- traces ---------------------------------------------------------------------------------------

    def _resource_spans(self, block, batch: Batch) -> None:
        for resource, spans in self._scoped(block, SPAN_BLOCKS, SpanResource):
            for span in spans:
                try:
                    self._span(span, resource, batch)
                except DecodeError as exc:
                    self._refuse(_refusable("spans_invalid", exc))

    def _scoped(self, block, names: Blocks, resource_of):
        """(resource, items) of each scope of a resource block; a block or scope that is not what OTLP says is
        refused with its items, counted by `names.refusal`."""
        try:
            if not isinstance(block, dict):
                raise DecodeError(f"{names.resources}: expected objects")
            resource = resource_of(_resource_attributes(block))
            scopes = _list(block, *names.scopes)
        except DecodeError as exc:
            self._refuse(_refusable(names.refusal, exc), _items_in(block, names.scopes[0], names.items))
            return
        for scope in scopes:
            try:
                if not isinstance(scope, dict):
                    raise DecodeError(f"{names.scopes[0]}: expected objects")
                items = _list(scope, names.items)
            except DecodeError as exc:
                self._refuse(_refusable(names.refusal, exc), _items_in(scope, names.items))
                continue
            yield resource, items

    def _span(self, span, resource: SpanResource, batch: Batch) -> None:
        if not isinstance(span, dict):
            raise DecodeError("spans: expected objects")
        kind = span_kind(_int(_get(span, "kind", None, 0), "span kind"))
        trace_id, span_id = _get(span, "traceId", "trace_id", ""), _get(span, "spanId", "span_id", "")
        if not isinstance(trace_id, str) or not _HEX_TRACE.fullmatch(trace_id):
            raise DecodeError(f"traceId: expected 32 hex digits, got {str(trace_id)[:40]!r}", "spans_invalid_id")
        if not isinstance(span_id, str) or not _HEX_SPAN.fullmatch(span_id):
            raise DecodeError(f"spanId: expected 16 hex digits, got {str(span_id)[:40]!r}", "spans_invalid_id")
        parent_id = _get(span, "parentSpanId", "parent_span_id", "")
        if parent_id != "" and (not isinstance(parent_id, str) or not _HEX_SPAN.fullmatch(parent_id)):
            raise DecodeError(f"span {span_id}: parentSpanId: expected 16 hex digits or none, got "
                              f"{str(parent_id)[:40]!r}", "spans_invalid_id")
        parent_id = parent_id.lower() if parent_id and parent_id != _NO_PARENT else None
        try:
            start = _int(_get(span, "startTimeUnixNano", "start_time_unix_nano", 0), "startTimeUnixNano")
            end = _int(_get(span, "endTimeUnixNano", "end_time_unix_nano", 0), "endTimeUnixNano")
        except DecodeError as exc:
            raise DecodeError(f"span {span_id}: {exc}", "spans_invalid_time") from None
        try:
            attrs = _selected_attributes(_get(span, "attributes", None, []), SPAN_ATTRIBUTES)
        except DecodeError as exc:
            raise DecodeError(f"span {span_id}: {exc}", "spans_invalid_attribute") from None
        span_status = _get(span, "status", None, {})
        status_error = _get(span_status, "code", None, 0) in (STATUS_CODE_ERROR, "STATUS_CODE_ERROR")
        counter = append_span(batch.spans, trace_id.lower(), span_id.lower(), parent_id, kind, resource, attrs, start,
                              end, status_error, str(_get(span, "name", None, "")))
        if counter:
            self._count(counter, 1)

    # --- metrics --------------------------------------------------------------------------------------

    def _resource_metrics(self, block, batch: Batch) -> None:
        for resource, metrics in self._scoped(block, METRIC_BLOCKS, MetricResource):
            for metric in metrics:
                self._metric(metric, resource, batch)

    def _metric(self, metric, resource: MetricResource, batch: Batch) -> None:
        if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
            return self._refuse(DecodeError("metrics: expected objects with a name", "points_invalid_metric"))
        name = metric["name"]
        rule = self.kept.get(name)
        if rule is None:
            self._skip("points_not_in_catalog")
            return
        data = _get(metric, "exponentialHistogram", "exponential_histogram")
        kind = "exponential_histogram" if data is not None else "gauge" if "gauge" in metric else \
            "histogram" if "histogram" in metric and rule.explicit_histograms else "sum"
        data = data if data is not None else metric.get(kind)
        if data is None:  # reported back point by point, as the points it holds are what is not kept
            self._skip("points_unsupported_type", _points_in(metric, "summary", "histogram"))
            return
        try:
            if not isinstance(data, dict):
                raise DecodeError(f"{name}: expected an object")
            points = _list(data, "dataPoints", "data_points")
            cumulative = kind != "gauge" and self._temporality(data, name) == TEMPORALITY_CUMULATIVE
        except DecodeError as exc:
            return self._refuse(_refusable("points_invalid_metric", exc), _items_in(data, "dataPoints"))
        is_sum = kind == "sum"
        if rule.reads_as_level(is_sum, _get(data, "isMonotonic", "is_monotonic", False) is True, cumulative):
            is_sum = cumulative = False
        read = self._histogram_point if kind == "exponential_histogram" else \
            partial(self._histogram_point, explicit=True) if kind == "histogram" else self._number_point
        series = MetricSeries.of(name, rule, resource)
        for point in points:
            try:
                read(point, series, batch, is_sum, cumulative)
            except DecodeError as exc:
                self._refuse(_refusable("points_invalid", exc))

    def _number_point(self, point, series: MetricSeries, batch: Batch, is_sum: bool, cumulative: bool) -> None:
        name = series.name
        if type(point) is not dict:
            raise DecodeError(f"{name}: dataPoints: expected objects")
        if self._no_recorded_value(point):
            return
        raw = _get(point, "asDouble", "as_double")
        try:
            if raw is not None:
                value = raw if type(raw) is float else _float(raw, f"{name}: asDouble")
            else:
                raw = _get(point, "asInt", "as_int")
                if raw is None:
                    raise valueless_point(name)
                value = float(_int(raw, f"{name}: asInt"))
        except DecodeError as exc:
            raise _refusable("points_invalid_value", exc) from None
        if self._unkept_value(value, series, is_sum and not cumulative):
            return
        start, time = self._times(point, name)
        attrs = self._canonical(point.get("attributes"), series)
        batch.points.add(self._node(series, point.get("attributes")), name, attrs, is_sum, cumulative, start, time,
                         value)

    def _histogram_point(self, point, series: MetricSeries, batch: Batch, _is_sum: bool, cumulative: bool,
                         explicit: bool = False) -> None:
        """An exponential histogram's point, or (`explicit`) an explicit-bucket histogram's."""
        name = series.name
        if not isinstance(point, dict):
            raise DecodeError(f"{name}: dataPoints: expected objects")
        if self._no_recorded_value(point):
            return
        if explicit and point.get("sum") is None:
            self._skip("points_no_sum")
            return
        start, time = self._times(point, name)
        try:
            count = _int(_get(point, "count", None, 0), f"{name}: count")
        except DecodeError as exc:
            raise _refusable("points_invalid_count", exc) from None
        try:
            total = _float(_get(point, "sum", None, 0.0), f"{name}: sum")
            low = _float(point["min"], f"{name}: min") if point.get("min") is not None else None
            high = _float(point["max"], f"{name}: max") if point.get("max") is not None else None
        except DecodeError as exc:
            raise _refusable("points_invalid_sum", exc) from None
        histogram_totals(name, count, total, low, high)
        buckets = self._explicit_buckets(point, name, count) if explicit else self._buckets(point, name, count)
        attrs = self._canonical(point.get("attributes"), series)
        batch.histograms.add(self._node(series, point.get("attributes")), name, attrs, cumulative, start, time, count,
                             total, low, high, buckets)

    def _no_recorded_value(self, point: dict) -> bool:
        flags = point.get("flags")
        if flags and _int(flags, "flags") & FLAG_NO_RECORDED_VALUE:
            self._skip("points_no_recorded_value")
            return True
        return False

    @staticmethod
    def _buckets(point: dict, name: str, count: int) -> list[int]:
        try:
            positive, negative = _get(point, "positive", None, {}), _get(point, "negative", None, {})
            scale = _int(_get(point, "scale", None, 0), f"{name}: scale")
            zero_count = _int(_get(point, "zeroCount", "zero_count", 0), f"{name}: zeroCount")
            offset = _int(_get(positive, "offset", None, 0), f"{name}: positive.offset")
            counts = [_int(raw, f"{name}: bucketCounts") for raw in _list(positive, "bucketCounts", "bucket_counts")]
            negative_counts = [_int(raw, f"{name}: negative bucketCounts")
                               for raw in _list(negative, "bucketCounts", "bucket_counts")]
        except DecodeError as exc:
            raise _refusable("points_invalid_buckets", exc) from None
        return scale0_buckets(name, count, scale, zero_count, offset, counts, negative_counts)

    @staticmethod
    def _explicit_buckets(point: dict, name: str, count: int) -> list[int]:
        try:
            bounds = [_float(raw, f"{name}: explicitBounds")
                      for raw in _list(point, "explicitBounds", "explicit_bounds")]
            counts = [_int(raw, f"{name}: bucketCounts") for raw in _list(point, "bucketCounts", "bucket_counts")]
        except DecodeError as exc:
            raise _refusable("points_invalid_buckets", exc) from None
        return explicit_buckets(name, count, bounds, counts)

    @staticmethod
    def _temporality(data: dict, name: str) -> int:
        temporality = _get(data, "aggregationTemporality", "aggregation_temporality", 0)
        if temporality in ("AGGREGATION_TEMPORALITY_DELTA", TEMPORALITY_DELTA):
            return TEMPORALITY_DELTA
        if temporality in ("AGGREGATION_TEMPORALITY_CUMULATIVE", TEMPORALITY_CUMULATIVE):
            return TEMPORALITY_CUMULATIVE
        raise DecodeError(f"{name}: aggregationTemporality must be 1 (delta) or 2 (cumulative), got "
                          f"{str(temporality)[:40]!r}", "points_invalid_metric")

    @staticmethod
    def _times(point: dict, name: str) -> tuple[int, int]:
        try:
            time = _int(_get(point, "timeUnixNano", "time_unix_nano", 0), f"{name}: timeUnixNano")
            start = _int(_get(point, "startTimeUnixNano", "start_time_unix_nano", 0), f"{name}: startTimeUnixNano")
        except DecodeError as exc:
            raise _refusable("points_invalid_time", exc) from None
        return point_times(name, start, time)


def parse(text: bytes):
    """The JSON document of an export request (an OTLP/HTTP body, a file exporter's line); raises DecodeError."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        document = _parsed_pruned(text) if nesting.is_depth_error(exc) else None
        if document is None:  # the first error says what is wrong with the text as sent
            raise DecodeError(f"not valid JSON: {exc}") from None
        return document


def _parsed_pruned(text: bytes):
    """The document with what is nested past orjson's limit replaced by null, or None: it still does not parse.
    (A document nested that deep is an array or object, never null itself.)"""
    pruned = nesting.pruned_json(text)
    if pruned is None:
        return None
    try:
        return orjson.loads(pruned)
    except orjson.JSONDecodeError:
        return None


def decode_line(decoder: Decoder, line: bytes) -> Batch:
    return decoder.decode(parse(line))
