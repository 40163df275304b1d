"""Protocol-neutral records that flow between the stages: decoders fill them, enrich completes them, analytics
stores them. Columnar (a list per field, or Arrow arrays from the trace fast path) because a batch holds hundreds
of thousands of rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

# OTLP's SpanKind values (0 is unspecified, which the receiver keeps as INTERNAL, as the specification says to).
SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, SPAN_KIND_CLIENT, SPAN_KIND_PRODUCER, SPAN_KIND_CONSUMER = 1, 2, 3, 4, 5
SPAN_KINDS = {SPAN_KIND_INTERNAL: "internal", SPAN_KIND_SERVER: "server", SPAN_KIND_CLIENT: "client",
              SPAN_KIND_PRODUCER: "producer", SPAN_KIND_CONSUMER: "consumer"}

# Exponential histograms are normalised to scale 0 over one fixed bucket range, so that deltas and merges are
# element-wise: bucket i holds values in (2**(i + HISTOGRAM_OFFSET), 2**(i + 1 + HISTOGRAM_OFFSET)].
# 2**-40 s is about 1 ps and 2**8 s about 4 min: every latency the catalog measures fits.
HISTOGRAM_OFFSET = -40
HISTOGRAM_BUCKETS = 48


@dataclass
class Columns:
    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))

    def as_dict(self) -> dict[str, list]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def extend(self, other: "Columns") -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))


@dataclass
class SpanColumns(Columns):
    """One row per span of any kind, its ids in hex (`parent_id` None for a trace's root). `kind` is OTLP's SpanKind
    (SPAN_KINDS); the SERVER spans are the requests. `peer` is what a CLIENT (or PRODUCER) span says it called
    (peer.service, server.address, Envoy's upstream_cluster), None where it says nothing. `tier_header` is the raw,
    untrusted header value until enrich resolves `tier`; `node` is None when the span names none, until enrich
    places it (by its GPU `gpu_id`, or its pod by name or by `pod_ip`)."""

    trace_id: list = field(default_factory=list)
    span_id: list = field(default_factory=list)
    parent_id: list = field(default_factory=list)
    kind: list = field(default_factory=list)
    peer: list = field(default_factory=list)
    service: list = field(default_factory=list)
    node: list = field(default_factory=list)
    gpu_id: list = field(default_factory=list)
    pod: list = field(default_factory=list)
    namespace: list = field(default_factory=list)
    pod_ip: list = field(default_factory=list)
    route: list = field(default_factory=list)
    tier_header: list = field(default_factory=list)
    tier: list = field(default_factory=list)  # filled by enrich
    start_ns: list = field(default_factory=list)
    end_ns: list = field(default_factory=list)
    status_code: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    # An inference request's token timings (receiver/token_timings.py), None where its span gives none.
    model: list = field(default_factory=list)
    ttft_ms: list = field(default_factory=list)
    tpot_ms: list = field(default_factory=list)
    queue_ms: list = field(default_factory=list)
    prompt_tokens: list = field(default_factory=list)
    output_tokens: list = field(default_factory=list)


@dataclass
class PointColumns(Columns):
    """Gauge and sum data points. `cumulative` sums still need turning into per-interval deltas."""

    node: list = field(default_factory=list)
    metric: list = field(default_factory=list)
    attributes: list = field(default_factory=list)  # canonical JSON text, sorted keys
    is_sum: list = field(default_factory=list)
    cumulative: list = field(default_factory=list)
    start_ns: list = field(default_factory=list)
    time_ns: list = field(default_factory=list)
    value: list = field(default_factory=list)

    def add(self, node, metric, attributes, is_sum, cumulative, start_ns, time_ns, value) -> None:
        """One data point (the decoders' one way of adding a row)."""
        self.node.append(node)
        self.metric.append(metric)
        self.attributes.append(attributes)
        self.is_sum.append(is_sum)
        self.cumulative.append(cumulative)
        self.start_ns.append(start_ns)
        self.time_ns.append(time_ns)
        self.value.append(value)


@dataclass
class HistogramColumns(Columns):
    """Exponential-histogram data points, normalised to scale 0 over the fixed bucket range above."""

    node: list = field(default_factory=list)
    metric: list = field(default_factory=list)
    attributes: list = field(default_factory=list)
    cumulative: list = field(default_factory=list)
    start_ns: list = field(default_factory=list)
    time_ns: list = field(default_factory=list)
    count: list = field(default_factory=list)
    sum: list = field(default_factory=list)
    min: list = field(default_factory=list)
    max: list = field(default_factory=list)
    buckets: list = field(default_factory=list)  # list[int] of HISTOGRAM_BUCKETS; zero bucket folded into 0

    def add(self, node, metric, attributes, cumulative, start_ns, time_ns, count, total, low, high, buckets) -> None:
        """One histogram data point (the decoders' one way of adding a row)."""
        self.node.append(node)
        self.metric.append(metric)
        self.attributes.append(attributes)
        self.cumulative.append(cumulative)
        self.start_ns.append(start_ns)
        self.time_ns.append(time_ns)
        self.count.append(count)
        self.sum.append(total)
        self.min.append(low)
        self.max.append(high)
        self.buckets.append(buckets)


@dataclass
class SpanTable:
    """Spans of every kind already in columns, as the receiver's fast path reads them (receiver/otlp_spans.c): how many,
    each distinct tier header (None: no header) with how many spans carry it, and `batch`, which gives the
    columns in the requests table's shape as an Arrow record batch once each header's tier is known (`tiers`,
    which enrich.tiers sets). Ids are words (analytics/ids.py)."""

    rows: int
    tier_headers: list
    tier_counts: list[int]
    batch: Callable[[list[str]], object]  # taken once
    tiers: list[str] | None = None

    def __len__(self) -> int:
        return self.rows


@dataclass
class Outcome:
    """The intake's answer to one request's batch: the contract between the receiver, which answers the client
    from it, and the intake (sloscope.analytics), which stores the batch."""

    accepted: bool  # False: the intake is full, the client should retry later
    rejected: int = 0
    message: str = ""


@dataclass
class Batch:
    spans: SpanColumns | SpanTable = field(default_factory=SpanColumns)
    points: PointColumns = field(default_factory=PointColumns)
    histograms: HistogramColumns = field(default_factory=HistogramColumns)

    def __len__(self) -> int:
        return len(self.spans) + len(self.points) + len(self.histograms)

    def extend(self, other: "Batch") -> None:
        self.spans.extend(other.spans)
        self.points.extend(other.points)
        self.histograms.extend(other.histograms)
