"""What the OTLP decoders (JSON and protobuf) share: limits, span and metric semantics, row building, and the
refusal of single invalid items.

Every value the store constrains is checked here, before a row exists, so that no input makes a store write
fail: an invalid span or data point is refused alone with a reason (an ingest counter, REFUSAL_REASONS), and
the rest of its request is kept.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import orjson

from sloscope import catalog
from sloscope.metric_rules import MetricRule
from sloscope.records import HISTOGRAM_BUCKETS, HISTOGRAM_OFFSET, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, SPAN_KINDS

from sloscope.receiver.token_timings import NONE, TOKEN_ATTRIBUTES, token_timings

SPAN_KIND_UNSPECIFIED = 0  # kept as INTERNAL, as OTLP says to treat it
STATUS_CODE_ERROR = 2
TEMPORALITY_DELTA = 1
TEMPORALITY_CUMULATIVE = 2
FLAG_NO_RECORDED_VALUE = 1
MAX_ATTRIBUTE_DEPTH = 8
MAX_NAME_LENGTH = 253  # node, service, pod, namespace, route, peer: stored, so bounded (a DNS name's limit)
TIER_ATTRIBUTES = catalog.TIER_ATTRIBUTES
GPU_ATTRIBUTE = "hw.id"
POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE, POD_IP_ATTRIBUTE = "k8s.pod.name", "k8s.namespace.name", "k8s.pod.ip"
# Envoy's tags: the proxy's node id (Istio: TYPE~POD_IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN), Istio's service name.
ENVOY_NODE_ATTRIBUTE, CANONICAL_SERVICE_ATTRIBUTE = "node_id", "istio.canonical_service"
ISTIO_PROXY_TYPES = ("sidecar", "router")  # a workload's sidecar, a gateway
UNKNOWN_SERVICE = "unknown_service"  # also the SDKs' default prefix (unknown_service:python)
ISTIO_DEFAULT_SERVICE = "istio-proxy"  # Istio's tracing service name for a proxy without app labels
STATUS_ATTRIBUTES = ("http.response.status_code", "http.status_code")  # current semantic conventions, then old
ROUTE_ATTRIBUTE = "http.route"
# What a span called, first given first: the semantic conventions' peer.service, Envoy's upstream_cluster tag, the
# current server.address, then the old net.peer.name.
PEER_SERVICE_ATTRIBUTE, UPSTREAM_CLUSTER_ATTRIBUTE = "peer.service", "upstream_cluster"
PEER_ATTRIBUTES = (PEER_SERVICE_ATTRIBUTE, UPSTREAM_CLUSTER_ATTRIBUTE, "server.address", "net.peer.name")
SPAN_ATTRIBUTES = frozenset({*STATUS_ATTRIBUTES, ROUTE_ATTRIBUTE, GPU_ATTRIBUTE, POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE,
                             POD_IP_ATTRIBUTE, ENVOY_NODE_ATTRIBUTE, CANONICAL_SERVICE_ATTRIBUTE, *TIER_ATTRIBUTES,
                             *catalog.NODE_ATTRIBUTES, *PEER_ATTRIBUTES, *TOKEN_ATTRIBUTES})


MAX_INT64 = 2**63 - 1  # times (ns) and counts are stored as signed 64-bit integers


# Why a single span or data point is refused: each is an ingest counter, and the partial success names them.
REFUSAL_REASONS = {
    "spans_invalid": "not a span object, a field of the wrong type, or a span kind outside 0..5",
    "spans_invalid_id": "a trace id that is not 16 bytes (32 hex digits), or a span or parent span id not 8 (16)",
    "spans_invalid_time": "no start time, an end before the start, or times past 2**63 ns",
    "spans_invalid_status_code": "http.response.status_code not an integer (or decimal digits) in 0..999",
    "spans_invalid_attribute": "an attribute value of the wrong type or nested too deep",
    "spans_invalid_resource": "a resource or scope that is not an object, or has malformed attributes",
    "points_invalid": "not a data point object, or a field of the wrong type",
    "points_invalid_time": "no time, a start after the time, or times past 2**63 ns",
    "points_invalid_value": "neither asDouble nor asInt, or one that is not a number",
    "points_invalid_count": "a negative count, one past 2**63, or one that the buckets do not add up to",
    "points_invalid_buckets": "a negative bucket count, a scale outside [-10, 20], or a bucket past 2**63",
    "points_invalid_sum": "a sum, min or max that is not finite, or a min above the max",
    "points_out_of_range": "a gauge or sum value beyond +-2**63, a ratio (unit 1) outside (-1, 2) or a percentage "
                           "outside (-100, 200), or a negative increase of a counter",
    "points_invalid_attribute": "an attribute value of the wrong type or nested too deep",
    "points_invalid_metric": "a metric that is not an object, or a temporality other than delta or cumulative",
    "points_invalid_resource": "a resource or scope that is not an object, or has malformed attributes",
}
# Well-formed data that is not kept, also reported back as rejected.
UNKEPT_REASONS = {"points_not_finite": "a gauge or sum value that is not finite",
                  "points_blank": "a value at or above its signal's blank sentinel (DCGM: a field with no value)",
                  "points_no_sum": "an explicit-bucket histogram point without a sum (its mean is unknown)",
                  "points_unsupported_type": "a metric type other than gauge, sum and exponential histogram (and "
                                             "explicit-bucket histogram, for the catalog's engine histograms "
                                             "and declared metrics)"}


class DecodeError(ValueError):
    """Invalid input. `reason` (a REFUSAL_REASONS key) when it concerns one item, which is then refused alone."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # crosses process boundaries (decode workers) with its reason
        return type(self), (str(self), self.reason)


def refusal_message(counts: dict) -> str:
    """What was refused and why, from counters: the partial success's error_message."""
    parts = [f"{counts[k]} {k} ({why})" for k, why in {**REFUSAL_REASONS, **UNKEPT_REASONS}.items() if counts.get(k)]
    return "refused: " + "; ".join(parts)


def valueless_point(name: str) -> DecodeError:
    """The refusal of a gauge or sum point with neither value, which protobuf would read as a 0 never measured."""
    return DecodeError(f"{name}: data point has neither asDouble nor asInt", "points_invalid_value")


def point_times(name: str, start: int, time: int) -> tuple[int, int]:
    """A data point's start and time (ns), which the store keeps as signed 64-bit integers."""
    if time <= 0:
        raise DecodeError(f"{name}: data point without time_unix_nano", "points_invalid_time")
    if time > MAX_INT64 or not 0 <= start <= MAX_INT64:
        raise DecodeError(f"{name}: time_unix_nano and start_time_unix_nano must be below 2**63",
                          "points_invalid_time")
    if start > time:
        raise DecodeError(f"{name}: start_time_unix_nano after time_unix_nano", "points_invalid_time")
    return start, time


def histogram_totals(name: str, count: int, total: float, low: float | None, high: float | None) -> None:
    """An exponential histogram point's count, sum, min and max, as the store keeps them (UBIGINT, DOUBLE)."""
    if not 0 <= count <= MAX_INT64:
        raise DecodeError(f"{name}: count must be in [0, 2**63)", "points_invalid_count")
    if not (math.isfinite(total) and (low is None or math.isfinite(low)) and (high is None or math.isfinite(high))):
        raise DecodeError(f"{name}: sum, min and max must be finite", "points_invalid_sum")
    if low is not None and high is not None and low > high:
        raise DecodeError(f"{name}: min above max", "points_invalid_sum")


def node_of(attrs: dict) -> str | None:
    """The node a span or sample belongs to: k8s.node.name, else host.name."""
    for key in catalog.NODE_ATTRIBUTES:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_NAME_LENGTH]
    return None


def service_of(resource_attrs: dict) -> str:
    service = resource_attrs.get("service.name")
    return service[:MAX_NAME_LENGTH] if isinstance(service, str) and service else UNKNOWN_SERVICE



def mesh_service(service: str, canonical: str | None) -> str:
    """The service of a span that names Istio's canonical service: that name, unless the resource's service.name
    is one the operator chose. Envoy's own defaults are none (unknown_service..., istio-proxy, and Istio's
    default APP.NAMESPACE naming, which starts with the canonical name)."""
    if canonical is None:
        return service
    if service.startswith(UNKNOWN_SERVICE) or service == ISTIO_DEFAULT_SERVICE or service.startswith(canonical + "."):
        return canonical
    return service


def envoy_node(node_id) -> tuple[str | None, str | None, str | None]:
    """(pod, namespace, pod IP) from an Istio proxy's node id, e.g. sidecar~10.4.1.7~ratings-v1-5f9c.bookinfo~
    bookinfo.svc.cluster.local; (None, None, None) from anything else (a node id of plain Envoy is free text)."""
    parts = node_id.split("~") if isinstance(node_id, str) else ()
    if len(parts) != 4 or parts[0] not in ISTIO_PROXY_TYPES or not all(parts[1:]):
        return None, None, None
    namespace = parts[3].split(".", 1)[0]
    if not namespace:
        return None, None, None
    suffix = "." + namespace
    pod = parts[2][:-len(suffix)] if parts[2].endswith(suffix) and len(parts[2]) > len(suffix) else parts[2]
    return pod[:MAX_NAME_LENGTH], namespace[:MAX_NAME_LENGTH], parts[1][:MAX_NAME_LENGTH]


def span_kind(kind: int) -> int:
    """A span's OTLP SpanKind as kept: UNSPECIFIED as INTERNAL; a value OTLP does not define refuses the span."""
    if kind == SPAN_KIND_UNSPECIFIED:
        return SPAN_KIND_INTERNAL
    if kind not in SPAN_KINDS:
        raise DecodeError(f"span kind {str(kind)[:40]} is none of OTLP's (0 to 5)", "spans_invalid")
    return kind


def peer_of(attrs: dict) -> str | None:
    """What a span says it called: the first of PEER_ATTRIBUTES that names something, bounded; else None."""
    for key in PEER_ATTRIBUTES:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            if key == UPSTREAM_CLUSTER_ATTRIBUTE:
                value = upstream_peer(value)
                if not value:
                    continue
            return value[:MAX_NAME_LENGTH]
    return None


def upstream_peer(cluster: str) -> str:
    """The peer an Envoy upstream cluster names ("": none). Istio names its clusters DIRECTION|PORT|SUBSET|HOST:
    an outbound one names the first DNS label of its host (outbound|7070||cartservice.default.svc.cluster.local:
    cartservice), an inbound one the proxy's own workload, so no peer. Any other cluster name is kept as it is."""
    parts = cluster.split("|")
    if len(parts) != 4 or parts[0] not in ("outbound", "inbound"):
        return cluster
    return parts[3].split(".", 1)[0] if parts[0] == "outbound" else ""


def _text(source: dict, key: str) -> str | None:
    """A string attribute (bounded: these become stored columns)."""
    value = source.get(key)
    return value[:MAX_NAME_LENGTH] if isinstance(value, str) and value else None


# Span attributes that, when present, take the place of the resource's value.
_SPAN_OVERRIDES = frozenset({GPU_ATTRIBUTE, POD_ATTRIBUTE, NAMESPACE_ATTRIBUTE, POD_IP_ATTRIBUTE, ENVOY_NODE_ATTRIBUTE,
                             *catalog.NODE_ATTRIBUTES})


class SpanResource:
    """What a resource says about each of its spans, worked out once per resource rather than per span."""

    __slots__ = ("service", "node", "gpu", "pod", "namespace", "pod_ip")

    def __init__(self, resource_attrs: dict):
        self.service = service_of(resource_attrs)
        self.node = node_of(resource_attrs)
        self.gpu = _text(resource_attrs, GPU_ATTRIBUTE)
        self.pod = _text(resource_attrs, POD_ATTRIBUTE)
        self.namespace = _text(resource_attrs, NAMESPACE_ATTRIBUTE)
        self.pod_ip = _text(resource_attrs, POD_IP_ATTRIBUTE)


def append_span(cols, trace_id: str, span_id: str, parent_id: str | None, kind: int, resource: SpanResource,
                attrs: dict, start: int, end: int, status_error: bool, name: str) -> str | None:
    """Validate one span's fields and add it as a row; ids in hex (parent_id None for a root), kind as span_kind
    gives it, attrs holding only SPAN_ATTRIBUTES. The counter its token timings count into, if any
    (receiver/token_timings.py)."""
    if start <= 0 or end < start:
        raise DecodeError(f"span {span_id}: end time before start time or no start time", "spans_invalid_time")
    if end > MAX_INT64:
        raise DecodeError(f"span {span_id}: times must be below 2**63 ns", "spans_invalid_time")
    node, gpu, pod, namespace, pod_ip = resource.node, resource.gpu, resource.pod, resource.namespace, resource.pod_ip
    if not _SPAN_OVERRIDES.isdisjoint(attrs):
        node = node_of(attrs) or node
        gpu = _text(attrs, GPU_ATTRIBUTE) or gpu
        pod = _text(attrs, POD_ATTRIBUTE) or pod
        namespace = _text(attrs, NAMESPACE_ATTRIBUTE) or namespace
        pod_ip = _text(attrs, POD_IP_ATTRIBUTE) or pod_ip
        proxy_pod, proxy_namespace, proxy_ip = envoy_node(attrs.get(ENVOY_NODE_ATTRIBUTE))
        pod, namespace, pod_ip = pod or proxy_pod, namespace or proxy_namespace, pod_ip or proxy_ip
    status = next((attrs[k] for k in STATUS_ATTRIBUTES if k in attrs), None)
    if status is not None and type(status) is not int:
        status = _status_code(span_id, status)
    if status is not None and not 0 <= status <= 999:
        raise DecodeError(f"span {span_id}: http.response.status_code: {str(status)[:40]} is not an HTTP status "
                          "code", "spans_invalid_status_code")
    route = attrs.get(ROUTE_ATTRIBUTE)
    tokens, counter = (token_timings(attrs, (end - start) / 1e6, kind == SPAN_KIND_SERVER)
                       if not TOKEN_ATTRIBUTES.isdisjoint(attrs) else (NONE, None))
    cols.trace_id.append(trace_id)
    cols.span_id.append(span_id)
    cols.parent_id.append(parent_id)
    cols.kind.append(kind)
    cols.peer.append(peer_of(attrs))
    cols.service.append(mesh_service(resource.service, _text(attrs, CANONICAL_SERVICE_ATTRIBUTE)))
    cols.node.append(node)
    cols.gpu_id.append(gpu)
    cols.pod.append(pod)
    cols.namespace.append(namespace)
    cols.pod_ip.append(pod_ip)
    cols.route.append((route if isinstance(route, str) else name)[:MAX_NAME_LENGTH])
    cols.tier_header.append(next((attrs[k] for k in TIER_ATTRIBUTES if k in attrs), None))
    cols.tier.append(None)
    cols.start_ns.append(start)
    cols.end_ns.append(end)
    cols.status_code.append(status)
    cols.failed.append(status_error or (status is not None and status >= 500))
    cols.model.append(tokens.model)
    cols.ttft_ms.append(tokens.ttft_ms)
    cols.tpot_ms.append(tokens.tpot_ms)
    cols.queue_ms.append(tokens.queue_ms)
    cols.prompt_tokens.append(tokens.prompt_tokens)
    cols.output_tokens.append(tokens.output_tokens)
    return counter


def _status_code(span_id: str, status) -> int:
    """A status code given as other than an integer: decimal digits (Envoy writes its tags as strings), or an
    integral double."""
    if isinstance(status, str):
        if not (status.isascii() and status.isdigit()):
            raise DecodeError(f"span {span_id}: http.response.status_code: expected an integer, got "
                              f"{status[:40]!r}", "spans_invalid_status_code")
        digits = status.lstrip("0")
        return int(digits or "0") if len(digits) <= 3 else 1000  # past 999 either way: refused below
    try:
        return int(status)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite double
        raise DecodeError(f"span {span_id}: http.response.status_code: expected an integer, got "
                          f"{str(status)[:40]!r}", "spans_invalid_status_code") from None


def scale0_buckets(name: str, count: int, scale: int, zero_count: int, offset: int, counts, negative) -> list[int]:
    """An exponential histogram's buckets at any scale, folded onto scale 0 over the store's fixed range; its
    count must be what the zero, positive and `negative` buckets add up to, as OTLP defines it."""
    if not -10 <= scale <= 20:
        raise DecodeError(f"{name}: scale {scale} outside [-10, 20]", "points_invalid_buckets")
    if zero_count < 0 or (negative and min(negative) < 0):
        raise DecodeError(f"{name}: negative bucket count", "points_invalid_buckets")
    out = [0] * HISTOGRAM_BUCKETS
    out[0] += zero_count
    for k, n in enumerate(counts):
        if n < 0:
            raise DecodeError(f"{name}: negative bucket count", "points_invalid_buckets")
        if n:
            index = offset + k
            index = index >> scale if scale >= 0 else index << -scale
            out[min(max(index - HISTOGRAM_OFFSET, 0), HISTOGRAM_BUCKETS - 1)] += n
    if max(out) > MAX_INT64:
        raise DecodeError(f"{name}: bucket counts must be below 2**63", "points_invalid_buckets")
    if zero_count + sum(counts) + sum(negative) != count:
        raise DecodeError(f"{name}: count {count} is not the sum of its bucket counts", "points_invalid_count")
    return out


def explicit_buckets(name: str, count: int, bounds, counts) -> list[int]:
    """An explicit-bucket histogram's buckets folded onto the store's scale-0 range: each bucket's count goes to
    the scale-0 bucket of its upper bound (the last, unbounded one: of its lower bound), so the buckets are
    approximate while count and sum stay exact. Its count must be what the buckets add up to."""
    bounds, counts = list(bounds), list(counts)
    if counts and len(counts) != len(bounds) + 1:
        raise DecodeError(f"{name}: {len(counts)} bucket counts for {len(bounds)} bounds (expected one more)",
                          "points_invalid_buckets")
    if not all(math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise DecodeError(f"{name}: explicit bounds must be finite and increasing", "points_invalid_buckets")
    if any(n < 0 or n > MAX_INT64 for n in counts):
        raise DecodeError(f"{name}: bucket counts must be in [0, 2**63)", "points_invalid_buckets")
    if counts and sum(counts) != count:
        raise DecodeError(f"{name}: count {count} is not the sum of its bucket counts", "points_invalid_count")
    out = [0] * HISTOGRAM_BUCKETS
    for k, n in enumerate(counts):
        edge = bounds[k] if k < len(bounds) else bounds[-1] if bounds else 0.0
        if n and edge > 0:  # exponent j holds (2**j, 2**(j+1)]; slot j - HISTOGRAM_OFFSET of the store
            index = math.ceil(math.log2(edge)) - 1 - HISTOGRAM_OFFSET
            out[min(max(index, 0), HISTOGRAM_BUCKETS - 1)] += n
        else:
            out[0] += n
    return out


class TextCache:
    """Canonical attribute texts by their raw encoding, which repeat for every data point of a series. Bounded
    in bytes: when full it starts over, so a stream of ever-new attribute sets costs no more than the bound."""

    MAX_BYTES = 4 * 2**20  # per decoder: one JSON and one protobuf decoder per request thread and decode worker
    MAX_ENTRY_BYTES = 4096  # a larger attribute set is rare and not worth keeping
    ENTRY_OVERHEAD = 160  # the key's bytes and the text's str objects and their dict slot, beyond their lengths

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._texts: dict[bytes, str] = {}

    def get(self, key: bytes) -> str | None:
        return self._texts.get(key)

    def canonical(self, key: bytes, attributes_of: Callable[[], dict], rule: MetricRule, resource_part: dict) -> str:
        """The canonical JSON text (sorted keys) of a data point's attributes, `attributes_of()` made into text
        with the resource attributes its rule keeps, less those it drops, only when `key` (their raw form and
        the rule's) is not cached."""
        text = self.get(key)
        if text is None:
            try:
                kept = {k: v for k, v in attributes_of().items() if k not in rule.dropped_attributes}
                text = orjson.dumps({**kept, **resource_part}, option=orjson.OPT_SORT_KEYS).decode()
            except DecodeError as exc:
                raise DecodeError(str(exc), "points_invalid_attribute") from None
            self.put(key, text)
        return text

    def put(self, key: bytes, text: str) -> None:
        size = len(key) + len(text) + self.ENTRY_OVERHEAD
        if size > self.MAX_ENTRY_BYTES:
            return
        if self.bytes + size > self.max_bytes:
            self._texts.clear()
            self.bytes = 0
        self._texts[key] = text
        self.bytes += size


class MetricResource:
    """What a resource says about each of its data points: its node (None: the points may name theirs) and its
    attributes, for the rules that keep some of them."""

    __slots__ = ("node", "attributes")

    def __init__(self, resource_attrs: dict):
        self.node = node_of(resource_attrs)
        self.attributes = resource_attrs


class MetricSeries(NamedTuple):
    """What the data points of one metric of one resource share."""

    name: str
    rule: MetricRule
    resource: MetricResource
    resource_part: dict  # the resource attributes kept among each point's attributes
    # What, beside a point's raw attributes, its canonical text depends on: the cache key's other part.
    text_key: bytes

    @classmethod
    def of(cls, name: str, rule: MetricRule, resource: MetricResource) -> MetricSeries:
        part = rule.resource_part(resource.attributes)
        dropped = "\0".join(sorted(rule.dropped_attributes))
        # empty for most series, so that most keys are the raw attributes alone, not a concatenation
        return cls(name, rule, resource, part,
                   (orjson.dumps(part) if part else b"") + (b"\0" + dropped.encode() if dropped else b""))


class Skips:
    """Counts of data that was well-formed but is not kept (a metric not in the catalog, ...), and of
    items refused as invalid (REFUSAL_REASONS), which also count into `skipped`."""

    def __init__(self):
        self.skipped: dict[str, int] = {}
        self._start_request()

    def _start_request(self) -> None:
        self.refused: dict[str, int] = {}  # of the request being decoded
        self.first_refusal = ""
        self._well_formed_skips = 0

    def _skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n
        self._well_formed_skips += n

    def _count(self, name: str, n: int) -> None:
        if n:
            self.skipped[name] = self.skipped.get(name, 0) + n

    def _unkept_value(self, value: float, series: MetricSeries, increase: bool) -> bool:
        """Whether a gauge or sum value is not kept (not finite, or DCGM's blank), counted; DecodeError
        (points_out_of_range) for one outside its metric's range, or a catalog counter's negative `increase` (a
        delta sum's point)."""
        rule = series.rule
        if not math.isfinite(value):
            self._skip("points_not_finite")
            return True
        if value >= rule.blank_from:
            self._skip("points_blank")
            return True
        if not rule.low < value < rule.high:
            raise DecodeError(f"{series.name}: value {value:g} outside ({rule.low:g}, {rule.high:g})",
                              "points_out_of_range")
        if increase and rule.counter and value < 0:
            raise DecodeError(f"{series.name}: a counter cannot increase by {value:g}", "points_out_of_range")
        return False

    def _placed(self, node: str | None) -> str:
        """The node a data point is stored on: its own, else the unknown node (counted)."""
        if node is None:
            self._count("points_node_unknown", 1)
            return catalog.UNKNOWN_NODE
        return node[:MAX_NAME_LENGTH]

    def _refuse(self, error: DecodeError, n: int = 1) -> None:
        if not self.refused:
            self.first_refusal = str(error)
        self.refused[error.reason] = self.refused.get(error.reason, 0) + n
        self._count(error.reason, n)

    def _check_something_good(self, batch) -> None:
        """A request whose every item was refused is invalid as a whole (a 400), not a partial success."""
        if self.refused and not len(batch) and not self._well_formed_skips:
            raise DecodeError(self.refusal_report())

    def refusal_report(self) -> str:
        """The current request's refusals: the first one's detail, then the count of each reason."""
        return f"{self.first_refusal}; {refusal_message(self.refused)}" if self.refused else ""
