"""OTLP trace requests as Envoy's OpenTelemetry tracer writes them under Istio (sidecar and ingress gateway).

From Envoy's source (source/extensions/tracers/opentelemetry: a resource with only service.name, the span kind
SERVER for the downstream (inbound) span and CLIENT for the outbound or upstream one, every tag a string
attribute) and its HTTP connection manager's tags (source/common/tracing: node_id, zone, guid:x-request-id,
http.url, http.method, http.protocol, downstream_cluster, user_agent, request_size, response_size,
upstream_cluster, upstream_cluster.name, upstream_address, peer.address, response_flags, http.status_code as
text, error=true and the ERROR status for a 5xx), and Istio's sidecar bootstrap (the node id
`sidecar~POD_IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local`, `router~...` for a gateway; the tags component=proxy,
istio.canonical_service, istio.canonical_revision, istio.namespace, istio.mesh_id; the tracing service name
APP.NAMESPACE by default) with the Telemetry resource's custom tag slo.tier from the x-slo-tier header. A gateway
writes its SERVER span (then the upstream CLIENT one) with spawn_upstream_span, which istiod sets for gateways with
PILOT_SPAWN_UPSTREAM_SPAN_FOR_GATEWAY (istio/istio#55637); without it, only CLIENT spans (`inbound=False`)."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

T0 = 1_764_410_400_000_000_000
SIDECAR = {"pod": "ratings-v1-5f9c8d6b4-x7k2p", "namespace": "bookinfo", "ip": "10.4.1.7", "app": "ratings",
           "kind": "sidecar"}
GATEWAY = {"pod": "istio-ingressgateway-6d8f7c9b5-q2w4z", "namespace": "istio-system", "ip": "10.4.0.12",
           "app": "istio-ingressgateway", "kind": "router"}


def node_id(proxy: dict) -> str:
    return f"{proxy['kind']}~{proxy['ip']}~{proxy['pod']}.{proxy['namespace']}~{proxy['namespace']}.svc.cluster.local"


def envoy_request(proxy: dict, spans: int = 4, tier: str | None = "p99-latency-critical", status: str = "200",
                  service_name: str | None = None, inbound: bool = True, start: int = T0) -> ExportTraceServiceRequest:
    """One export of `spans` downstream spans (SERVER: a sidecar's inbound requests, a gateway's requests from
    outside), each with its outbound or upstream CLIENT span."""
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.add(key="service.name", value=AnyValue(
        string_value=service_name or f"{proxy['app']}.{proxy['namespace']}"))
    scope = block.scope_spans.add()
    for i in range(spans):
        trace_id = bytes([proxy["kind"] == "router"]) + (i + 1).to_bytes(4, "big") + bytes(range(11))
        server = scope.spans.add(trace_id=trace_id, span_id=b"\x01" + (i + 1).to_bytes(4, "big") + b"\x00\x00\x02",
                                 name=f"{proxy['app']}.{proxy['namespace']}.svc.cluster.local:9080/*",
                                 kind=Span.SPAN_KIND_SERVER if inbound else Span.SPAN_KIND_CLIENT,
                                 start_time_unix_nano=start + i * 10**8,
                                 end_time_unix_nano=start + i * 10**8 + (12 + i) * 10**6)
        _tags(server, proxy, "inbound|9080||" if proxy["kind"] == "sidecar" else "outbound|9080||productpage",
              tier, status)
        client = scope.spans.add(trace_id=trace_id, span_id=b"\x02" + (i + 1).to_bytes(4, "big") + b"\x00\x00\x03",
                                 parent_span_id=server.span_id, name="productpage.bookinfo.svc.cluster.local:9080/*",
                                 kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=start + i * 10**8 + 10**5,
                                 end_time_unix_nano=start + i * 10**8 + 11 * 10**6)
        _tags(client, proxy, "outbound|9080||reviews.bookinfo.svc.cluster.local", tier, status)
    return request


def _tags(span, proxy: dict, cluster: str, tier: str | None, status: str) -> None:
    tags = {"node_id": node_id(proxy), "zone": "europe-west4-a", "guid:x-request-id": "4f1c9a2e-0d3b-9b7e-8c61",
            "http.url": "http://ratings.bookinfo:9080/ratings/0", "http.method": "GET", "http.protocol": "HTTP/1.1",
            "downstream_cluster": "-", "user_agent": "python-httpx/0.27", "request_size": "0",
            "response_size": "48", "upstream_cluster": cluster, "upstream_cluster.name": cluster,
            "upstream_address": "10.4.2.9:9080", "peer.address": "10.4.3.3", "response_flags": "-",
            "http.status_code": status, "component": "proxy", "istio.canonical_service": proxy["app"],
            "istio.canonical_revision": "v1", "istio.namespace": proxy["namespace"], "istio.mesh_id": "cluster.local"}
    if tier is not None:
        tags["slo.tier"] = tier
    if status.startswith("5"):
        tags["error"] = "true"
        tags["response_flags"] = "UF"
        span.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR))
    for key, value in tags.items():
        span.attributes.add(key=key, value=AnyValue(string_value=value))


PRODUCTPAGE = {"pod": "productpage-v1-7d6cfb7dfd-5mq8n", "namespace": "bookinfo", "ip": "10.4.2.9",
               "app": "productpage", "kind": "sidecar"}
REVIEWS = {"pod": "reviews-v2-6c5bf657cf-jmbkr", "namespace": "bookinfo", "ip": "10.4.3.3", "app": "reviews",
           "kind": "sidecar"}
HOPS = (GATEWAY, PRODUCTPAGE, REVIEWS)  # the ingress gateway calls productpage, which calls reviews


def hop_request(traces: int, reviews_ms=lambda i: 8.0, gap_us: int = 400, start: int = T0,
                tier: str = "p99-latency-critical") -> ExportTraceServiceRequest:
    """`traces` requests, one a second from `start`, through the three proxies of HOPS, each proxy's spans in its
    own resource block as each proxy exports its own: a proxy's SERVER span (the gateway's with the tier tag, the
    only one: meshes forward no custom header) and its CLIENT span to the next hop, whose SERVER span is that
    CLIENT span's child (the application between the two sidecars forwards the trace context) and starts
    `gap_us` / 2 later; the last hop (reviews, `reviews_ms(i)` of its own) calls no one. Each proxy's own time
    is 1 ms before its call and 0.5 ms after it."""
    request = ExportTraceServiceRequest()
    scopes = []
    for proxy in HOPS:
        block = request.resource_spans.add()
        block.resource.attributes.add(key="service.name",
                                      value=AnyValue(string_value=f"{proxy['app']}.{proxy['namespace']}"))
        scopes.append(block.scope_spans.add())
    for i in range(traces):
        trace_id = (i + 1).to_bytes(8, "big") + b"\x5a" * 8
        durations = [reviews_ms(i) * 10**6]
        for _ in HOPS[1:]:  # each caller: its own time, its call's gaps, and what it called
            durations.insert(0, durations[0] + gap_us * 10**3 + 1.5 * 10**6)
        begin, parent = start + i * 10**9, b""
        for hop, (proxy, scope) in enumerate(zip(HOPS, scopes)):
            end = begin + int(durations[hop])
            server = scope.spans.add(trace_id=trace_id, span_id=bytes([hop + 1, 1]) + (i + 1).to_bytes(6, "big"),
                                     parent_span_id=parent, name=f"{proxy['app']}.{proxy['namespace']}:9080/*",
                                     kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=begin, end_time_unix_nano=end)
            cluster = "inbound|9080||" if proxy["kind"] == "sidecar" else f"outbound|9080||{HOPS[1]['app']}.bookinfo"
            _tags(server, proxy, cluster, tier if hop == 0 else None, "200")
            if hop + 1 == len(HOPS):
                break
            callee = HOPS[hop + 1]
            call_start, call_end = begin + 10**6, end - 5 * 10**5
            client = scope.spans.add(trace_id=trace_id, span_id=bytes([hop + 1, 2]) + (i + 1).to_bytes(6, "big"),
                                     parent_span_id=server.span_id, name=f"{callee['app']}.bookinfo:9080/*",
                                     kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=call_start,
                                     end_time_unix_nano=call_end)
            _tags(client, proxy, f"outbound|9080||{callee['app']}.bookinfo.svc.cluster.local", None, "200")
            begin, parent = call_start + gap_us * 500, client.span_id
    return request
