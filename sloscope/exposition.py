"""The Prometheus text format of sloscope's /metrics endpoints (serve's and the node collector's), written by
prometheus-client so that every value keeps its full precision: a counter printed with six significant digits
would step, and `rate()` over it would jump."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

try:  # the classic text format every Prometheus 2.x reads; our names never need the 1.0.0 format's escaping
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
except ImportError:  # older prometheus_client: its latest is 0.0.4
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

__all__ = ["CONTENT_TYPE", "render"]


def render(*collectors: Collector) -> bytes:
    """One scrape of the collectors' families, as Prometheus text."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry)
