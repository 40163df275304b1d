"""Prometheus families of `sloscope serve`'s own intake: what the receiver refused and why, and the writer's
queue and failures. These live in serve's memory, not in the store, so they start from zero with the process
(Prometheus's rate() reads that as a counter reset).

- `sloscope_receiver_requests_total{signal,outcome}`: accepted, refused (the writer's queue is full) or invalid
  (did not decode).
- `sloscope_receiver_bad_requests_total{reason}`: refused before decoding: unknown_path (404), bad_method
  (405), bad_content_type (415), too_large, too_many_items (more items, attributes or histogram buckets than
  --max-request-items, --max-request-attributes, --max-request-buckets allow: 413 / RESOURCE_EXHAUSTED),
  headers_too_large, bad_framing (Content-Length or chunked), bad_encoding
  (a Content-Encoding not taken: 415), bad_gzip, bad_compression (a zstd, zlib, deflate, snappy or lz4 body that
  does not decode), truncated, header_timeout, body_timeout, refused_memory (the in-flight byte budget was spent),
  grpc_busy (an OTLP/gRPC call past --grpc-max-concurrent-rpcs: UNAVAILABLE), peer_busy and grpc_peer_busy (a
  client address past --max-inflight-requests-per-peer or --grpc-max-concurrent-rpcs-per-peer: 503 / UNAVAILABLE),
  grpc_first_message_timeout (a call whose message did not come within --grpc-first-message-timeout).
- `sloscope_receiver_partial_rejects_total{signal,reason}`: items of accepted requests reported back as
  rejected in OTLP partial success.
- `sloscope_receiver_unauthenticated_total{protocol}`: requests refused for a missing or wrong bearer token
  (http: 401, grpc: UNAUTHENTICATED).
- `sloscope_receiver_tls_handshake_failures_total{reason}`: OTLP/HTTP connections closed before their TLS
  handshake completed: timeout (not done within the header deadline), not_tls (plain text), failed.
- `sloscope_receiver_connection_limit_waits_total`, `sloscope_receiver_http_connections_shed_total` (idle
  connections closed for new ones), `sloscope_receiver_http_connections_refused_peer_total` (new connections of an
  address at its cap with none idle), `sloscope_receiver_open_connections`, `sloscope_receiver_inflight_bytes`.
- `sloscope_writer_queued_bytes`, `..._queued_requests`, `..._queued_rows`, `sloscope_writer_commits_total`,
  `sloscope_writer_write_failures_total`, `sloscope_writer_rejected_requests_total`, `sloscope_writer_healthy`.
- With `--kube-api`: `sloscope_kube_pods_known` (pod incarnations held, the recently ended included),
  `sloscope_kube_watch_synced` (1 once the first list is in), `sloscope_kube_events_total{type}` (added,
  modified, deleted, bookmark), `sloscope_kube_lists_total`, `sloscope_kube_relists_gone_total` (410 Gone: the
  watch's version was too old), `sloscope_kube_watch_errors_total`, `sloscope_kube_pods_over_limit_total`.
  Where spans were placed from is in the store's ingest counters (`spans_node_from_pod_name`, ...).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

SIGNALS = ("traces", "metrics", "logs")
OUTCOMES = {"requests_accepted": "accepted", "refused_full": "refused", "invalid": "invalid"}
BAD_REQUEST_REASONS = ("unknown_path", "bad_method", "bad_content_type", "too_large", "too_many_items",
                       "headers_too_large", "bad_framing", "bad_encoding", "bad_gzip", "bad_compression", "truncated",
                       "header_timeout", "body_timeout", "refused_memory", "grpc_busy", "peer_busy",
                       "grpc_peer_busy", "grpc_first_message_timeout")
PARTIAL_PREFIX = "rejected_"  # receiver counts `{signal}_rejected_{reason}`
AUTH_PROTOCOLS = ("http", "grpc")  # receiver counts `unauthenticated_{protocol}`
TLS_HANDSHAKE_FAILURES = ("timeout", "not_tls", "failed")  # receiver counts `tls_handshake_{reason}`
WRITER_GAUGES = ("queued_bytes", "queued_requests", "queued_rows")
WRITER_COUNTERS = ("commits", "write_failures", "rejected_requests")
KUBE_EVENTS = ("added", "modified", "deleted", "bookmark")
KUBE_COUNTERS = {"kube_lists": "Pod lists read from the API server.",
                 "kube_relists_gone": "Relists because the watch's resource version had expired (410 Gone).",
                 "kube_watch_errors": "Lists or watches that failed (retried with backoff).",
                 "pods_over_limit": "Pods not held because the directory was full."}


class IntakeCollector(Collector):
    """Families from `stats()`: {"receiver": the receiver's counts, "open_connections", "inflight_bytes",
    "writer": Writer.stats(), "writer_health": Writer.health()}, and with a pod watch "pods": {"known",
    "synced", "counts": the watch's and the directory's counts}."""

    def __init__(self, stats: Callable[[], dict]):
        self.stats = stats

    def describe(self):
        return []

    def collect(self):
        stats = self.stats()
        counts = dict(stats["receiver"])
        yield from self._receiver(counts)
        for name in ("open_connections", "inflight_bytes"):
            yield GaugeMetricFamily(f"sloscope_receiver_{name}", _RECEIVER_GAUGE_HELP[name], value=stats[name])
        writer = stats["writer"]
        for name in WRITER_GAUGES:
            yield GaugeMetricFamily(f"sloscope_writer_{name}", f"The writer's queue: {name.replace('_', ' ')}.",
                                    value=writer.get(name, 0))
        for name in WRITER_COUNTERS:
            yield CounterMetricFamily(f"sloscope_writer_{name}", f"The writer's {name.replace('_', ' ')} so far.",
                                      value=writer.get(name, 0))
        yield GaugeMetricFamily("sloscope_writer_healthy", "1 while the writer can write, else 0 (see /readyz "
                                "for why).", value=0 if stats["writer_health"] else 1)
        if "pods" in stats:
            yield from _pods(stats["pods"])

    def _receiver(self, counts: dict):
        requests = CounterMetricFamily("sloscope_receiver_requests_total", "OTLP export requests by signal and "
                                       "outcome: accepted, refused (writer queue full, retry), invalid.",
                                       labels=["signal", "outcome"])
        for signal in SIGNALS:
            for key, outcome in OUTCOMES.items():
                requests.add_metric([signal, outcome], counts.pop(f"{signal}_{key}", 0))
        bad = CounterMetricFamily("sloscope_receiver_bad_requests_total", "Requests refused before decoding, by "
                                  "reason.", labels=["reason"])
        for reason in BAD_REQUEST_REASONS:
            bad.add_metric([reason], counts.pop(f"requests_{reason}", 0))
        partial = CounterMetricFamily("sloscope_receiver_partial_rejects_total", "Items of accepted requests "
                                      "reported back as rejected (OTLP partial success), by signal and reason.",
                                      labels=["signal", "reason"])
        for key in sorted(counts):
            signal, _, rest = key.partition("_")
            if signal in SIGNALS and rest.startswith(PARTIAL_PREFIX):
                partial.add_metric([signal, rest[len(PARTIAL_PREFIX):]], counts.pop(key))
        waits = CounterMetricFamily("sloscope_receiver_connection_limit_waits_total", "Times new OTLP/HTTP "
                                    "connections had to wait because --max-connections were open.",
                                    value=counts.pop("http_connection_limit_waits", 0))
        # Declared from the start, so that a rate() over them reads 0 rather than nothing before the first.
        shed = CounterMetricFamily("sloscope_receiver_http_connections_shed_total", "Idle OTLP/HTTP connections "
                                   "closed to make room for new ones.", value=counts.pop("http_connections_shed", 0))
        refused = CounterMetricFamily("sloscope_receiver_http_connections_refused_peer_total", "New OTLP/HTTP "
                                      "connections closed because their address held --max-connections-per-peer "
                                      "with none idle.", value=counts.pop("http_connections_refused_peer", 0))
        yield from (requests, bad, partial, waits, shed, refused, *_edge(counts))
        for key in sorted(counts):  # anything else the receiver counts is shown rather than hidden
            yield CounterMetricFamily(f"sloscope_receiver_{key}", f"Receiver counter {key}.", value=counts[key])


def _edge(counts: dict):
    """The edge's refusals (edge/auth.py, edge/tls.py), taken out of `counts`."""
    refused = CounterMetricFamily("sloscope_receiver_unauthenticated_total", "Requests refused for a missing or "
                                  "wrong bearer token, by protocol.", labels=["protocol"])
    for protocol in AUTH_PROTOCOLS:
        refused.add_metric([protocol], counts.pop(f"unauthenticated_{protocol}", 0))
    handshakes = CounterMetricFamily("sloscope_receiver_tls_handshake_failures_total", "OTLP/HTTP connections "
                                     "closed before their TLS handshake completed, by reason.", labels=["reason"])
    for reason in TLS_HANDSHAKE_FAILURES:
        handshakes.add_metric([reason], counts.pop(f"tls_handshake_{reason}", 0))
    return refused, handshakes


def _pods(pods: dict):
    counts = pods["counts"]
    yield GaugeMetricFamily("sloscope_kube_pods_known", "Pod incarnations held for placing spans (those that "
                            "ended recently included).", value=pods["known"])
    yield GaugeMetricFamily("sloscope_kube_watch_synced", "1 once the first pod list is in, else 0.",
                            value=1 if pods["synced"] else 0)
    events = CounterMetricFamily("sloscope_kube_events_total", "Pod watch events by type.", labels=["type"])
    for kind in KUBE_EVENTS:
        events.add_metric([kind], counts.get(f"kube_events_{kind}", 0))
    yield events
    for key, help_text in KUBE_COUNTERS.items():
        yield CounterMetricFamily(f"sloscope_{key if key.startswith('kube') else 'kube_' + key}", help_text,
                                  value=counts.get(key, 0))


_RECEIVER_GAUGE_HELP = {
    "open_connections": "OTLP/HTTP connections open now.",
    "inflight_bytes": "Bytes of request bodies being read or decoded now (bounded by --max-inflight-bytes).",
}
