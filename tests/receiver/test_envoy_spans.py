"""Envoy's spans under Istio, as its sidecars and gateways write them (tests/envoy_spans.py): read by the fast path
with the same rows as the general decoder, with pod, namespace and pod IP from the node id, the service from
istio.canonical_service, the tier from the Telemetry custom tag, the status code from its text, and the service a
CLIENT span called from its upstream cluster."""

import pytest

from sloscope.receiver.otlp_common import envoy_node, mesh_service, upstream_peer
from sloscope.records import SPAN_KIND_CLIENT, SPAN_KIND_SERVER
from tests.envoy_spans import GATEWAY, SIDECAR, envoy_request, node_id
from tests.receiver.test_otlp_spans import assert_same_as_general, fast_rows, general_rows


def rows_of(request):
    body = request.SerializeToString()
    assert assert_same_as_general(body), "the fast path declined Envoy's spans"
    return fast_rows(body)


@pytest.mark.parametrize("proxy", [SIDECAR, GATEWAY], ids=["sidecar", "gateway"])
def test_envoy_spans_take_the_fast_path_with_pod_service_and_tier(proxy):
    rows, counts = rows_of(envoy_request(proxy))
    assert rows["kind"].to_list() == [SPAN_KIND_SERVER, SPAN_KIND_CLIENT] * 4 and "spans_not_server" not in counts
    assert set(rows["service"]) == {proxy["app"]}
    assert set(zip(rows["pod"], rows["namespace"], rows["pod_ip"])) == {(proxy["pod"], proxy["namespace"], proxy["ip"])}
    assert rows["node"].null_count() == 8  # Envoy names no node: enrich places it by its pod
    assert set(rows["tier"]) == {"p99-latency-critical"} and not counts.get("tier_missing")
    assert set(rows["status_code"]) == {200} and not rows["failed"].any()


@pytest.mark.parametrize("proxy, server_peer", [(SIDECAR, None), (GATEWAY, "productpage")], ids=["sidecar", "gateway"])
def test_each_client_span_is_the_child_of_its_server_span_and_names_its_upstream(proxy, server_peer):
    rows, _ = rows_of(envoy_request(proxy))
    server, client = rows.filter(rows["kind"] == SPAN_KIND_SERVER), rows.filter(rows["kind"] == SPAN_KIND_CLIENT)
    assert server["parent_id"].null_count() == 4 and client["parent_id"].to_list() == server["span_id"].to_list()
    assert set(client["peer"]) == {"reviews"}  # outbound|9080||reviews.bookinfo.svc.cluster.local
    # a sidecar's inbound cluster names no peer; a gateway's SERVER span has the cluster it routes to
    assert server["peer"].to_list() == [server_peer] * 4


def test_without_the_tier_tag_the_default_tier_is_counted():
    rows, counts = rows_of(envoy_request(SIDECAR, tier=None))
    assert set(rows["tier"]) == {"standard"} and counts["tier_missing"] == 8


def test_a_text_5xx_is_a_failure():
    rows, _ = rows_of(envoy_request(SIDECAR, status="503"))
    assert set(rows["status_code"]) == {503} and rows["failed"].all()


@pytest.mark.parametrize("proxy", [SIDECAR, GATEWAY], ids=["sidecar outbound", "gateway without upstream spans"])
def test_client_spans_alone_are_kept(proxy):
    rows, counts = rows_of(envoy_request(proxy, inbound=False))
    assert set(rows["kind"]) == {SPAN_KIND_CLIENT} and len(rows) == 8 and "spans_not_server" not in counts


@pytest.mark.parametrize("given, expected", [
    (None, "ratings"), ("ratings.bookinfo", "ratings"), ("istio-proxy", "ratings"),
    ("unknown_service:envoy", "ratings"), ("ratings-api", "ratings-api"), ("checkout", "checkout")])
def test_the_canonical_service_replaces_only_envoy_default_names(given, expected):
    rows, _ = rows_of(envoy_request(SIDECAR, service_name=given))
    assert set(rows["service"]) == {expected}


def test_a_status_text_that_is_not_digits_refuses_the_span_alone():
    request = envoy_request(SIDECAR, spans=2)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="http.status_code").value.string_value = "2O0"
    rows, counts = general_rows(request.SerializeToString())
    assert fast_rows(request.SerializeToString()) is None
    assert len(rows) == 3 and counts["spans_invalid_status_code"] == 1  # the other SERVER span and two CLIENT ones


@pytest.mark.parametrize("text, expected", [
    (node_id(SIDECAR), (SIDECAR["pod"], "bookinfo", "10.4.1.7")),
    (node_id(GATEWAY), (GATEWAY["pod"], "istio-system", "10.4.0.12")),
    ("sidecar~10.0.0.1~web~shop.svc.cluster.local", ("web", "shop", "10.0.0.1")),  # a pod name without .NS
    ("front-envoy-1", (None, None, None)),  # plain Envoy: the node id is free text
    ("waypoint~10.0.0.1~w.ns~ns.svc.cluster.local", (None, None, None)),
    ("sidecar~~web.shop~shop.svc.cluster.local", (None, None, None)),
    ("sidecar~10.0.0.1~web.shop~.svc", (None, None, None)),
    ("sidecar~10.0.0.1~web.shop~shop.svc~extra", (None, None, None)),
])
def test_istio_node_ids(text, expected):
    assert envoy_node(text) == expected


def test_the_service_name_rule():
    assert mesh_service("reviews.bookinfo", None) == "reviews.bookinfo"  # not Envoy's: kept
    assert mesh_service("reviews.bookinfo", "reviews") == "reviews"



@pytest.mark.parametrize("cluster, expected", [
    ("outbound|7070||cartservice.default.svc.cluster.local", "cartservice"),
    ("outbound|9080|v2|reviews.bookinfo.svc.cluster.local", "reviews"),
    ("inbound|9080||", ""), ("outbound|9080||", ""),
    ("PassthroughCluster", "PassthroughCluster"), ("a|b|c|d", "a|b|c|d"), ("outbound|1|2|3|4", "outbound|1|2|3|4"),
])
def test_the_upstream_cluster_rule(cluster, expected):
    assert upstream_peer(cluster) == expected
