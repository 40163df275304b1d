"""A steady load of Envoy sidecar and gateway spans (tests/envoy_spans.py), sent live over OTLP/HTTP to one or
more `sloscope serve` processes, with the requests of chosen nodes made slow on demand.

The spans name their pod (Envoy's node_id) but never their node: serve has to place them through its pod watch.
Their durations are drawn here, lognormal around a healthy median, and around a slow one for the pods of the
nodes passed to `slow_down()`, as a workload on a node under CPU contention would answer."""

from __future__ import annotations

import random
import threading
import time
from tests.envoy_spans import envoy_request
from tests.otlp_http import post

TIERS = ("p99-latency-critical", "standard")


class EnvoyLoad:
    def __init__(self, proxies_by_node: dict[str, list[dict]], urls: list[str], per_tier_per_s: float = 12.0,
                 period_s: float = 0.25, healthy_ms: float = 15.0, slow_ms: float = 240.0, seed: int = 7):
        self.proxies_by_node, self.urls, self.period_s = proxies_by_node, urls, period_s
        self.per_tier_per_s = per_tier_per_s
        self.healthy_ms, self.slow_ms = healthy_ms, slow_ms
        self.random = random.Random(seed)
        self.slow_nodes: frozenset[str] = frozenset()
        self.sent: dict[str, int] = {node: 0 for node in proxies_by_node}  # SERVER spans per node
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="envoy-load", daemon=True)

    def start(self) -> "EnvoyLoad":
        self._thread.start()
        return self

    def slow_down(self, *nodes: str) -> None:
        self.slow_nodes = frozenset(nodes)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        since = time.time_ns()
        while not self._stop.wait(self.period_s):
            until = time.time_ns()
            for node, proxies in self.proxies_by_node.items():
                for proxy in proxies:
                    request, spans = self._request(proxy, node in self.slow_nodes, since, until)
                    if spans:
                        self.failures += filter(None, (post(url, request.SerializeToString()) for url in self.urls))
                        self.sent[node] += spans
            since = until

    def _request(self, proxy: dict, slow: bool, since: int, until: int):
        """(Envoy's export of the requests that began in [since, until), their number): per tier, SERVER spans
        with their CLIENT spans, each pair given ids of its own (envoy_request numbers them from 1 in every
        export) and a start and duration drawn here. The number follows the time, not the ticks: a load thread
        that got the CPU late still sends every request of the period."""
        request = None
        for tier in TIERS:
            expected = self.per_tier_per_s * (until - since) / 1e9
            count = int(expected) + (self.random.random() < expected % 1)
            if not count:
                continue
            one = envoy_request(proxy, spans=count, tier=tier)
            if request is None:
                request = one
            else:
                request.resource_spans[0].scope_spans[0].spans.extend(one.resource_spans[0].scope_spans[0].spans)
        if request is None:
            return None, 0
        spans = request.resource_spans[0].scope_spans[0].spans
        median_ms = self.slow_ms if slow else self.healthy_ms
        for server, client in zip(spans[0::2], spans[1::2]):
            start = self.random.randrange(since, max(until, since + 1))
            duration = int(median_ms * self.random.lognormvariate(0.0, 0.3) * 1e6)
            trace_id, span_id = self.random.randbytes(16), self.random.randbytes(8)
            server.trace_id = client.trace_id = trace_id
            server.span_id, client.span_id, client.parent_span_id = span_id, self.random.randbytes(8), span_id
            server.start_time_unix_nano, server.end_time_unix_nano = start, start + duration
            client.start_time_unix_nano, client.end_time_unix_nano = start + 100_000, start + duration - 500_000
        return request, len(spans) // 2
