"""Small builders for OTLP/JSON export requests, as the Collector's file exporter writes them."""

from __future__ import annotations

import json

# The stored ids (analytics/ids.py) as the hex the payloads carry, in SQL.
TRACE_ID = "printf('%016x%016x', trace_hi, trace_lo)"
SPAN_ID = "printf('%016x', span_id)"


def attr(key, value):
    if isinstance(value, bool):
        v = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [attr("", x)["value"] for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def resource(**attrs):
    return {"attributes": [attr(k.replace("_", "."), v) for k, v in attrs.items()]}


def span(trace_id, span_id, start_ns, duration_ms, status=200, tier=None, kind=2, error=False, extra=None):
    attributes = [attr("http.response.status_code", status), attr("http.route", "/v1/chat/completions")]
    if tier is not None:
        attributes.append(attr("http.request.header.x-slo-tier", tier))
    attributes += [attr(k, v) for k, v in (extra or {}).items()]
    return {"traceId": trace_id, "spanId": span_id, "name": "POST /v1/chat/completions", "kind": kind,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + int(duration_ms * 1e6)),
            "attributes": attributes, "status": {"code": 2 if error else 0}}


def traces(spans, service="llm-gateway", node="gpu-node-1"):
    return {"resourceSpans": [{"resource": resource(service_name=service, host_name=node),
                               "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}


def gauge(name, points, attrs=None):
    return {"name": name, "gauge": {"dataPoints": [
        {"attributes": [attr(k, v) for k, v in (attrs or {}).items()], "timeUnixNano": str(t), "asDouble": v}
        for t, v in points]}}


def counter(name, start_ns, points, attrs=None, temporality=2):
    return {"name": name, "sum": {"aggregationTemporality": temporality, "isMonotonic": True, "dataPoints": [
        {"attributes": [attr(k, v) for k, v in (attrs or {}).items()], "startTimeUnixNano": str(start),
         "timeUnixNano": str(t), **({"asDouble": v} if isinstance(v, float) else {"asInt": str(v)})}
        for start, t, v in ((p[2], p[0], p[1]) if len(p) == 3 else (start_ns, p[0], p[1]) for p in points)]}}


def exp_histogram(name, start_ns, points, temporality=2, attrs=None):
    """points: (time_ns, count, sum, offset, bucket_counts) at scale 0."""
    return {"name": name, "exponentialHistogram": {"aggregationTemporality": temporality, "dataPoints": [
        {"attributes": [attr(k, v) for k, v in (attrs or {}).items()], "startTimeUnixNano": str(start_ns),
         "timeUnixNano": str(t), "count": str(c), "sum": s, "scale": 0, "zeroCount": "0",
         "positive": {"offset": off, "bucketCounts": [str(b) for b in buckets]}}
        for t, c, s, off, buckets in points]}}


def metrics(metric_list, node="gpu-node-1", k8s_node=None):
    res = resource(host_name=node, **({"k8s_node_name": k8s_node} if k8s_node else {}))
    return {"resourceMetrics": [{"resource": res, "scopeMetrics": [{"scope": {"name": "test"}, "metrics": metric_list}]}]}


def write_lines(path, requests):
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path
