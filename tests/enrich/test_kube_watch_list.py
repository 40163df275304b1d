"""The pod watch through a streaming list (KEP-3157 WatchList): one watch whose initial events are the pods, ended
by the bookmark annotated k8s.io/initial-events-end, where the API server streams lists, and the list and watch
where it does not (the stand-in tests/fakes/kube_api.py is either): the same pods on the same nodes either way,
through deletions and node changes while the initial events are sent and a 410 among them."""

import time

import pytest

from sloscope.enrich.kube_watch import KubeApi, PodWatch
from sloscope.enrich.pods import PodDirectory
from tests.fakes.kube_api import FakeKubeApi

WAIT_S = 10.0


def wait_for(condition, seconds: float = WAIT_S, what: str = "the condition"):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.05)


def pod_map(directory: PodDirectory) -> list[tuple]:
    """(namespace, pod, IP, node, alive) of every incarnation held, in order."""
    frame = directory.frame()
    return sorted(zip(frame["namespace"], frame["pod"], frame["pod_ip"], frame["pod_node"],
                      frame["died"].is_null()))


def add_cluster(kube: FakeKubeApi) -> None:
    """Pods of every kind the directory tells apart: on nodes, on the host network, pending, finished."""
    for i in range(5):
        kube.add_pod(f"chat-{i}", "inference", f"gpu-node-{i % 2}", f"10.4.0.{i}")
    kube.add_pod("node-exporter-a", "monitoring", "gpu-node-0", "10.0.0.1", host_network=True)
    kube.add_pod("chat-pending", "inference", None, None, phase="Pending")
    kube.add_pod("batch-done", "jobs", "cpu-node-1", "10.7.0.1", phase="Succeeded")


def watch_lists(kube: FakeKubeApi) -> list[str]:
    return [p for p in kube.requests if "sendInitialEvents=true" in p]


def lists(kube: FakeKubeApi) -> list[str]:
    return [p for p in kube.requests if "watch=1" not in p]


def synced_map(watch_list: str, wait_s: float = 1.0) -> tuple[list[tuple], FakeKubeApi, PodWatch, float]:
    """The pod map of add_cluster's pods as a PodWatch builds it against a server with `watch_list`, its stand-in,
    the watch, and how long the first sync took."""
    with FakeKubeApi(page_size_limit=2, watch_list=watch_list) as kube:
        add_cluster(kube)
        started = time.monotonic()
        watch = PodWatch(KubeApi.of(kube.url), PodDirectory(), watch_timeout_s=5, watch_list_wait_s=wait_s).start()
        try:
            assert watch.synced.wait(WAIT_S), "the pods were never synced"
            took = time.monotonic() - started
            return pod_map(watch.directory), kube, watch, took
        finally:
            watch.stop()


def test_the_pods_are_streamed_by_one_watch_without_a_list_request():
    with FakeKubeApi(page_size_limit=2) as kube:
        add_cluster(kube)
        directory = PodDirectory()
        watch = PodWatch(KubeApi.of(kube.url), directory, watch_timeout_s=5).start()
        try:
            assert watch.synced.wait(WAIT_S), "the pods were never synced"
            assert len(directory) == 7  # the pending pod is on no node yet
            kube.add_pod("chat-new", "inference", "gpu-node-1", "10.4.0.9")
            wait_for(lambda: len(directory) == 8, what="the pod added after the initial events")
        finally:
            watch.stop()
    assert lists(kube) == [] and len(kube.requests) == 1  # the same watch went on after its initial events
    request = kube.requests[0]
    assert all(option in request for option in ("watch=1", "sendInitialEvents=true", "allowWatchBookmarks=true",
                                                 "resourceVersionMatch=NotOlderThan", "resourceVersion=&"))
    assert watch.version == str(kube.version) and watch.counts["kube_lists"] == 1
    assert watch.counts["kube_events_added"] == 1 and watch.counts["kube_watch_errors"] == 0


@pytest.mark.parametrize("watch_list", ["off", "ignored"])
def test_a_server_that_does_not_stream_lists_is_listed_and_watched_into_the_same_map(watch_list):
    streamed, *_ = synced_map("on")
    listed, kube, watch, took = synced_map(watch_list, wait_s=1.0)
    assert listed == streamed
    assert len(watch_lists(kube)) == 1 and lists(kube)  # asked once, then listed page by page
    assert any("continue=" in p for p in lists(kube))
    # A refusal (422 Invalid, as the API server answers with the WatchList feature gate off) is followed at
    # once; a stream that never ends its initial events, after watch_list_wait_s.
    assert took < 1.0 if watch_list == "off" else 1.0 <= took < 5.0
    assert watch.counts["kube_watch_errors"] == 0


def test_a_server_that_does_not_stream_lists_is_not_asked_again_at_the_next_relist():
    with FakeKubeApi(watch_list="off") as kube:
        add_cluster(kube)
        watch = PodWatch(KubeApi.of(kube.url), PodDirectory(), watch_timeout_s=5).start()
        try:
            assert watch.synced.wait(WAIT_S), "the pods were never synced"
            wait_for(lambda: kube.open_watches == 1, what="the watch")
            kube.compact()  # the watch's version expires: the pods are needed again in full
            wait_for(lambda: len(lists(kube)) == 2, what="the relist")
        finally:
            watch.stop()
    assert len(watch_lists(kube)) == 1 and watch.counts["kube_relists_gone"] == 1


def test_pods_deleted_or_moved_during_the_initial_events_are_as_a_list_and_watch_leaves_them():
    with FakeKubeApi() as kube:
        ended = kube.add_pod("chat-0", "inference", "gpu-node-0", "10.4.0.1")
        moved = kube.add_pod("chat-1", "inference", "gpu-node-0", "10.4.0.2")
        bound = kube.add_pod("chat-2", "inference", None, None, phase="Pending")
        kube.initial_events_end_held = True  # the server catches up: changes come before the end bookmark
        directory = PodDirectory()
        watch = PodWatch(KubeApi.of(kube.url), directory, watch_timeout_s=5).start()
        try:
            wait_for(lambda: kube.open_watches == 1, what="the streaming list")
            kube.delete_pod(ended)
            kube.update_pod(moved, node="gpu-node-1")
            kube.update_pod(bound, node="gpu-node-2", phase="Running", podIP="10.4.2.1")
            kube.add_pod("chat-3", "inference", "gpu-node-3", "10.4.3.1")
            time.sleep(0.5)
            assert not watch.synced.is_set()  # nothing is complete before the end bookmark
            kube.release_initial_events_end()
            assert watch.synced.wait(WAIT_S), "the pods were never synced"
        finally:
            watch.stop()
    assert pod_map(directory) == [("inference", "chat-0", "10.4.0.1", "gpu-node-0", False),
                                  ("inference", "chat-1", "10.4.0.2", "gpu-node-1", True),
                                  ("inference", "chat-2", "10.4.2.1", "gpu-node-2", True),
                                  ("inference", "chat-3", "10.4.3.1", "gpu-node-3", True)]
    assert lists(kube) == [] and watch.version == str(kube.version)


@pytest.mark.parametrize("before", ["first sync", "relist"])
def test_a_410_among_the_initial_events_streams_the_pods_again_from_scratch(before):
    with FakeKubeApi() as kube:
        kube.add_pod("chat-0", "inference", "gpu-node-0", "10.4.0.1")
        lost = kube.add_pod("chat-1", "inference", "gpu-node-1", "10.4.0.2")
        directory = PodDirectory()
        watch = PodWatch(KubeApi.of(kube.url), directory, watch_timeout_s=5)
        if before == "relist":  # synced, then a 410 makes it stream the pods again
            watch.start()
            assert watch.synced.wait(WAIT_S), "the pods were never synced"
            kube.initial_events_end_held = True
            kube.compact()
            wait_for(lambda: len(watch_lists(kube)) == 2, what="the second streaming list")
        else:
            kube.initial_events_end_held = True
            watch.start()
        try:
            wait_for(lambda: kube.open_watches == 1, what="the streaming list")
            kube.pods.pop(lost["metadata"]["uid"])  # gone, with its event compacted before it was sent
            kube.compact(in_stream=True)  # a 410 before the end of the initial events, which had the lost pod
            wait_for(lambda: len(watch_lists(kube)) == (2 if before == "first sync" else 3), what="a new stream")
            kube.release_initial_events_end()
            wait_for(lambda: watch.version == str(kube.version), what="the end of the new initial events")
        finally:
            watch.stop()
    assert pod_map(directory) == [("inference", "chat-0", "10.4.0.1", "gpu-node-0", True),
                                  ("inference", "chat-1", "10.4.0.2", "gpu-node-1", False)]
    assert lists(kube) == [] and watch.synced.is_set()
    # After a relist's 410, this one is a second in a row: streamed again after a backoff, as any relist.
    relists, errors = (1, 0) if before == "first sync" else (2, 1)
    assert watch.counts["kube_relists_gone"] == relists and watch.counts["kube_watch_errors"] == errors
