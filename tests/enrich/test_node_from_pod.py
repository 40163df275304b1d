"""Spans that name their pod but no node are placed on the pod's node, from a list+watch of the Kubernetes API
(the stand-in tests/fakes/kube_api.py speaks its protocol): at intake when the pod is known, later (the row moves
off the unknown node) when the span came first; by the pod alive at the span's start, so never by the IP of a
pod that is gone; through 410 Gone, relists and dropped watches."""

import http.client
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sloscope.analytics.late_placement import LatePlacement
from sloscope.analytics.store import Store
from sloscope.analytics.writer import Writer
from sloscope.receiver.server import Receiver, http_server
from sloscope.enrich.kube_watch import KubeApi, PodWatch
from sloscope.enrich.pods import PodDirectory, incarnation_of
from sloscope.enrich.tiers import TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.catalog import UNKNOWN_NODE
from sloscope.analytics.intake import Intake
from sloscope.slo_spec import load_spec
from tests.envoy_spans import GATEWAY, SIDECAR, envoy_request
from tests.fakes.kube_api import FakeKubeApi
from tests.otlp_builders import TRACE_ID


def now_ns(offset_s: float = 0.0) -> int:
    return time.time_ns() + int(offset_s * 1e9)


def wait_for(condition, seconds: float = 10.0, what: str = "the condition"):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.05)


class Serving:
    """serve's intake (receiver, writer, store) with the pod watch and the late placement, on 127.0.0.1."""

    def __init__(self, db, kube_url: str, late_interval_s: float = 0.2):
        self.store = Store(db)
        self.writer = Writer(self.store).start()
        self.pods = PodDirectory()
        self.watch = PodWatch(KubeApi.of(kube_url), self.pods, watch_timeout_s=3).start()
        self.late = LatePlacement(self.store, self.writer, self.pods, interval_s=late_interval_s).start()
        intake = Intake(self.writer, TierResolver.from_spec(load_spec(None)), GpuTopology(), pods=self.pods)
        self.receiver = Receiver(intake)
        self.httpd = http_server(self.receiver, "127.0.0.1", 0)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        assert self.watch.synced.wait(10), "the pods were never listed"

    def post(self, request: ExportTraceServiceRequest) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.httpd.server_address[1], timeout=10)
        conn.request("POST", "/v1/traces", request.SerializeToString(), {"Content-Type": "application/x-protobuf"})
        status = conn.getresponse().status
        conn.close()
        return status

    def nodes(self, where: str = "TRUE") -> dict[str, int]:
        return dict(self.store.reader().rows(f"SELECT node, count(*) FROM requests WHERE {where} GROUP BY node"))

    def counters(self) -> dict[str, int]:
        """The store's counters, on a cursor of its own (the writer's connection is busy writing)."""
        return dict(self.store.reader().rows("SELECT name, value FROM ingest_counters"))

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.watch.stop()
        self.late.stop()
        self.writer.stop(timeout=10)
        self.store.close()


@pytest.fixture
def kube():
    with FakeKubeApi(page_size_limit=2) as api:
        yield api


@pytest.fixture
def serving(tmp_path, kube):
    s = Serving(tmp_path / "pods.duckdb", kube.url)
    yield s
    s.close()


def test_sidecar_spans_are_placed_on_their_pods_node_at_intake(tmp_path):
    with FakeKubeApi(page_size_limit=2, watch_list="off") as kube:  # a server that lists, not streams, the pods
        for i in range(5):  # more pods than one page of the list
            kube.add_pod(f"filler-{i}", "bookinfo", "gpu-node-9", f"10.4.9.{i}")
        kube.add_pod(SIDECAR["pod"], SIDECAR["namespace"], "gpu-node-2", SIDECAR["ip"])
        serving = Serving(tmp_path / "intake.duckdb", kube.url)
        try:
            assert serving.post(envoy_request(SIDECAR, start=now_ns())) == 200
            assert serving.nodes() == {"gpu-node-2": 4}
            counters = serving.counters()
            # The four requests and the four CLIENT spans of the same pods.
            assert counters["spans_node_from_pod_name"] == 8 and "spans_node_unknown" not in counters
            assert any("continue=" in path for path in kube.requests)  # the list was read page by page
        finally:
            serving.close()


def test_a_span_that_arrives_before_its_pod_is_moved_when_the_pod_appears(kube, serving):
    assert serving.post(envoy_request(GATEWAY, start=now_ns(-1))) == 200  # stored at once: a 2xx is durable
    assert serving.nodes() == {UNKNOWN_NODE: 4}
    assert serving.counters()["spans_node_unknown"] == 8  # the requests and the CLIENT spans
    appeared = time.monotonic()
    kube.add_pod(GATEWAY["pod"], GATEWAY["namespace"], "edge-node-1", GATEWAY["ip"],
                 created=datetime.now(timezone.utc) - timedelta(seconds=30))
    wait_for(lambda: serving.nodes() == {"edge-node-1": 4}, 5, "the late placement")
    assert time.monotonic() - appeared < 2.0  # moved soon after the watch reported the pod, not on a slow timer
    wait_for(lambda: serving.counters().get("spans_node_replaced_late") == 8, 5, "the late counter")
    # the CLIENT spans went with their pod's requests
    assert serving.store.reader().rows("SELECT DISTINCT node FROM spans") == [("edge-node-1",)]


def ip_only_request(ip: str, start: int, span_byte: int) -> ExportTraceServiceRequest:
    """A span whose resource names only its pod's IP (as a Collector's k8sattributes may pass it on)."""
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.add(key="service.name", value=AnyValue(string_value="embedder"))
    block.resource.attributes.add(key="k8s.pod.ip", value=AnyValue(string_value=ip))
    block.scope_spans.add().spans.add(trace_id=bytes([span_byte]) * 16, span_id=bytes([span_byte]) * 8, name="POST",
                                      kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start,
                                      end_time_unix_nano=start + 5 * 10**6)
    return request


def test_a_reused_ip_places_each_span_by_the_pod_alive_when_it_started(kube, serving):
    old = kube.add_pod("embedder-0", "ml", "gpu-node-1", "10.9.0.5",
                       created=datetime.now(timezone.utc) - timedelta(minutes=5))
    gone = kube.add_pod("tokenizer-0", "ml", "gpu-node-1", "10.9.0.6",
                        created=datetime.now(timezone.utc) - timedelta(minutes=5))
    wait_for(lambda: len(serving.pods) == 2)
    kube.delete_pod(old)
    kube.delete_pod(gone)
    wait_for(lambda: serving.pods.frame()["died"].null_count() == 0, what="the deletions")
    time.sleep(1.1)  # the new pod's creation time (whole seconds) is after the old one's end
    kube.add_pod("embedder-1", "ml", "gpu-node-4", "10.9.0.5")  # the IP, reused
    wait_for(lambda: len(serving.pods) == 3)
    assert serving.post(ip_only_request("10.9.0.5", now_ns(-120), 1)) == 200  # while the old pod was alive
    assert serving.post(ip_only_request("10.9.0.5", now_ns(2), 2)) == 200  # the new pod's
    assert serving.post(ip_only_request("10.9.0.6", now_ns(2), 3)) == 200  # a dead pod's IP, not reused
    rows = dict(serving.store.reader().rows(f"SELECT {TRACE_ID}, node FROM requests"))
    assert rows == {"01" * 16: "gpu-node-1", "02" * 16: "gpu-node-4", "03" * 16: UNKNOWN_NODE}
    counters = serving.counters()
    assert counters["spans_node_from_pod_ip"] == 2 and counters["spans_node_unknown"] == 1
    assert "spans_node_unresolved" not in counters  # it names its pod IP: a later pod may still place it


def test_spans_naming_nothing_of_their_place_are_counted_unresolved(serving):
    request = ip_only_request("10.9.9.9", now_ns(), 4)
    del request.resource_spans[0].resource.attributes[1]  # not even a pod IP
    # Received with no client IP address (as over a Unix socket): nothing names where the span ran.
    assert serving.receiver.accept_body("traces", request.SerializeToString(), False).accepted
    assert serving.counters()["spans_node_unresolved"] == 1 and serving.nodes() == {UNKNOWN_NODE: 1}


@pytest.mark.parametrize("gone_as", ["event", "status"])
def test_the_watch_relists_after_410_gone_and_notices_pods_that_ended_meanwhile(tmp_path, gone_as):
    with FakeKubeApi(gone_as=gone_as) as kube:
        ended = kube.add_pod("batch-0", "jobs", "cpu-node-1", "10.7.0.1")
        serving = Serving(tmp_path / "gone.duckdb", kube.url)
        try:
            kube.pods.pop(ended["metadata"]["uid"])  # gone with its event lost: compacted before it was seen
            kube.compact()
            kube.add_pod(GATEWAY["pod"], GATEWAY["namespace"], "edge-node-2", GATEWAY["ip"])
            wait_for(lambda: serving.watch.counts["kube_relists_gone"] >= 1, what="a relist")
            wait_for(lambda: len(serving.pods) == 2, what="the new pod")
            assert serving.pods.frame().filter(serving.pods.frame()["pod"] == "batch-0")["died"].null_count() == 0
            assert serving.post(envoy_request(GATEWAY, start=now_ns())) == 200
            assert serving.nodes() == {"edge-node-2": 4}
        finally:
            serving.close()


def test_dropped_watches_and_bookmarks_resume_from_the_last_version(kube, serving):
    wait_for(lambda: kube.open_watches == 1, what="the watch")
    kube.bookmark()
    kube.end_watches()  # the API server restarts: every watch ends
    kube.add_pod(SIDECAR["pod"], SIDECAR["namespace"], "gpu-node-3", SIDECAR["ip"])
    wait_for(lambda: len(serving.pods) == 1, what="the pod after the reconnect")
    assert serving.watch.counts["kube_lists"] == 1  # resumed from its version, not listed again
    watches = [p for p in kube.requests if "watch=1" in p]
    assert len(watches) >= 2 and all("allowWatchBookmarks=true" in p for p in watches)


def test_a_watch_that_ends_at_once_is_retried_with_backoff_not_in_a_loop():
    with FakeKubeApi() as kube:
        kube.empty_watches = True  # a proxy in front of the API server that closes every watch
        watch = PodWatch(KubeApi.of(kube.url), PodDirectory()).start()
        time.sleep(2.0)
        watch.stop()
        watches = [p for p in kube.requests if "watch=1" in p]
    assert watch.synced.is_set() and 1 <= len(watches) <= 4 and watch.counts["kube_watch_errors"] >= 1


def test_a_list_whose_continue_token_expires_is_made_again_in_one_request():
    with FakeKubeApi(page_size_limit=2, watch_list="off") as kube:
        for i in range(5):
            kube.add_pod(f"worker-{i}", "jobs", "cpu-node-1", f"10.7.0.{i + 1}")
        kube.continue_expires = True
        directory = PodDirectory()
        watch = PodWatch(KubeApi.of(kube.url), directory).start()
        assert watch.synced.wait(10), "the pods were never listed"
        watch.stop()
        lists = [p for p in kube.requests if "watch=1" not in p]
    assert len(directory) == 5 and lists[-1] == "/api/v1/pods?"  # the last: every pod, no limit


def test_a_throttled_request_waits_as_long_as_retry_after_asks():
    with FakeKubeApi() as kube:
        kube.throttle(1, retry_after=2)
        started = time.monotonic()
        watch = PodWatch(KubeApi.of(kube.url), PodDirectory()).start()
        assert watch.synced.wait(10), "the pods were never listed"
        waited, errors = time.monotonic() - started, watch.counts["kube_watch_errors"]
        watch.stop()
    assert 2.0 <= waited < 5 and errors == 1


def test_a_broken_watch_resumes_from_its_last_event_and_bookmarks_are_counted(kube, serving):
    wait_for(lambda: kube.open_watches == 1, what="the watch")
    kube.add_pod(SIDECAR["pod"], SIDECAR["namespace"], "gpu-node-3", SIDECAR["ip"])
    kube.bookmark()
    wait_for(lambda: serving.watch.counts["kube_events_bookmark"] == 1, what="the bookmark")
    seen = serving.watch.version
    assert seen == str(kube.version)
    kube.empty_watches = True  # the next watch is broken: resumed from the bookmark's version all the same
    kube.end_watches()
    wait_for(lambda: serving.watch.counts["kube_watch_errors"] >= 1, what="the broken watch")
    kube.empty_watches = False
    wait_for(lambda: sum("watch=1" in p for p in kube.requests) >= 3, seconds=15, what="a watch after the break")
    assert all(f"resourceVersion={seen}" in p for p in [p for p in kube.requests if "watch=1" in p][1:])
    assert serving.watch.counts["kube_lists"] == 1


def test_the_api_being_away_is_retried_with_backoff(tmp_path):
    with FakeKubeApi() as kube:
        url = kube.url
    directory = PodDirectory()
    watch = PodWatch(KubeApi.of(url), directory).start()  # nothing listens there now
    time.sleep(1.2)
    watch.stop()
    assert 1 <= watch.counts["kube_watch_errors"] <= 3 and not watch.synced.is_set()


def test_host_network_pods_are_not_matched_by_ip_and_the_directory_is_bounded():
    directory = PodDirectory(max_pods=3)
    with FakeKubeApi() as kube:  # pod objects as the API writes them
        host = kube.add_pod("node-exporter-x", "monitoring", "cpu-node-1", "10.0.0.1", host_network=True)
        pods = [kube.add_pod(f"w-{i}", "default", "cpu-node-2", f"10.1.0.{i}") for i in range(3)]
    directory.apply("ADDED", host)
    assert directory.frame()["pod_ip"].to_list() == [None]
    for pod in pods:
        directory.apply("ADDED", pod)
    assert len(directory) == 3 and directory.counts["pods_over_limit"] == 1
    directory.apply("DELETED", pods[0])
    directory.retention_s = 0  # the ended pod is past its retention: it makes room
    directory.apply("ADDED", pods[2])
    assert len(directory) == 3 and sorted(directory.frame()["pod"]) == ["node-exporter-x", "w-1", "w-2"]


def test_metrics_show_the_pod_watch(kube, serving):
    """serve's /metrics families of the watch: pods held, synced, events by type, lists."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sloscope.commands.serve_ops import Listeners, intake_collector

    kube.add_pod("watched-0", "bookinfo", "gpu-node-3", "10.4.3.1")
    wait_for(lambda: len(serving.pods) == 1, 5, "the watch event")
    registry = CollectorRegistry()
    registry.register(intake_collector(serving.receiver, serving.writer, Listeners(), serving.watch))
    text = generate_latest(registry).decode()
    assert "sloscope_kube_pods_known 1.0" in text and "sloscope_kube_watch_synced 1.0" in text
    assert 'sloscope_kube_events_total{type="added"} 1.0' in text
    assert "sloscope_kube_lists_total 1.0" in text and "sloscope_kube_watch_errors_total 0.0" in text


@pytest.mark.parametrize("created, born", [
    ("2026-01-01T00:00:00Z", datetime(2026, 1, 1)), ("2026-01-01T01:00:00+01:00", datetime(2026, 1, 1)),
    (None, datetime(1970, 1, 1)), ("yesterday", datetime(1970, 1, 1)), ("2026-02-30T00:00:00Z", datetime(1970, 1, 1)),
])
def test_a_pods_creation_time_is_naive_utc_and_since_ever_when_unreadable(created, born):
    _, incarnation = incarnation_of({"metadata": {"uid": "u1", "name": "p-0", "namespace": "inference",
                                                  "creationTimestamp": created}, "spec": {"nodeName": "gpu-node-1"}})
    assert incarnation.born == born


def test_pod_series_that_name_no_node_are_placed_on_their_pods_node():
    """kubeletstats' pod and container series without k8s.node.name (no k8sattributes in front): on the node of
    the pod alive at the point's time; other points stay where they are."""
    import json

    import polars as pl

    from sloscope.analytics.intake import Enrichment
    from sloscope.analytics.frames import POINT_SCHEMA, Frames

    pods = PodDirectory()
    pods.apply("ADDED", {"metadata": {"uid": "u1", "name": "embedder-0", "namespace": "inference",
                                      "creationTimestamp": "2026-01-01T00:00:00Z"},
                         "spec": {"nodeName": "gpu-node-7"}, "status": {"podIP": "10.1.7.3"}})
    pod = json.dumps({"k8s.namespace.name": "inference", "k8s.pod.name": "embedder-0"}, separators=(",", ":"))
    other = json.dumps({"k8s.namespace.name": "inference", "k8s.pod.name": "gone-0"}, separators=(",", ":"))
    points = pl.DataFrame({"node": [UNKNOWN_NODE, UNKNOWN_NODE, "gpu-node-1"], "metric": ["k8s.pod.cpu.usage"] * 3,
                           "attributes": [pod, other, pod], "is_sum": [False] * 3, "cumulative": [False] * 3,
                           "start_ns": [0] * 3, "time_ns": [now_ns()] * 3, "value": [0.5, 0.2, 0.1]},
                          schema=POINT_SCHEMA)
    frames = Frames.concat([])
    frames.points = points
    counts = Enrichment(TierResolver.from_spec(load_spec(None)), pods=pods).place(frames)
    assert frames.points["node"].to_list() == ["gpu-node-7", UNKNOWN_NODE, "gpu-node-1"]
    assert counts["points_node_from_pod_name"] == 1 and counts["points_node_unknown"] == -1
