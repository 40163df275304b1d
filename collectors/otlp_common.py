"""What the OTLP decoders (JSON and protobuf) share: limits, span and metric semantics, row building."""

from __future__ import annotations

from sloscope import catalog
from sloscope.records import HISTOGRAM_BUCKETS, HISTOGRAM_OFFSET

SPAN_KIND_SERVER = 2
STATUS_CODE_ERROR = 2
TEMPORALITY_DELTA = 1
TEMPORALITY_CUMULATIVE = 2
FLAG_NO_RECORDED_VALUE = 1
MAX_ATTRIBUTE_DEPTH = 8
MAX_NAME_LENGTH = 253  # node, service, pod, namespace, route: stored columns, so bounded (a DNS name's limit)
TIER_ATTRIBUTES = ("http.request.header.x-slo-tier", "slo.tier")
GPU_ATTRIBUTE = "hw.id"
POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE = "k8s.pod.name", "k8s.namespace.name"
STATUS_ATTRIBUTES = ("http.response.status_code", "http.status_code")  # current semantic conventions, then old
ROUTE_ATTRIBUTE = "http.route"
SPAN_ATTRIBUTES = frozenset({*STATUS_ATTRIBUTES, ROUTE_ATTRIBUTE, GPU_ATTRIBUTE, POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE,
                             *TIER_ATTRIBUTES, *catalog.NODE_ATTRIBUTES})


MAX_INT64 = 2**63 - 1  # times (ns) and counts are stored as signed 64-bit integers


class DecodeError(ValueError):
    pass


def point_times(name: str, start: int, time: int) -> tuple[int, int]:
    """A data point's start and time (ns), which the store keeps as signed 64-bit integers."""
    if time <= 0:
        raise DecodeError(f"{name}: data point without time_unix_nano")
    if time > MAX_INT64 or not 0 <= start <= MAX_INT64:
        raise DecodeError(f"{name}: time_unix_nano and start_time_unix_nano must be below 2**63")
    return start, time


def node_of(attrs: dict) -> str | None:
    """The node a span or sample belongs to: k8s.node.name, else host.name."""
    for key in catalog.NODE_ATTRIBUTES:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_NAME_LENGTH]
    return None


def service_of(resource_attrs: dict) -> str:
    service = resource_attrs.get("service.name")
    return service[:MAX_NAME_LENGTH] if isinstance(service, str) and service else "unknown_service"


def _text(source: dict, key: str) -> str | None:
    """A string attribute (bounded: these become stored columns)."""
    value = source.get(key)
    return value[:MAX_NAME_LENGTH] if isinstance(value, str) and value else None


# Span attributes that, when present, take the place of the resource's value.
_SPAN_OVERRIDES = frozenset({GPU_ATTRIBUTE, POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE, *catalog.NODE_ATTRIBUTES})


class SpanResource:
    """What a resource says about each of its spans, worked out once per resource rather than per span."""

    __slots__ = ("service", "node", "gpu", "pod", "namespace")

    def __init__(self, resource_attrs: dict):
        self.service = service_of(resource_attrs)
        self.node = node_of(resource_attrs)
        self.gpu = _text(resource_attrs, GPU_ATTRIBUTE)
        self.pod = _text(resource_attrs, POD_ATTRIBUTE)
        self.namespace = _text(resource_attrs, NAMESPACE_ATTRIBUTE)


def append_span(cols, trace_id: str, span_id: str, resource: SpanResource, attrs: dict,
                start: int, end: int, status_error: bool, name: str) -> None:
    """Validate one SERVER span's fields and add it as a row; attrs holds only SPAN_ATTRIBUTES."""
    if start <= 0 or end < start:
        raise DecodeError(f"span {span_id}: end time before start time or no start time")
    if end > MAX_INT64:
        raise DecodeError(f"span {span_id}: times must be below 2**63 ns")
    node, gpu, pod, namespace = resource.node, resource.gpu, resource.pod, resource.namespace
    if not _SPAN_OVERRIDES.isdisjoint(attrs):
        node = node_of(attrs) or node
        gpu = _text(attrs, GPU_ATTRIBUTE) or gpu
        pod = _text(attrs, POD_ATTRIBUTE) or pod
        namespace = _text(attrs, NAMESPACE_ATTRIBUTE) or namespace
    if node is None and gpu is None:
        raise DecodeError("span has neither k8s.node.name, host.name nor hw.id (span or resource attribute)")
    status = next((attrs[k] for k in STATUS_ATTRIBUTES if k in attrs), None)
    if status is not None and type(status) is not int:
        try:
            status = int(status)
        except (TypeError, ValueError):
            raise DecodeError(f"http.response.status_code: expected an integer, got {str(status)[:40]!r}") from None
    if status is not None and not 0 <= status <= 999:
        raise DecodeError(f"http.response.status_code: {str(status)[:40]} is not an HTTP status code")
    route = attrs.get(ROUTE_ATTRIBUTE)
    cols.trace_id.append(trace_id)
    cols.span_id.append(span_id)
    cols.service.append(resource.service)
    cols.node.append(node)
    cols.gpu_id.append(gpu)
    cols.pod.append(pod)
    cols.namespace.append(namespace)
    cols.route.append((route if isinstance(route, str) else name)[:MAX_NAME_LENGTH])
    cols.tier_header.append(next((attrs[k] for k in TIER_ATTRIBUTES if k in attrs), None))
    cols.tier.append(None)
    cols.start_ns.append(start)
    cols.end_ns.append(end)
    cols.status_code.append(status)
    cols.failed.append(status_error or (status is not None and status >= 500))


def scale0_buckets(name: str, scale: int, zero_count: int, offset: int, counts) -> list[int]:
    """An exponential histogram's buckets at any scale, folded onto scale 0 over the store's fixed range."""
    if not -10 <= scale <= 20:
        raise DecodeError(f"{name}: scale {scale} outside [-10, 20]")
    out = [0] * HISTOGRAM_BUCKETS
    out[0] += zero_count
    for k, n in enumerate(counts):
        if n < 0:
            raise DecodeError(f"{name}: negative bucket count")
        if n:
            index = offset + k
            index = index >> scale if scale >= 0 else index << -scale
            out[min(max(index - HISTOGRAM_OFFSET, 0), HISTOGRAM_BUCKETS - 1)] += n
    if max(out) > MAX_INT64:
        raise DecodeError(f"{name}: bucket counts must be below 2**63")
    return out


class Skips:
    """Counts of data that was well-formed but is not kept (not a SERVER span, not in the catalog, ...)."""

    def __init__(self):
        self.skipped: dict[str, int] = {}

    def _skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n
