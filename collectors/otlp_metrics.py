"""Probe samples -> the OpenTelemetry SDK's metrics data model, and back from OTLP protobuf.

The SDK's instruments aggregate raw measurements themselves, which does not fit what the probes hand over:
counter increases and kernel histograms that are already aggregated (probes/sample.py). So each interval
`MetricsBuilder.build()` assembles the SDK's export data model directly (`MetricsData` / `ResourceMetrics` /
`ScopeMetrics` / `Metric` with `Gauge`, `Sum` or `ExponentialHistogram` points) and the agent hands it to
the SDK's `OTLPMetricExporter` (gRPC or HTTP/protobuf), which encodes it with the SDK's own encoder.

Temporality
-----------
Counters (`Sample` kind "counter_delta") and histograms (`HistogramSample`, scale-0 exponential buckets)
arrive as deltas. By default they are exported **cumulative** (the OTLP default): per series a running total
and a fixed start time (the start of the first delta the series ever had in this process). Why:

- a batch lost for good (dropped past the spool bound) loses resolution, never counts: the next point
  still carries the whole total;
- a repeated point (an export that timed out after the receiver took it, then replayed) is recognisable
  as one (its time is not after the last point stored for the series), and `analytics/store.py` turns
  cumulative points back into per-interval deltas, handling resets by the start time;
- Prometheus-compatible pipelines (otelcol's prometheus / remote-write exporters) want cumulative.

A series is exported in the intervals its probe reported it (eBPF histograms only report series that saw
events), so an idle series costs nothing; its state is forgotten after `idle_expiry_s` without reports (a
returning series gets a new start time, which the store reads as a restart counted from that start).
`temporality="delta"` passes the probes' deltas through instead.

Gauges are exported as they are read.

Replay
------
`metrics_data_from_request()` is the inverse of the SDK's `encode_metrics()` for the data this module
builds (gauges, sums, exponential histograms), so a spooled `ExportMetricsServiceRequest` can go back
through the same SDK exporter: `encode_metrics(metrics_data_from_request(r)) == r`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Iterable, Mapping

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from sloscope.probes.sample import AnySample, HistogramSample, Sample
from sloscope import catalog

SCOPE_NAME = "sloscope.collector"
TEMPORALITIES = ("cumulative", "delta")
DEFAULT_IDLE_EXPIRY_S = 600.0


def _version() -> str:
    try:
        return version("sloscope")
    except Exception:  # not installed (running from a checkout)
        return "0"


SCOPE = InstrumentationScope(SCOPE_NAME, _version())


def _key(name: str, attributes: Mapping) -> tuple:
    return name, tuple(sorted(attributes.items()))


@dataclass(slots=True)
class _SumState:
    start_ns: int
    total: float = 0.0
    last_seen: float = 0.0


@dataclass(slots=True)
class _HistogramState:
    start_ns: int
    scale: int
    count: int = 0
    sum: float = 0.0
    zero_count: int = 0
    buckets: dict[int, int] = field(default_factory=dict)  # bucket index -> count
    min: float | None = None
    max: float | None = None
    last_seen: float = 0.0


def _rescale(buckets: Mapping[int, int], by: int) -> dict[int, int]:
    """Buckets of a histogram at scale s as buckets at scale s - by (by >= 0): 2^by neighbours merge."""
    out: dict[int, int] = {}
    for i, c in buckets.items():
        j = i >> by
        out[j] = out.get(j, 0) + c
    return out


def _sample_buckets(s: HistogramSample) -> dict[int, int]:
    return {s.positive_offset + j: c for j, c in enumerate(s.positive_bucket_counts) if c}


def _dense(buckets: Mapping[int, int]) -> Buckets:
    if not buckets:
        return Buckets(offset=0, bucket_counts=[])
    lo, hi = min(buckets), max(buckets)
    return Buckets(offset=lo, bucket_counts=[buckets.get(i, 0) for i in range(lo, hi + 1)])


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _meta(name: str) -> tuple[str, str]:
    try:
        sig = catalog.signal(name)
    except KeyError:
        return "", ""
    return sig.unit, sig.description


class MetricsBuilder:
    """Turns each interval's probe samples into one SDK `MetricsData` (one resource, one scope)."""

    def __init__(self, resource: Resource, temporality: str = "cumulative",
                 idle_expiry_s: float = DEFAULT_IDLE_EXPIRY_S, clock=time.monotonic):
        if temporality not in TEMPORALITIES:
            raise ValueError(f"temporality must be one of {', '.join(TEMPORALITIES)}, not {temporality!r}")
        self.resource = resource
        self.temporality = temporality
        self.idle_expiry_s = idle_expiry_s
        self.clock = clock
        self._sums: dict[tuple, _SumState] = {}
        self._histograms: dict[tuple, _HistogramState] = {}

    @property
    def series(self) -> int:
        """Cumulative series held in memory."""
        return len(self._sums) + len(self._histograms)

    def build(self, samples: Iterable[AnySample]) -> MetricsData | None:
        """The export data of one interval, or None when there is nothing to export."""
        now = self.clock()
        gauges: dict[str, list[NumberDataPoint]] = {}
        sums: dict[str, list[NumberDataPoint]] = {}
        hists: dict[str, list[ExponentialHistogramDataPoint]] = {}
        for s in samples:
            if isinstance(s, HistogramSample):
                hists.setdefault(s.name, []).append(self._histogram_point(s, now))
            elif s.kind == "gauge":
                gauges.setdefault(s.name, []).append(NumberDataPoint(
                    attributes=dict(s.attributes), start_time_unix_nano=s.start_time_unix_nano,
                    time_unix_nano=s.time_unix_nano, value=float(s.value)))
            elif s.kind == "counter_delta":
                sums.setdefault(s.name, []).append(self._sum_point(s, now))
            else:
                raise ValueError(f"{s.name}: unknown sample kind {s.kind!r}")
        self._expire(now)
        temporality = (AggregationTemporality.CUMULATIVE if self.temporality == "cumulative"
                       else AggregationTemporality.DELTA)
        metrics: list[Metric] = []
        for name in sorted(set(gauges) | set(sums) | set(hists)):
            unit, description = _meta(name)
            if name in gauges:
                metrics.append(Metric(name, description, unit, Gauge(data_points=gauges[name])))
            if name in sums:
                metrics.append(Metric(name, description, unit, Sum(
                    data_points=sums[name], aggregation_temporality=temporality, is_monotonic=True)))
            if name in hists:
                metrics.append(Metric(name, description, unit, ExponentialHistogram(
                    data_points=hists[name], aggregation_temporality=temporality)))
        if not metrics:
            return None
        return MetricsData(resource_metrics=[ResourceMetrics(
            resource=self.resource, scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
            schema_url="")])

    def _sum_point(self, s: Sample, now: float) -> NumberDataPoint:
        if self.temporality == "delta":
            return NumberDataPoint(attributes=dict(s.attributes), start_time_unix_nano=s.start_time_unix_nano,
                                   time_unix_nano=s.time_unix_nano, value=float(s.value))
        key = _key(s.name, s.attributes)
        state = self._sums.get(key)
        if state is None:
            state = self._sums[key] = _SumState(start_ns=s.start_time_unix_nano)
        state.total += max(0.0, float(s.value))  # a monotonic sum never goes down
        state.last_seen = now
        return NumberDataPoint(attributes=dict(s.attributes), start_time_unix_nano=state.start_ns,
                               time_unix_nano=s.time_unix_nano, value=state.total)

    def _histogram_point(self, s: HistogramSample, now: float) -> ExponentialHistogramDataPoint:
        if self.temporality == "delta":
            return ExponentialHistogramDataPoint(
                attributes=dict(s.attributes), start_time_unix_nano=s.start_time_unix_nano,
                time_unix_nano=s.time_unix_nano, count=s.count, sum=s.sum, scale=s.scale,
                zero_count=s.zero_count, positive=Buckets(s.positive_offset, list(s.positive_bucket_counts)),
                negative=Buckets(0, []), flags=0, min=s.min, max=s.max)
        key = _key(s.name, s.attributes)
        state = self._histograms.get(key)
        if state is None:
            state = self._histograms[key] = _HistogramState(start_ns=s.start_time_unix_nano, scale=s.scale)
        incoming = _sample_buckets(s)
        if s.scale > state.scale:
            incoming = _rescale(incoming, s.scale - state.scale)
        elif s.scale < state.scale:
            state.buckets = _rescale(state.buckets, state.scale - s.scale)
            state.scale = s.scale
        for i, c in incoming.items():
            state.buckets[i] = state.buckets.get(i, 0) + c
        state.count += s.count
        state.sum += s.sum
        state.zero_count += s.zero_count
        state.min = _min(state.min, s.min)
        state.max = _max(state.max, s.max)
        state.last_seen = now
        return ExponentialHistogramDataPoint(
            attributes=dict(s.attributes), start_time_unix_nano=state.start_ns, time_unix_nano=s.time_unix_nano,
            count=state.count, sum=state.sum, scale=state.scale, zero_count=state.zero_count,
            positive=_dense(state.buckets), negative=Buckets(0, []), flags=0, min=state.min, max=state.max)

    def _expire(self, now: float) -> None:
        if not self.idle_expiry_s or self.idle_expiry_s <= 0 or math.isinf(self.idle_expiry_s):
            return
        for table in (self._sums, self._histograms):
            stale = [k for k, st in table.items() if now - st.last_seen > self.idle_expiry_s]
            for k in stale:
                del table[k]


def count_points(data: MetricsData | ExportMetricsServiceRequest) -> int:
    """Data points in an SDK MetricsData or an OTLP export request."""
    n = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if isinstance(m, Metric):
                    n += len(m.data.data_points)
                else:
                    kind = m.WhichOneof("data")
                    n += len(getattr(m, kind).data_points) if kind else 0
    return n


# ---------------------------------------------------------------------------------------------------------
# OTLP protobuf -> SDK data model (for replaying spooled requests through the SDK exporter)


def _any_value(v: common_pb2.AnyValue):
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "bytes_value":
        return v.bytes_value
    if kind == "array_value":
        return tuple(_any_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    return None


def _attributes(kvs) -> dict:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _number(p):
    return p.as_int if p.WhichOneof("value") == "as_int" else p.as_double


def _number_points(points) -> list[NumberDataPoint]:
    return [NumberDataPoint(attributes=_attributes(p.attributes), start_time_unix_nano=p.start_time_unix_nano,
                            time_unix_nano=p.time_unix_nano, value=_number(p)) for p in points]


def _exp_points(points) -> list[ExponentialHistogramDataPoint]:
    return [ExponentialHistogramDataPoint(
        attributes=_attributes(p.attributes), start_time_unix_nano=p.start_time_unix_nano,
        time_unix_nano=p.time_unix_nano, count=p.count, sum=p.sum, scale=p.scale, zero_count=p.zero_count,
        positive=Buckets(p.positive.offset, list(p.positive.bucket_counts)),
        negative=Buckets(p.negative.offset, list(p.negative.bucket_counts)), flags=p.flags,
        min=p.min if p.HasField("min") else None, max=p.max if p.HasField("max") else None)
        for p in points]


def metrics_data_from_request(request: ExportMetricsServiceRequest) -> MetricsData:
    """The SDK data model of an export request holding gauges, sums and exponential histograms (what
    `MetricsBuilder` produces). Other point types raise ValueError."""
    resource_metrics = []
    for rm in request.resource_metrics:
        scopes = []
        for sm in rm.scope_metrics:
            metrics = []
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind == "gauge":
                    data = Gauge(data_points=_number_points(m.gauge.data_points))
                elif kind == "sum":
                    data = Sum(data_points=_number_points(m.sum.data_points),
                               aggregation_temporality=AggregationTemporality(m.sum.aggregation_temporality),
                               is_monotonic=m.sum.is_monotonic)
                elif kind == "exponential_histogram":
                    data = ExponentialHistogram(
                        data_points=_exp_points(m.exponential_histogram.data_points),
                        aggregation_temporality=AggregationTemporality(
                            m.exponential_histogram.aggregation_temporality))
                else:
                    raise ValueError(f"metric {m.name!r}: {kind} points are not replayable")
                metrics.append(Metric(m.name, m.description, m.unit, data))
            scope = InstrumentationScope(sm.scope.name, sm.scope.version or None, sm.schema_url or None,
                                         _attributes(sm.scope.attributes) or None)
            scopes.append(ScopeMetrics(scope=scope, metrics=metrics, schema_url=sm.schema_url))
        resource = Resource(_attributes(rm.resource.attributes), rm.schema_url or None)
        resource_metrics.append(ResourceMetrics(resource=resource, scope_metrics=scopes, schema_url=rm.schema_url))
    return MetricsData(resource_metrics=resource_metrics)


def encode(data: MetricsData) -> ExportMetricsServiceRequest:
    """The OTLP export request the SDK's exporters send for `data` (the SDK's own encoder)."""
    return encode_metrics(data)
