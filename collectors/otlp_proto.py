"""Decoding of OTLP protobuf export requests (OTLP/HTTP `application/x-protobuf` bodies, OTLP/gRPC messages)
into the same protocol-neutral records as the JSON decoder. A request decodes whole or raises DecodeError."""

from __future__ import annotations

import math

import orjson
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sloscope import catalog
from sloscope.records import Batch

from collectors.otlp_common import (
    FLAG_NO_RECORDED_VALUE, MAX_ATTRIBUTE_DEPTH, MAX_INT64, SPAN_ATTRIBUTES, SPAN_KIND_SERVER, STATUS_CODE_ERROR,
    TEMPORALITY_CUMULATIVE, TEMPORALITY_DELTA, DecodeError, Skips, SpanResource, append_span, node_of, point_times,
    scale0_buckets)

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
    def __init__(self):
        super().__init__()
        self._attr_text: dict[bytes, str] = {}

    def decode(self, request) -> Batch:
        """A batch from an export request as `parse` returns it."""
        batch = Batch()
        if isinstance(request, ExportTraceServiceRequest):
            for block in request.resource_spans:
                self._resource_spans(block, batch)
        elif isinstance(request, ExportMetricsServiceRequest):
            for block in request.resource_metrics:
                self._resource_metrics(block, batch)
        return batch  # logs carry no SLI or catalog signal

    def _canonical(self, items) -> str:
        key = b"".join(kv.SerializeToString() for kv in items)
        text = self._attr_text.get(key)
        if text is None:
            text = orjson.dumps(attributes(items), option=orjson.OPT_SORT_KEYS).decode()
            if len(self._attr_text) < 100_000:
                self._attr_text[key] = text
        return text

    def _resource_spans(self, block, batch: Batch) -> None:
        resource = SpanResource(attributes(block.resource.attributes))
        spans = batch.spans
        for scope in block.scope_spans:
            for span in scope.spans:
                if span.kind != SPAN_KIND_SERVER:
                    self._skip("spans_not_server")
                    continue
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    raise DecodeError("span: trace_id must be 16 bytes and span_id 8 bytes")
                kept = {kv.key: any_value(kv.value) for kv in span.attributes if kv.key in SPAN_ATTRIBUTES}
                append_span(spans, trace_id.hex(), span_id.hex(), resource, kept, span.start_time_unix_nano,
                            span.end_time_unix_nano, span.status.code == STATUS_CODE_ERROR, span.name)

    def _resource_metrics(self, block, batch: Batch) -> None:
        node = node_of(attributes(block.resource.attributes))
        if node is None:
            raise DecodeError("resource has neither k8s.node.name nor host.name")
        for scope in block.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in catalog.BY_NAME:
                    self._skip("points_not_in_catalog")
                    continue
                kind = metric.WhichOneof("data")
                if kind == "gauge":
                    self._number_points(metric.gauge.data_points, metric.name, node, batch, False, False)
                elif kind == "sum":
                    cumulative = _temporality(metric.sum.aggregation_temporality, metric.name) == TEMPORALITY_CUMULATIVE
                    self._number_points(metric.sum.data_points, metric.name, node, batch, True, cumulative)
                elif kind == "exponential_histogram":
                    self._exp_histogram(metric.exponential_histogram, metric.name, node, batch)
                else:
                    self._skip("points_unsupported_type")

    def _number_points(self, points, name: str, node: str, batch: Batch, is_sum: bool, cumulative: bool) -> None:
        cols = batch.points
        for p in points:
            if p.flags & FLAG_NO_RECORDED_VALUE:
                continue
            value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            if not math.isfinite(value):
                self._skip("points_not_finite")
                continue
            start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
            cols.node.append(node)
            cols.metric.append(name)
            cols.attributes.append(self._canonical(p.attributes))
            cols.is_sum.append(is_sum)
            cols.cumulative.append(cumulative)
            cols.start_ns.append(start)
            cols.time_ns.append(time)
            cols.value.append(value)

    def _exp_histogram(self, data, name: str, node: str, batch: Batch) -> None:
        cumulative = _temporality(data.aggregation_temporality, name) == TEMPORALITY_CUMULATIVE
        cols = batch.histograms
        for p in data.data_points:
            if p.flags & FLAG_NO_RECORDED_VALUE:
                continue
            start, time = point_times(name, p.start_time_unix_nano, p.time_unix_nano)
            if p.count > MAX_INT64:
                raise DecodeError(f"{name}: count must be below 2**63")
            buckets = scale0_buckets(name, p.scale, p.zero_count, p.positive.offset, p.positive.bucket_counts)
            cols.node.append(node)
            cols.metric.append(name)
            cols.attributes.append(self._canonical(p.attributes))
            cols.cumulative.append(cumulative)
            cols.start_ns.append(start)
            cols.time_ns.append(time)
            cols.count.append(p.count)
            cols.sum.append(p.sum)
            cols.min.append(p.min if p.HasField("min") else None)
            cols.max.append(p.max if p.HasField("max") else None)
            cols.buckets.append(buckets)


def _temporality(value: int, name: str) -> int:
    if value not in (TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE):
        raise DecodeError(f"{name}: aggregation_temporality must be 1 (delta) or 2 (cumulative), got {value}")
    return value
