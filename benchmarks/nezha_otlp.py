"""Nezha's Online Boutique CSVs as OTLP/JSON, as benchmarks/public_rca.py loads them (its docstring says how each
column becomes what): spans with their kinds, parents and peers, pods grouped into nodes by the node columns they
share, and the pods' and nodes' metrics at their 60 s resolution."""

from __future__ import annotations

import calendar
import csv
import json
import math
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sloscope.catalog import TIER_HEADER_ATTRIBUTE

NAMESPACE = "online-boutique"
TIER = "standard"  # the built-in spec's tiers: the data has no tiers, so one for every request
ENTRY_SERVICE = "frontend"
SCOPE = {"name": "sloscope.benchmarks.public_rca"}
NODE_TOLERANCE = 1e-6
NODE_MATCH = 0.5
SPANS_PER_REQUEST = 2000
SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, SPAN_KIND_CLIENT = 1, 2, 3
KIND_NAMES = {SPAN_KIND_INTERNAL: "INTERNAL", SPAN_KIND_SERVER: "SERVER", SPAN_KIND_CLIENT: "CLIENT"}

# A Deployment's pod: NAME-<ReplicaSet hash>-<5 characters>; a bare ReplicaSet's or DaemonSet's: NAME-<5>. Both
# suffixes are in Kubernetes' safe-encoding alphabet (no vowels, no 0, 1, 3), which keeps a word of the name such
# as `exporter` from being taken for one; ReplicaSet hashes of old releases were decimal.
_K8S_HASH = "[bcdfghjklmnpqrstvwxz2456789]"
_DEPLOYMENT_POD = re.compile(rf"^(?P<service>.+?)-(?:{_K8S_HASH}{{6,10}}|[0-9]{{6,10}})-{_K8S_HASH}{{5}}$")
_SHORT_POD = re.compile(rf"^(?P<service>.+?)-{_K8S_HASH}{{5}}$")
_HEX = re.compile(r"^[0-9a-f]+$")

NODE_COLUMNS = ("NodeCpuUsageRate(%)", "NodeMemoryUsageRate(%)", "NodeNetworkReceiveBytes")
POD_CPU, POD_MEMORY = "CpuUsage(m)", "MemoryUsage(Mi)"


def service_of(pod: str) -> str:
    """The service whose pod this is: its name without the ReplicaSet and pod suffixes."""
    for pattern in (_DEPLOYMENT_POD, _SHORT_POD):
        match = pattern.match(pod)
        if match:
            return match["service"]
    return pod


# --- spans ---


@dataclass(frozen=True)
class SpanRow:
    trace: str
    span: str
    parent: str  # "" for a root
    pod: str
    name: str
    start_ns: int
    end_ns: int


@dataclass
class SpanReport:
    read: int = 0
    duplicates: int = 0
    malformed: int = 0  # ids that are not hex of their length, times that do not parse or end before they start
    orphans: int = 0  # a parent in none of the files
    kinds: Counter = field(default_factory=Counter)
    server_with_remote_child: int = 0  # SERVER (a remote parent) that also calls another pod directly
    several_peers: int = 0  # CLIENT spans whose children sit in more than one other service


def read_spans(paths: list[Path], report: SpanReport | None = None) -> list[SpanRow]:
    """The spans of these trace CSVs, each (TraceID, SpanID) once, malformed rows left out."""
    report = report if report is not None else SpanReport()
    seen: set[tuple[str, str]] = set()
    rows = []
    for path in paths:
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader)
            col = {name: i for i, name in enumerate(header)}
            i_trace, i_span, i_parent = col["TraceID"], col["SpanID"], col["ParentID"]
            i_pod, i_name = col["PodName"], col["OperationName"]
            i_start, i_end = col["StartTimeUnixNano"], col["EndTimeUnixNano"]
            for r in reader:
                report.read += 1
                try:
                    trace, span, parent = r[i_trace].lower(), r[i_span].lower(), r[i_parent].lower()
                    start, end = int(r[i_start]), int(r[i_end])
                    pod, name = r[i_pod], r[i_name]
                except (IndexError, ValueError):
                    report.malformed += 1
                    continue
                parent = "" if parent in ("root", "") else parent
                if (len(trace) != 32 or len(span) != 16 or not _HEX.match(trace + span)
                        or (parent and (len(parent) != 16 or not _HEX.match(parent)))
                        or not 0 < start <= end < 2**63 or not pod):
                    report.malformed += 1
                    continue
                if (trace, span) in seen:
                    report.duplicates += 1
                    continue
                seen.add((trace, span))
                rows.append(SpanRow(trace, span, parent, pod, name, start, end))
    return rows


def span_kinds(spans: list[SpanRow], report: SpanReport | None = None) -> dict[tuple[str, str], tuple[int, str]]:
    """(trace, span) -> (OTLP span kind, peer service or ""), from where each span's parent and children run."""
    report = report if report is not None else SpanReport()
    pod_of = {(s.trace, s.span): s.pod for s in spans}
    remote_children: dict[tuple[str, str], list[SpanRow]] = defaultdict(list)
    for s in spans:
        parent_pod = pod_of.get((s.trace, s.parent)) if s.parent else None
        if parent_pod is not None and parent_pod != s.pod:
            remote_children[s.trace, s.parent].append(s)
    kinds = {}
    for s in spans:
        key = (s.trace, s.span)
        children = remote_children.get(key, ())
        parent_pod = pod_of.get((s.trace, s.parent)) if s.parent else None
        if s.parent and parent_pod is None:
            report.orphans += 1
        if not s.parent or (parent_pod is not None and parent_pod != s.pod):
            kind, peer = SPAN_KIND_SERVER, ""
            report.server_with_remote_child += bool(children)
        elif children:
            first = min(children, key=lambda c: (c.start_ns, c.span))
            kind, peer = SPAN_KIND_CLIENT, service_of(first.pod)
            report.several_peers += len({service_of(c.pod) for c in children}) > 1
        else:
            kind, peer = SPAN_KIND_INTERNAL, ""
        report.kinds[KIND_NAMES[kind]] += 1
        kinds[key] = (kind, peer)
    return kinds


def _attribute(key: str, value) -> dict:
    if isinstance(value, list):
        return {"key": key, "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}}}
    return {"key": key, "value": {"stringValue": value}}


def _resource(attributes: dict[str, str]) -> dict:
    return {"attributes": [_attribute(k, v) for k, v in attributes.items() if v]}


def pod_resource(pod: str, node: str | None) -> dict[str, str]:
    return {"service.name": service_of(pod), "k8s.pod.name": pod, "k8s.namespace.name": NAMESPACE,
            "k8s.node.name": node or ""}


def trace_requests(spans: list[SpanRow], kinds: dict, node_of: dict[str, str]) -> list[dict]:
    """ExportTraceServiceRequest objects, one resource per pod, at most SPANS_PER_REQUEST spans each."""
    by_pod: dict[str, list[SpanRow]] = defaultdict(list)
    for s in spans:
        by_pod[s.pod].append(s)
    requests = []
    for pod in sorted(by_pod):
        resource = _resource(pod_resource(pod, node_of.get(pod)))
        entry = service_of(pod) == ENTRY_SERVICE
        out = []
        for s in sorted(by_pod[pod], key=lambda s: (s.start_ns, s.trace, s.span)):
            kind, peer = kinds[s.trace, s.span]
            span = {"traceId": s.trace, "spanId": s.span, "name": s.name, "kind": kind,
                    "startTimeUnixNano": str(s.start_ns), "endTimeUnixNano": str(s.end_ns)}
            if s.parent:
                span["parentSpanId"] = s.parent
            attributes = []
            if peer:
                attributes.append(_attribute("peer.service", peer))
            if entry and not s.parent:
                attributes.append(_attribute(TIER_HEADER_ATTRIBUTE, [TIER]))
            if attributes:
                span["attributes"] = attributes
            out.append(span)
        for i in range(0, len(out), SPANS_PER_REQUEST):
            requests.append({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": SCOPE, "spans": out[i:i + SPANS_PER_REQUEST]}]}]})
    return requests


# --- metrics and nodes ---


@dataclass(frozen=True)
class MetricRow:
    time_ns: int
    cpu_m: float
    memory_mi: float
    node: tuple[float, float, float]  # NODE_COLUMNS

    @property
    def minute(self) -> int:
        return self.time_ns // 60_000_000_000


def parse_time(text: str) -> int:
    """ns since the epoch of a `Time` value: `2022-08-22 03:51:19.799087274 +0000 UTC m=+0.305041286`."""
    parts = text.split()
    if len(parts) < 3 or parts[2] != "+0000":
        raise ValueError(f"not a UTC time: {text!r}")
    whole, _, fraction = parts[1].partition(".")
    seconds = calendar.timegm(time.strptime(f"{parts[0]} {whole}", "%Y-%m-%d %H:%M:%S"))
    return seconds * 1_000_000_000 + int((fraction + "000000000")[:9])


def read_pod_metrics(metric_dir: Path) -> tuple[dict[str, list[MetricRow]], int]:
    """pod -> its rows in time order, from POD_metric.csv (the pod named by the file), and the count of rows left
    out (a time or value that does not parse)."""
    pods, bad = {}, 0
    for path in sorted(metric_dir.glob("*_metric.csv")):
        pod = path.name[:-len("_metric.csv")]
        rows = []
        with path.open(newline="") as f:
            reader = csv.reader(f)
            col = {name: i for i, name in enumerate(next(reader))}
            for r in reader:
                try:
                    row = MetricRow(parse_time(r[col["Time"]]), float(r[col[POD_CPU]]), float(r[col[POD_MEMORY]]),
                                    tuple(float(r[col[c]]) for c in NODE_COLUMNS))
                except (IndexError, ValueError):
                    bad += 1
                    continue
                if all(math.isfinite(v) for v in (row.cpu_m, row.memory_mi, *row.node)):
                    rows.append(row)
                else:
                    bad += 1
        pods[pod] = sorted(rows, key=lambda r: r.time_ns)
    return pods, bad


def _same_node_values(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(math.isclose(x, y, rel_tol=NODE_TOLERANCE, abs_tol=1e-12) for x, y in zip(a, b))


@dataclass
class NodeGrouping:
    node_of: dict[str, str]  # pod -> node-N
    pairs: dict[tuple[str, str], tuple[int, int]]  # (pod, pod) -> (minutes equal, minutes both report)

    @property
    def nodes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for pod, node in sorted(self.node_of.items()):
            out[node].append(pod)
        return dict(sorted(out.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1])))

    def lines(self) -> list[str]:
        out = []
        for node, pods in self.nodes.items():
            evidence = [f"{a} = {b} at {equal}/{both} minutes" for (a, b), (equal, both) in sorted(self.pairs.items())
                        if a in pods and b in pods and equal >= NODE_MATCH * both]
            out.append(f"{node}: {', '.join(pods)}" + (f" ({'; '.join(evidence)})" if evidence else ""))
        return out


def group_nodes(pods: dict[str, list[MetricRow]]) -> NodeGrouping:
    """Pods whose node columns are equal at the same minutes share a node (see the module's docstring)."""
    # A zero in a node column is a sample the data lacks (no node is ever wholly idle or empty): not compared.
    by_minute = {pod: {r.minute: r.node for r in rows if all(r.node)} for pod, rows in pods.items()}
    names = sorted(pods)
    parent = {p: p for p in names}

    def root(p: str) -> str:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    pairs = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = by_minute[a].keys() & by_minute[b].keys()
            equal = sum(_same_node_values(by_minute[a][m], by_minute[b][m]) for m in both)
            pairs[a, b] = (equal, len(both))
            if both and equal >= NODE_MATCH * len(both):
                parent[root(b)] = root(a)
    groups: dict[str, list[str]] = defaultdict(list)
    for p in names:
        groups[root(p)].append(p)
    ordered = sorted(groups.values(), key=lambda members: members[0])
    node_of = {p: f"node-{i}" for i, members in enumerate(ordered, 1) for p in members}
    return NodeGrouping(node_of, pairs)


def _gauge(name: str, unit: str, points: list[tuple[int, float | int]], attributes: dict | None = None) -> dict:
    attrs = [_attribute(k, v) for k, v in (attributes or {}).items()]
    data = []
    for t, v in points:
        point = {"timeUnixNano": str(t), **({"asInt": str(v)} if isinstance(v, int) else {"asDouble": v})}
        if attrs:
            point["attributes"] = attrs
        data.append(point)
    return {"name": name, "unit": unit, "gauge": {"dataPoints": data}}


def metric_requests(pods: dict[str, list[MetricRow]], node_of: dict[str, str], since_ns: int = 0,
                    until_ns: int = 2**63) -> list[dict]:
    """ExportMetricsServiceRequest objects for the rows in [since_ns, until_ns): one per pod (kubeletstats'
    pod CPU and working set) and one per node (hostmetrics' CPU and memory utilization, from the node's pods'
    rows: at each minute the earliest that has the value). A value of exactly 0 is a sample the data lacks (a
    running pod or node never uses no CPU or memory for a minute; a few rows hold such zeros) and is left out."""
    requests = []
    node_points: dict[str, list[dict[int, tuple[int, float]]]] = defaultdict(lambda: [{}, {}])
    for pod in sorted(pods):
        rows = [r for r in pods[pod] if since_ns <= r.time_ns < until_ns]
        if not rows:
            continue
        node = node_of.get(pod)
        resource = _resource({"k8s.pod.name": pod, "k8s.namespace.name": NAMESPACE, "k8s.node.name": node or ""})
        metrics = [_gauge("k8s.pod.cpu.usage", "{cpu}", [(r.time_ns, r.cpu_m / 1000.0) for r in rows if r.cpu_m]),
                   _gauge("k8s.pod.memory.working_set", "By",
                          [(r.time_ns, round(r.memory_mi * 2**20)) for r in rows if r.memory_mi])]
        requests.append({"resourceMetrics": [{"resource": resource, "scopeMetrics": [
            {"scope": SCOPE, "metrics": [m for m in metrics if m["gauge"]["dataPoints"]]}]}]})
        if node:
            for r in rows:
                for column, points in enumerate(node_points[node]):
                    kept = points.get(r.minute)
                    if r.node[column] and (kept is None or r.time_ns < kept[0]):
                        points[r.minute] = (r.time_ns, r.node[column] / 100.0)
    for node in sorted(node_points):
        cpu, memory = ([points[m] for m in sorted(points)] for points in node_points[node])
        metrics = [_gauge("system.cpu.utilization", "1", cpu, {"state": "user"}),
                   _gauge("system.memory.utilization", "1", memory, {"state": "used"})]
        requests.append({"resourceMetrics": [{"resource": _resource({"k8s.node.name": node}), "scopeMetrics": [
            {"scope": SCOPE, "metrics": [m for m in metrics if m["gauge"]["dataPoints"]]}]}]})
    return requests


def count_points(requests: list[dict]) -> int:
    return sum(len(m["gauge"]["dataPoints"]) for r in requests for rm in r["resourceMetrics"]
               for sm in rm["scopeMetrics"] for m in sm["metrics"])


def write_jsonl(path: Path, requests: list[dict]) -> Path:
    with path.open("w") as f:
        for request in requests:
            f.write(json.dumps(request, separators=(",", ":")) + "\n")
    return path
