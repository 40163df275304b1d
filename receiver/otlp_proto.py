"""Decoding of OTLP protobuf export requests (OTLP/HTTP `application/x-protobuf` bodies, OTLP/gRPC messages)
into the same protocol-neutral records as the JSON decoder. A body that does not parse raises DecodeError; after
that, invalid spans and data points are refused one by one, as by the JSON decoder.

A body that upb refuses only for nesting past its depth limit is parsed again with that nesting cut away
(receiver/nesting.py): such nesting can only sit in an attribute value, and refusing the whole request for it
would refuse every good item beside the bad one. The item holding the value is then refused alone (or the value
ignored, where its attribute is not read), as one nested 20 levels would be."""

from __future__ import annotations

import math

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sloscope.metric_rules import kept_metrics
from sloscope.records import Batch

from sloscope.receiver import nesting
from sloscope.receiver.otlp_common import (FLAG_NO_RECORDED_VALUE, MAX_ATTRIBUTE_DEPTH, SPAN_ATTRIBUTES,
                                           STATUS_CODE_ERROR, TEMPORALITY_CUMULATIVE, TEMPORALITY_DELTA, DecodeError,
                                           MetricResource, MetricSeries, Skips, SpanResource, TextCache, append_span,
                                           explicit_buckets, histogram_totals, point_times, scale0_buckets, span_kind,
                                           valueless_point)

_NO_PARENT = bytes(8)  # an all-zero parent id is no parent
REQUEST_TYPES = {"traces": ExportTraceServiceRequest, "metrics": ExportMetricsServiceRequest,
                 "logs": ExportLogsServiceRequest}


def parse(signal: str, body: bytes):
    """The export request message of a signal ("traces", "metrics", "logs") from its protobuf bytes."""
    message = REQUEST_TYPES[signal]()
    try:
        message.ParseFromString(body)
    except (ProtobufDecodeError, RuntimeError) as exc:  # upb raises RuntimeError on excessive nesting
        if not (nesting.is_depth_error(exc) and _parsed_pruned(message, body)):
            raise DecodeError(f"not a valid {message.DESCRIPTOR.name}: {exc}") from None
    return message


def _parsed_pruned(message, body: bytes) -> bool:
    """Whether the body, with what is nested past the parser's limit cut away, parses (into `message`); a body
    that does not keeps the first error, which says what is wrong with it as sent."""
    pruned = nesting.pruned_protobuf(body)
    if pruned is None:
        return False
    try:
        message.ParseFromString(pruned)
    except (ProtobufDecodeError, RuntimeError):
        return False
    return True


def any_value(value, depth: int = 0):
    if depth > MAX_ATTRIBUTE_DEPTH:
        raise DecodeError(f"attribute value nested deeper than {MAX_ATTRIBUTE_DEPTH}")
    kind = value.WhichOneof("value")
    if kind == "string_value":  # by far the most common
        return value.string_value
    if kind == "array_value":
        return [any_value(v, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value, depth + 1) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    if kind == "double_value" and not math.isfinite(value.double_value):
        return str(value.double_value)
    return getattr(value, kind) if kind else None


def attributes(items) -> dict:
    return {kv.key: any_value(kv.value) for kv in items}


class ProtoDecoder(Skips):
    """As the JSON decoder: each invalid span or data point refused alone (counted by reason), a request with
    nothing good in it refused whole; a bounded cache of canonical attribute texts."""

    def __init__(self, cache_bytes: int = TextCache.MAX_BYTES, declared: frozenset = frozenset()):
        super().__init__()
        self.attribute_texts = TextCache(cache_bytes)
        self.kept = kept_metrics(declared)

    def decode(self, request) -> Batch:
        """A batch from an export request as `parse` returns it."""
        self._start_request()
        batch = Batch()
        if isinstance(request, ExportTraceServiceRequest):
            for block in request.resource_spans:
                self._resource_spans(block, batch)
        elif isinstance(request, ExportMetricsServiceRequest):
            for block in request.resource_metrics:
                self._resource_metrics(block, batch)
        self._check_something_good(batch)
        return batch  # logs carry no SLI or catalog signal

    def _canonical(self, items, series: MetricSeries) -> str:
        return self.attribute_texts.canonical(b"".join(kv.SerializeToString() for kv in items) + series.text_key,
                                              lambda: attributes(items), series.rule, series.resource_part)

    def _node(self, series: MetricSeries, items) -> str:
        """The node of a data point: its resource's, else the point attribute its rule names."""
        node, key = series.resource.node, series.rule.node_attribute
        if node is None and key:
            node = next((kv.value.string_value for kv in items if kv.key == key
                         and kv.value.WhichOneof("value") == "string_value" and kv.value.string_value), None)
        return self._placed(node)

    def _resource_spans(self, block, batch: Batch) -> None:
        try:
            resource = SpanResource(attributes(block.resource.attributes))
        except DecodeError as exc:
            exc.reason = "spans_invalid_resource"
            return self._refuse(exc, max(1, sum(len(scope.spans) for scope in block.scope_spans)))
        for scope in block.scope_spans:
            for span in scope.spans:
                try:
                    self._span(span, resource, batch)
                except DecodeError as exc:
                    self._refuse(exc)

    def _span(self, span, resource: SpanResource, batch: Batch) -> None:
        kind = span_kind(span.kind)
        trace_id, span_id, parent_id = span.trace_id, span.span_id, span.parent_span_id
        if len(trace_id) != 16 or len(span_id) != 8:
            raise DecodeError("span: trace_id must be 16 bytes and span_id 8 bytes", "spans_invalid_id")
        if parent_id and len(parent_id) != 8:
            raise DecodeError(f"span {span_id.hex()}: parent_span_id must be 8 bytes or none", "spans_invalid_id")
        parent = parent_id.hex() if parent_id and parent_id != _NO_PARENT else None
        try:
            kept = {kv.key: any_value(kv.value) for kv in span.attributes if kv.key in SPAN_ATTRIBUTES}
        except DecodeError as exc:
            raise DecodeError(f"span {span_id.hex()}: {exc}", "spans_invalid_attribute") from None
        counter = append_span(batch.spans, trace_id.hex(), span_id.hex(), parent, kind, resource, kept,
                              span.start_time_unix_nano, span.end_time_unix_nano, span.status.code == STATUS_CODE_ERROR,
                              span.name)
        if counter:
            self._count(counter, 1)

    def _resource_metrics(self, block, batch: Batch) -> None:
        try:
            resource = MetricResource(attributes(block.resource.attributes))
        except DecodeError as exc:
            exc.reason = "points_invalid_resource"
            return self._refuse(exc, max(1, sum(_points_of(metric) for scope in block.scope_metrics
                                                for metric in scope.metrics)))
        for scope in block.scope_metrics:
            for metric in scope.metrics:
                self._metric(metric, resource, batch)

    def _metric(self, metric, resource: MetricResource, batch: Batch) -> None:
        rule = self.kept.get(metric.name)
        if rule is None:
            self._skip("points_not_in_catalog")
            return
        kind = metric.WhichOneof("data")
        if kind not in ("gauge", "sum", "exponential_histogram") and not (kind == "histogram" and
                                                                        rule.explicit_histograms):
            # reported back point by point, as the points it holds are what is not kept
            self._skip("points_unsupported_type", max(1, len(getattr(metric, kind).data_points) if kind else 1))
            return
        data = getattr(metric, kind)
        try:
            cumulative = kind != "gauge" and _temporality(data.aggregation_temporality, metric.name) == \
                TEMPORALITY_CUMULATIVE
        except DecodeError as exc:
            return self._refuse(exc, max(1, len(data.data_points)))
        is_sum = kind == "sum"
        if rule.reads_as_level(is_sum, is_sum and data.is_monotonic, cumulative):
            is_sum = cumulative = False
        read = self._histogram_point if kind == "exponential_histogram" else \
            self._explicit_point if kind == "histogram" else self._number_point
        series = MetricSeries.of(metric.name, rule, resource)
        for point in data.data_points:
            if point.flags & FLAG_NO_RECORDED_VALUE:
                self._skip("points_no_recorded_value")
                continue
            try:
                read(point, series, batch, is_sum, cumulative)
            except DecodeError as exc:
                self._refuse(exc)

    def _number_point(self, p, series: MetricSeries, batch: Batch, is_sum: bool, cumulative: bool) -> None:
        name = series.name
        kind = p.WhichOneof("value")
        if kind is None:
            raise valueless_point(name)
        value = p.as_double if kind == "as_double" else float(p.as_int)
        if self._unkept_value(value, series, is_sum and not cumulative):
            return
        start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
        attrs = self._canonical(p.attributes, series)
        batch.points.add(self._node(series, p.attributes), name, attrs, is_sum, cumulative, start, time, value)

    def _histogram_point(self, p, series: MetricSeries, batch: Batch, _is_sum: bool, cumulative: bool) -> None:
        self._histogram_row(p, series, batch, cumulative, lambda: scale0_buckets(
            series.name, p.count, p.scale, p.zero_count, p.positive.offset, p.positive.bucket_counts,
            p.negative.bucket_counts))

    def _explicit_point(self, p, series: MetricSeries, batch: Batch, _is_sum: bool, cumulative: bool) -> None:
        if not p.HasField("sum"):
            self._skip("points_no_sum")
            return
        self._histogram_row(p, series, batch, cumulative,
                            lambda: explicit_buckets(series.name, p.count, p.explicit_bounds, p.bucket_counts))

    def _histogram_row(self, p, series: MetricSeries, batch: Batch, cumulative: bool, buckets_of) -> None:
        """Checks the point in the JSON decoder's order (times, totals, then `buckets_of()`) and adds its row."""
        name = series.name
        start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
        low, high = (p.min if p.HasField("min") else None), (p.max if p.HasField("max") else None)
        histogram_totals(name, p.count, p.sum, low, high)
        buckets = buckets_of()
        attrs = self._canonical(p.attributes, series)
        batch.histograms.add(self._node(series, p.attributes), name, attrs, cumulative, start, time, p.count, p.sum,
                             low, high, buckets)


def _points_of(metric) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def _temporality(value: int, name: str) -> int:
    if value not in (TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE):
        raise DecodeError(f"{name}: aggregation_temporality must be 1 (delta) or 2 (cumulative), got {value}",
                          "points_invalid_metric")
    return value
