"""Pods by name and by IP, as the Kubernetes API reports them (enrich/kube_watch.py), so that a request span that
names its pod but no node (Envoy's sidecar and gateway spans, SDK services without host attributes) is placed on
the pod's node, as the OpenTelemetry Collector's k8sattributes processor associates pods.

A pod is known by its incarnation (uid): names come back (StatefulSets) and IPs are reused once a pod is gone, so
a span is matched to the incarnation that was alive when the span started, never to a dead pod's IP later reused.
Dead incarnations are kept for RETENTION_S (late spans of a pod that just ended still find it), and the whole
directory is bounded (MAX_PODS)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import polars as pl

from sloscope.catalog import POD_RESOURCE, UNKNOWN_NODE
from sloscope.times import rfc3339_or_none

RETENTION_S = 600.0  # how long a dead pod still places the spans that arrive late from it
MAX_PODS = 200_000  # incarnations held, alive and dead: a bound on memory, far above a cluster's pods
CLOCK_SKEW_S = 1.0  # a span may start this much before its pod's creation time (clocks of different machines)
PODS_SCHEMA = {"namespace": pl.String, "pod": pl.String, "pod_ip": pl.String, "pod_node": pl.String,
               "born": pl.Datetime("us"), "died": pl.Datetime("us")}


@dataclass
class Incarnation:
    namespace: str
    name: str
    ip: str | None  # None for host-network pods: their IP is the node's, shared by many pods
    node: str
    born: datetime
    died: datetime | None = None


def incarnation_of(pod: dict) -> tuple[str, Incarnation | None]:
    """(uid, the incarnation) from a Pod object of the Kubernetes API; None for a pod not on a node yet."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    uid, node = meta.get("uid"), spec.get("nodeName")
    if not (isinstance(uid, str) and isinstance(node, str) and node and meta.get("name") and meta.get("namespace")):
        return str(uid), None
    ip = status.get("podIP")
    finished = status.get("phase") in ("Succeeded", "Failed")  # its IP is released while the object remains
    return uid, Incarnation(str(meta["namespace"]), str(meta["name"]),
                            ip if isinstance(ip, str) and ip and not spec.get("hostNetwork") else None, node,
                            _timestamp(meta.get("creationTimestamp")), _now() if finished else None)


def _timestamp(text) -> datetime:
    """An RFC 3339 time of the API (UTC, whole seconds), as a naive UTC datetime like the store's."""
    # no creation time, or one that is not a time: alive since ever (the IP rule still needs it alive)
    return rfc3339_or_none(text) or datetime(1970, 1, 1)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class PodDirectory:
    """The pods of the cluster, updated by the watch (another thread) and read by the intake's request threads."""

    def __init__(self, retention_s: float = RETENTION_S, max_pods: int = MAX_PODS):
        self.retention_s, self.max_pods = retention_s, max_pods
        self.counts: Counter = Counter()
        self.changed = threading.Event()  # set when a pod appears or changes: a late placement may now succeed
        self._pods: dict[str, Incarnation] = {}
        self._lock = threading.Lock()
        self._frame: pl.DataFrame | None = None

    def __len__(self) -> int:
        return len(self._pods)

    def apply(self, event: str, pod: dict) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) for a Pod object."""
        uid, incarnation = incarnation_of(pod)
        with self._lock:
            known = self._pods.get(uid)
            if event == "DELETED":
                if known is not None and known.died is None:
                    known.died = _now()
            elif incarnation is not None:
                if known is not None and known.died is not None:
                    incarnation.died = known.died  # an update after its end neither brings it back nor moves it
                self._put(uid, incarnation)
                if known is None or (known.ip, known.node) != (incarnation.ip, incarnation.node):
                    self.changed.set()  # not for every status update: only what can place a request
            self._frame = None

    def replace_all(self, pods: list[dict]) -> None:
        """The pods of a fresh list: those held but not listed ended while no watch was open."""
        listed = set()
        for pod in pods:
            self.apply("ADDED", pod)
            listed.add(incarnation_of(pod)[0])
        self.end_unlisted(listed)

    def end_unlisted(self, listed: set[str]) -> None:
        """After a fresh list (or a streaming list's initial events, applied as they came), the pods held but not
        among the uids `listed` ended while no watch was open."""
        with self._lock:
            for uid, known in self._pods.items():
                if uid not in listed and known.died is None:
                    known.died = _now()
            self._frame = None

    def _put(self, uid: str, incarnation: Incarnation) -> None:
        if uid not in self._pods and len(self._pods) >= self.max_pods:
            self._forget_dead()
            if len(self._pods) >= self.max_pods:
                self.counts["pods_over_limit"] += 1
                return
        self._pods[uid] = incarnation

    def _forget_dead(self) -> None:
        horizon = _now().timestamp() - self.retention_s
        dead = sorted((p.died, uid) for uid, p in self._pods.items() if p.died is not None)
        for died, uid in dead:
            if died.timestamp() < horizon or len(self._pods) >= self.max_pods:
                del self._pods[uid]

    def frame(self) -> pl.DataFrame:
        """The incarnations as a frame (rebuilt only after a change)."""
        with self._lock:
            if self._frame is None:
                self._forget_dead()
                pods = list(self._pods.values())
                self._frame = pl.DataFrame(
                    {"namespace": [p.namespace for p in pods], "pod": [p.name for p in pods],
                     "pod_ip": [p.ip for p in pods], "pod_node": [p.node for p in pods],
                     "born": [p.born for p in pods], "died": [p.died for p in pods]}, schema=PODS_SCHEMA)
            return self._frame

    def place(self, requests: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
        """(requests with the node of those naming none filled from their pod, how many by pod name and
        namespace, how many by pod IP). Columns used: node, namespace, pod, pod_ip, start_time."""
        if not requests["node"].null_count() or not self._pods:
            return requests, 0, 0
        pods = self.frame()
        rows = requests.with_row_index("_row")
        unplaced = rows.filter(pl.col("node").is_null()).select("_row", "namespace", "pod", "pod_ip", "start_time")
        by_name = _alive_at_start(unplaced.drop("pod_ip").join(pods.drop("pod_ip"), on=["namespace", "pod"]))
        by_ip = _alive_at_start(unplaced.drop("namespace", "pod").join(pods.drop("namespace", "pod"), on="pod_ip"))
        by_ip = by_ip.join(by_name, on="_row", how="anti")
        found = pl.concat([by_name, by_ip])
        placed = rows.join(found, on="_row", how="left").with_columns(node=pl.coalesce("node", "pod_node"))
        return placed.select(requests.columns), len(by_name), len(by_ip)


def place_requests(requests: pl.DataFrame, directory: PodDirectory, peer: str | None) -> tuple[pl.DataFrame, Counter]:
    """The intake's placement by pod: a request naming no node, pod or pod IP takes the client's address as its
    pod IP (k8sattributes' `connection` association: an SDK exporting straight here connects from its pod),
    then those naming no node are placed by pod name, else pod IP. The rest keep what identifies their pod, for
    a late placement once the pod is known; those with nothing to place them by are counted as unresolved."""
    counts: Counter = Counter()
    if not requests["node"].null_count():  # every request names its node (the common case): nothing to place
        return requests, counts
    if peer:
        anonymous = pl.col("node").is_null() & pl.col("pod").is_null() & pl.col("pod_ip").is_null()
        counts["spans_pod_ip_from_connection"] = int(requests.select(anonymous.sum()).item())
        requests = requests.with_columns(pod_ip=pl.when(anonymous).then(pl.lit(peer)).otherwise(pl.col("pod_ip")))
    requests, by_name, by_ip = directory.place(requests)
    counts["spans_node_from_pod_name"] += by_name
    counts["spans_node_from_pod_ip"] += by_ip
    # Nothing names their node, pod or GPU: no placement, now or later, can move them off the unknown node.
    unresolved = pl.all_horizontal(pl.col(c).is_null() for c in ("node", "pod", "pod_ip", "gpu_id"))
    counts["spans_node_unresolved"] = int(requests.select(unresolved.sum()).item())
    return requests, counts


def place_points(points: pl.DataFrame, directory: PodDirectory) -> tuple[pl.DataFrame, int]:
    """(data points, how many were placed): those on the unknown node whose series names its pod (kubeletstats'
    pod and container series, where no k8sattributes processor added the node) go to the node of the pod
    incarnation alive at the point's time. Columns used: node, attributes, time_ns."""
    pod_key = f'"{POD_RESOURCE[0]}"'
    lost = (pl.col("node") == UNKNOWN_NODE) & pl.col("attributes").str.contains(pod_key, literal=True)
    if points.is_empty() or not len(directory) or not points.select(lost.any()).item():
        return points, 0
    rows = points.with_row_index("_row")
    candidates = rows.filter(lost).select("_row", "attributes", "time_ns")
    series = candidates["attributes"].unique().to_list()
    pods = [_pod_of(text) for text in series]
    named = pl.DataFrame({"attributes": series, "pod": [p for p, _ in pods], "namespace": [n for _, n in pods]},
                         schema={"attributes": pl.String, "pod": pl.String, "namespace": pl.String})
    candidates = candidates.join(named, on="attributes").with_columns(
        start_time=pl.from_epoch("time_ns", time_unit="ns").cast(pl.Datetime("us")))
    found = _alive_at_start(candidates.join(directory.frame().drop("pod_ip"), on=["namespace", "pod"]))
    placed = rows.join(found, on="_row", how="left").with_columns(node=pl.coalesce("pod_node", "node"))
    return placed.select(points.columns), len(found)


def _pod_of(attributes: str) -> tuple[str | None, str | None]:
    values = json.loads(attributes)
    pod, namespace = (values.get(key) for key in POD_RESOURCE)
    return (pod, namespace) if isinstance(pod, str) and isinstance(namespace, str) else (None, None)


def _alive_at_start(candidates: pl.DataFrame) -> pl.DataFrame:
    """Per request row, the node of the newest incarnation alive when the request started."""
    alive = candidates.filter(
        (pl.col("start_time") >= pl.col("born") - pl.duration(seconds=CLOCK_SKEW_S))
        & (pl.col("died").is_null() | (pl.col("start_time") < pl.col("died"))))
    return alive.sort("born").group_by("_row").agg(pl.col("pod_node").last()).with_columns(
        pl.col("_row").cast(pl.UInt32))
