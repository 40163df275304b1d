"""One request through three Envoy proxies as Istio writes it (tests/envoy_spans.py: the ingress gateway, then
productpage's and reviews' sidecars, each exporting its own spans): the trace graph stitches their spans into one
call tree on both decode paths, names each call's callee from `upstream_cluster` and the SERVER span that answered
it, carries the gateway's tier to the trace, and finds a slower reviews two proxies below the entry."""

from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from sloscope.analytics import graph
from sloscope.analytics.intake import Enrichment
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.receiver.server import Decoders
from sloscope.records import SPAN_KIND_CLIENT
from tests.envoy_spans import T0, hop_request
from tests.receiver.test_otlp_spans import assert_same_as_general

START = datetime.fromtimestamp(T0 / 1e9, timezone.utc).replace(tzinfo=None)
GATEWAY, PAGE, REVIEWS = "istio-ingressgateway", "productpage", "reviews"


def _stored(tmp_path, request) -> Store:
    """The request as serve stores it: decoded, its tiers resolved, placed (the spans name no node)."""
    batch, _ = Decoders().decode("traces", request.SerializeToString(), False)
    enrichment = Enrichment(TierResolver(frozenset({"standard", "p99-latency-critical"}), "standard"))
    frames, _ = enrichment.frames(batch)
    enrichment.place(frames)
    store = Store(tmp_path / "hops.duckdb")
    store.write(frames)
    return store


def test_three_proxies_make_one_call_tree_on_both_paths(tmp_path):
    request = hop_request(30, gap_us=400)
    assert assert_same_as_general(request.SerializeToString())  # the fast path takes Envoy's spans, row for row
    with _stored(tmp_path, request) as store:
        spans = graph.own_times(graph.trace_spans(store, START, START + timedelta(hours=1)))
        shown = graph.service_graph(store, START, START + timedelta(seconds=30))
    calls = spans.filter(pl.col("kind") == SPAN_KIND_CLIENT)
    assert sorted(set(zip(calls["service"], calls["peer"], calls["callee_service"]))) == [
        (GATEWAY, PAGE, PAGE), (PAGE, REVIEWS, REVIEWS)]
    assert calls["own_ms"].to_list() == pytest.approx([0.4] * 60, abs=1e-3)  # the wire, both ways
    assert calls["callee_pod"].unique().sort().to_list() == ["productpage-v1-7d6cfb7dfd-5mq8n",
                                                              "reviews-v2-6c5bf657cf-jmbkr"]
    served = spans.filter(pl.col("kind") != SPAN_KIND_CLIENT)
    assert dict(served.group_by("service").agg(pl.col("own_ms").mean()).iter_rows()) == pytest.approx(
        {GATEWAY: 1.5, PAGE: 1.5, REVIEWS: 8.0}, abs=1e-3)
    entries = graph.entries(spans)
    assert entries.height == 30 and set(entries["entry_service"]) == {GATEWAY}
    assert set(entries["entry_tier"]) == {"p99-latency-critical"}  # the gateway's header, the trace's tier
    assert {(e["source"], e["target"], e["network_gap_ms"]) for e in shown["edges"]} == {(GATEWAY, PAGE, 0.4),
                                                                                          (PAGE, REVIEWS, 0.4)}
    assert [(n["service"], n["pods"]) for n in shown["nodes"]] == [
        (GATEWAY, ["istio-ingressgateway-6d8f7c9b5-q2w4z"]), (PAGE, ["productpage-v1-7d6cfb7dfd-5mq8n"]),
        (REVIEWS, ["reviews-v2-6c5bf657cf-jmbkr"])]


def test_a_slower_service_two_proxies_below_the_entry_is_the_culprit(tmp_path):
    """Reviews takes 8 ms, then 40 ms from minute 10 on; the gateway felt it."""
    request = hop_request(660, reviews_ms=lambda i: 40.0 if i >= 600 else 8.0 + (i % 7) / 7)
    windows = graph.Windows(START, START + timedelta(minutes=9), START + timedelta(minutes=10),
                            START + timedelta(minutes=11))
    with _stored(tmp_path, request) as store:
        found, entry = graph.culprits(store, windows)
    assert entry["latency_growth_ms"] == pytest.approx(31.6, abs=0.5)
    assert [(c["service"], c["kind"], c["path"]) for c in found] == [(REVIEWS, graph.SELF, [GATEWAY, PAGE, REVIEWS])]
    assert found[0]["pod"] == "reviews-v2-6c5bf657cf-jmbkr" and found[0]["share"] == pytest.approx(1.0, abs=0.01)
