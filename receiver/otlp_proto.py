"""Decoding of OTLP protobuf export requests (OTLP/HTTP `application/x-protobuf` bodies, OTLP/gRPC messages)
into the same protocol-neutral records as the JSON decoder. A body that does not parse raises DecodeError; after
that, invalid spans and data points are refused one by one, as by the JSON decoder."""

from __future__ import annotations

import math

import orjson
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sloscope import catalog
from sloscope.records import Batch

from receiver.otlp_common import (
    FLAG_NO_RECORDED_VALUE, MAX_ATTRIBUTE_DEPTH, SPAN_ATTRIBUTES, SPAN_KIND_SERVER, STATUS_CODE_ERROR,
    TEMPORALITY_CUMULATIVE, TEMPORALITY_DELTA, DecodeError, Skips, SpanResource, TextCache, append_span,
    histogram_totals, metric_rows, node_of, point_times, scale0_buckets)

REQUEST_TYPES = {"traces": ExportTraceServiceRequest, "metrics": ExportMetricsServiceRequest,
                 "logs": ExportLogsServiceRequest}


def parse(signal: str, body: bytes):
    """The export request message of a signal ("traces", "metrics", "logs") from its protobuf bytes."""
    message = REQUEST_TYPES[signal]()
    try:
        message.ParseFromString(body)
    except (ProtobufDecodeError, RuntimeError) as exc:  # upb raises RuntimeError on excessive nesting
        raise DecodeError(f"not a valid {message.DESCRIPTOR.name}: {exc}") from None
    return message


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

    def __init__(self, cache_bytes: int = TextCache.MAX_BYTES):
        super().__init__()
        self.attribute_texts = TextCache(cache_bytes)

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

    def _canonical(self, items) -> str:
        key = b"".join(kv.SerializeToString() for kv in items)
        text = self.attribute_texts.get(key)
        if text is None:
            try:
                text = orjson.dumps(attributes(items), option=orjson.OPT_SORT_KEYS).decode()
            except DecodeError as exc:
                raise DecodeError(str(exc), "points_invalid_attribute") from None
            self.attribute_texts.put(key, text)
        return text

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
        if span.kind != SPAN_KIND_SERVER:
            self._skip("spans_not_server")
            return
        trace_id, span_id = span.trace_id, span.span_id
        if len(trace_id) != 16 or len(span_id) != 8:
            raise DecodeError("span: trace_id must be 16 bytes and span_id 8 bytes", "spans_invalid_id")
        try:
            kept = {kv.key: any_value(kv.value) for kv in span.attributes if kv.key in SPAN_ATTRIBUTES}
        except DecodeError as exc:
            raise DecodeError(f"span {span_id.hex()}: {exc}", "spans_invalid_attribute") from None
        append_span(batch.spans, trace_id.hex(), span_id.hex(), resource, kept, span.start_time_unix_nano,
                    span.end_time_unix_nano, span.status.code == STATUS_CODE_ERROR, span.name)

    def _resource_metrics(self, block, batch: Batch) -> None:
        try:
            node = node_of(attributes(block.resource.attributes))
        except DecodeError as exc:
            exc.reason = "points_invalid_resource"
            return self._refuse(exc, max(1, sum(_points_of(metric) for scope in block.scope_metrics
                                                for metric in scope.metrics)))
        rows_before = metric_rows(batch)
        for scope in block.scope_metrics:
            for metric in scope.metrics:
                self._metric(metric, node or catalog.UNKNOWN_NODE, batch)
        if node is None:
            self._count("points_node_unknown", metric_rows(batch) - rows_before)

    def _metric(self, metric, node: str, batch: Batch) -> None:
        if metric.name not in catalog.BY_NAME:
            self._skip("points_not_in_catalog")
            return
        kind = metric.WhichOneof("data")
        if kind not in ("gauge", "sum", "exponential_histogram"):
            self._skip("points_unsupported_type")
            return
        data = getattr(metric, kind)
        try:
            cumulative = kind != "gauge" and _temporality(data.aggregation_temporality, metric.name) == \
                TEMPORALITY_CUMULATIVE
        except DecodeError as exc:
            return self._refuse(exc, max(1, len(data.data_points)))
        read = self._histogram_point if kind == "exponential_histogram" else self._number_point
        for point in data.data_points:
            if point.flags & FLAG_NO_RECORDED_VALUE:
                self._skip("points_no_recorded_value")
                continue
            try:
                read(point, metric.name, node, batch, kind == "sum", cumulative)
            except DecodeError as exc:
                self._refuse(exc)

    def _number_point(self, p, name: str, node: str, batch: Batch, is_sum: bool, cumulative: bool) -> None:
        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
        if not math.isfinite(value):
            self._skip("points_not_finite")
            return
        start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
        attrs = self._canonical(p.attributes)
        cols = batch.points
        cols.node.append(node)
        cols.metric.append(name)
        cols.attributes.append(attrs)
        cols.is_sum.append(is_sum)
        cols.cumulative.append(cumulative)
        cols.start_ns.append(start)
        cols.time_ns.append(time)
        cols.value.append(value)

    def _histogram_point(self, p, name: str, node: str, batch: Batch, _is_sum: bool, cumulative: bool) -> None:
        start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
        low, high = (p.min if p.HasField("min") else None), (p.max if p.HasField("max") else None)
        histogram_totals(name, p.count, p.sum, low, high)
        buckets = scale0_buckets(name, p.count, p.scale, p.zero_count, p.positive.offset, p.positive.bucket_counts,
                                 p.negative.bucket_counts)
        attrs = self._canonical(p.attributes)
        cols = batch.histograms
        cols.node.append(node)
        cols.metric.append(name)
        cols.attributes.append(attrs)
        cols.cumulative.append(cumulative)
        cols.start_ns.append(start)
        cols.time_ns.append(time)
        cols.count.append(p.count)
        cols.sum.append(p.sum)
        cols.min.append(low)
        cols.max.append(high)
        cols.buckets.append(buckets)


def _points_of(metric) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def _temporality(value: int, name: str) -> int:
    if value not in (TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE):
        raise DecodeError(f"{name}: aggregation_temporality must be 1 (delta) or 2 (cumulative), got {value}",
                          "points_invalid_metric")
    return value
