"""OTLP metrics shaped as the OpenTelemetry Collector's hostmetrics (cpu and load scrapers) and kubeletstats
(node, pod and container groups) receivers send them, after the `resource/node` processor of
deploy/otelcol-contrib-gateway.yaml has inserted `k8s.node.name`.

From opentelemetry-collector-contrib's metadata.yaml files and scrapers:

- hostmetrics cpu (scope .../hostmetricsreceiver/internal/scraper/cpuscraper): `system.cpu.time`, a cumulative
  monotonic double Sum in `s` from boot, and `system.cpu.utilization` (optional, enabled in the deploy config), a
  double Gauge in `1`; both per logical CPU and state, attributes `cpu` (gopsutil's `cpu0`, `cpu1`, ...) and
  `state` (user, system, idle, interrupt, nice, softirq, steal, wait). Utilization is the time's delta over the
  elapsed time, so the first scrape has none.
- hostmetrics load (scope .../loadscraper): `system.cpu.load_average.1m`, `.5m`, `.15m`, double Gauges in
  `{thread}`, no attributes, from /proc/loadavg.
- kubeletstats (scope .../receiver/kubeletstatsreceiver): `k8s.node.cpu.usage`, `k8s.pod.cpu.usage`,
  `container.cpu.usage`, double Gauges in `{cpu}` (the kubelet's usageNanoCores / 1e9), and `k8s.node.cpu.time`,
  `k8s.pod.cpu.time`, `container.cpu.time`, cumulative monotonic double Sums in `s` starting when the node, pod
  or container started. One resource per node (`k8s.node.name`), per pod (`k8s.pod.uid`, `k8s.pod.name`,
  `k8s.namespace.name`) and per container (the pod's and `k8s.container.name`).

Hostmetrics resources carry `host.name` too, as the resourcedetection processor's system detector gives it on a
Collector in the host's network namespace.

The values are generated (`ModelHost`, `SteadyCpu`, `HogCpu`): a steady baseline with jitter, and the rise a CPU
hog pinned to one CPU causes while it runs. They are not read from this machine's /proc because the machine is
shared: other work saturating its CPUs already hides a hog from utilization and load averages, which then say
nothing about the node the test models."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, ResourceMetrics

from tests.otlp_http import post

CONTRIB = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/"
CPU_SCOPE = CONTRIB + "hostmetricsreceiver/internal/scraper/cpuscraper"
LOAD_SCOPE = CONTRIB + "hostmetricsreceiver/internal/scraper/loadscraper"
KUBELETSTATS_SCOPE = CONTRIB + "kubeletstatsreceiver"
COLLECTOR_VERSION = "0.144.0"  # a scope's version is the Collector's build version
CPU_STATES = ("user", "nice", "system", "idle", "wait", "interrupt", "softirq", "steal")
NOT_BUSY = ("idle", "wait")

CpuTimes = dict[str, dict[str, float]]  # cpu label -> state -> seconds since boot


def _attributes(target, values: dict[str, str]) -> None:
    target.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items())


def _scope(resource: dict[str, str], scope: str):
    block = ResourceMetrics()
    _attributes(block.resource.attributes, resource)
    scope_metrics = block.scope_metrics.add()
    scope_metrics.scope.name, scope_metrics.scope.version = scope, COLLECTOR_VERSION
    return block, scope_metrics


def _gauge(scope_metrics, name: str, unit: str, description: str, points: list[tuple[dict, float]], now: int):
    metric = scope_metrics.metrics.add(name=name, unit=unit, description=description)
    for attrs, value in points:
        point = metric.gauge.data_points.add(time_unix_nano=now, as_double=value)
        _attributes(point.attributes, attrs)


def _cumulative(scope_metrics, name: str, unit: str, description: str, points: list[tuple[dict, float]],
                start: int, now: int):
    metric = scope_metrics.metrics.add(name=name, unit=unit, description=description)
    metric.sum.aggregation_temporality, metric.sum.is_monotonic = AGGREGATION_TEMPORALITY_CUMULATIVE, True
    for attrs, value in points:
        point = metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=now, as_double=value)
        _attributes(point.attributes, attrs)


def _per_cpu_state(values: CpuTimes) -> list[tuple[dict, float]]:
    return [({"cpu": cpu, "state": state}, value) for cpu, states in values.items() for state, value in states.items()]


def hostmetrics(node: str, times: CpuTimes, utilization: CpuTimes | None, load: tuple[float, float, float],
                boot_ns: int, now: int) -> list[ResourceMetrics]:
    resource = {"host.name": node, "k8s.node.name": node}
    cpu, cpu_metrics = _scope(resource, CPU_SCOPE)
    _cumulative(cpu_metrics, "system.cpu.time", "s", "Total seconds each logical CPU spent on each mode.",
                _per_cpu_state(times), boot_ns, now)
    if utilization is not None:
        _gauge(cpu_metrics, "system.cpu.utilization", "1", "Difference in system.cpu.time since the last "
               "measurement per logical CPU, divided by the elapsed time (value in interval [0,1]).",
               _per_cpu_state(utilization), now)
    loads, load_metrics = _scope(resource, LOAD_SCOPE)
    for window, value in zip(("1m", "5m", "15m"), load):
        _gauge(load_metrics, f"system.cpu.load_average.{window}", "{thread}",
               f"Average CPU Load over {window[:-1]} minute{'s' if window != '1m' else ''}.", [({}, value)], now)
    return [cpu, loads]


def _kubelet_cpu(resource: dict[str, str], prefix: str, seconds: float, usage: float | None, start: int,
                 now: int) -> ResourceMetrics:
    block, scope_metrics = _scope(resource, KUBELETSTATS_SCOPE)
    _cumulative(scope_metrics, f"{prefix}.cpu.time", "s", "Total cumulative CPU time (sum of all cores) spent by "
                "the container/pod/node since its creation", [({}, seconds)], start, now)
    if usage is not None:
        _gauge(scope_metrics, f"{prefix}.cpu.usage", "{cpu}", "Total CPU usage (sum of all cores per second) "
               "averaged over the sample window", [({}, usage)], now)
    return block


@dataclass
class Pod:
    """A pod as the API lists it (tests/fakes/kube_api.py's pod object), with one container whose CPU time
    `cpu_seconds(elapsed_s)` gives (cumulative seconds)."""

    api_object: dict
    cpu_seconds: Callable[[float], float]
    container: str = "main"
    started_ns: int = field(default_factory=time.time_ns)

    def resource(self, node: str) -> dict[str, str]:
        meta = self.api_object["metadata"]
        return {"k8s.pod.uid": meta["uid"], "k8s.pod.name": meta["name"], "k8s.namespace.name": meta["namespace"],
                "k8s.node.name": node}


def kubeletstats(node: str, node_seconds: float, node_usage: float | None, node_started_ns: int,
                 pods: list[tuple[Pod, float, float | None]], now: int) -> list[ResourceMetrics]:
    """The node group, then per pod (pod, cumulative CPU seconds, usage) the pod and its container groups (one
    container per pod, so the two agree)."""
    blocks = [_kubelet_cpu({"k8s.node.name": node}, "k8s.node", node_seconds, node_usage, node_started_ns, now)]
    for pod, seconds, usage in pods:
        blocks.append(_kubelet_cpu(pod.resource(node), "k8s.pod", seconds, usage, pod.started_ns, now))
        blocks.append(_kubelet_cpu({**pod.resource(node), "k8s.container.name": pod.container}, "container",
                                   seconds, usage, pod.started_ns, now))
    return blocks


# --- sources ---------------------------------------------------------------------------------------------

class ModelHost:
    """A node's CPUs and load, generated: each CPU busy a steady share (jittered per sample), and a run queue of
    about `runnable` threads, from which the load averages follow as the kernel computes them (every 5 s, an
    exponential average over 1, 5 and 15 minutes). While `hog()` says a CPU hog with `hog_threads` threads runs,
    pinned to the node's last CPU, that CPU is busy all the time (user time) and the run queue holds them too."""

    SHARES = {"user": 0.25, "system": 0.06, "softirq": 0.01, "wait": 0.005}
    LOAD_TICK_S = 5.0
    LOAD_WINDOWS_S = (60.0, 300.0, 900.0)

    def __init__(self, cpus: int, rng: random.Random, runnable: float = 0.8,
                 hog: Callable[[], bool] = lambda: False, hog_threads: int = 0):
        self.rng, self.runnable, self.hog, self.hog_threads = rng, runnable, hog, hog_threads
        self.boot_ns = time.time_ns() - 3 * 86400 * 10**9
        self.times = {f"cpu{i}": {s: 0.0 for s in CPU_STATES} for i in range(cpus)}
        self.averages = [runnable] * len(self.LOAD_WINDOWS_S)
        self._until_tick = self.LOAD_TICK_S

    def cpu_times(self, elapsed_s: float) -> CpuTimes:
        hogged = self.hog()
        for cpu, states in self.times.items():
            spent = {state: share * elapsed_s * self.rng.uniform(0.85, 1.15) for state, share in self.SHARES.items()}
            if hogged and cpu == f"cpu{len(self.times) - 1}":
                spent["user"] = elapsed_s - spent["system"] - spent["softirq"]
                spent["wait"] = 0.0
            spent["idle"] = max(elapsed_s - sum(spent.values()), 0.0)
            for state, seconds in spent.items():
                states[state] += seconds
        self._advance_load(elapsed_s, hogged)
        return {cpu: dict(states) for cpu, states in self.times.items()}

    def _advance_load(self, elapsed_s: float, hogged: bool) -> None:
        self._until_tick -= elapsed_s
        while self._until_tick <= 0:
            self._until_tick += self.LOAD_TICK_S
            queued = self.runnable * self.rng.uniform(0.8, 1.2) + (self.hog_threads if hogged else 0)
            for i, window in enumerate(self.LOAD_WINDOWS_S):
                decay = math.exp(-self.LOAD_TICK_S / window)
                self.averages[i] = self.averages[i] * decay + queued * (1 - decay)

    def load(self) -> tuple[float, float, float]:
        return tuple(round(average, 2) for average in self.averages)


class SteadyCpu:
    """A pod's CPU time: about `cpus` CPUs' worth of work, jittered per sample."""

    def __init__(self, cpus: float, rng: random.Random):
        self.cpus, self.rng, self.total = cpus, rng, 0.0

    def __call__(self, elapsed_s: float) -> float:
        self.total += self.cpus * elapsed_s * self.rng.uniform(0.85, 1.15)
        return self.total


class HogCpu:
    """The CPU hog's pod: one whole CPU while `hog()` says it runs, nothing otherwise."""

    def __init__(self, hog: Callable[[], bool]):
        self.hog, self.total = hog, 0.0

    def __call__(self, elapsed_s: float) -> float:
        self.total += elapsed_s if self.hog() else 0.0
        return self.total


# --- the sender ------------------------------------------------------------------------------------------

class ReceiverMetrics:
    """Every `interval_s`, per node, what the two receivers would export, posted as one OTLP/HTTP request."""

    def __init__(self, url: str, hosts: dict, pods: dict[str, list[Pod]], interval_s: float = 1.0):
        self.url, self.hosts, self.pods, self.interval_s = url, hosts, pods, interval_s
        self.started_ns = time.time_ns()
        self.sent_metrics: set[str] = set()
        self.failures: list[str] = []
        self._previous: dict[str, tuple[CpuTimes, list[float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receiver-metrics", daemon=True)

    def start(self) -> "ReceiverMetrics":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            now_mono, now = time.monotonic(), time.time_ns()
            elapsed, last = max(now_mono - last, 1e-3), now_mono
            request = ExportMetricsServiceRequest()
            for node, host in self.hosts.items():
                request.resource_metrics.extend(self._node(node, host, elapsed, now))
            self.sent_metrics |= {m.name for block in request.resource_metrics for scope in block.scope_metrics
                                  for m in scope.metrics}
            failure = post(self.url, request.SerializeToString())
            if failure:
                self.failures.append(failure)
            if self._stop.wait(self.interval_s):
                return

    def _node(self, node: str, host, elapsed: float, now: int) -> list[ResourceMetrics]:
        times = host.cpu_times(elapsed)
        pods = self.pods.get(node, [])
        seconds = [pod.cpu_seconds(elapsed) for pod in pods]
        before = self._previous.get(node)
        self._previous[node] = (times, seconds)
        if before is None:  # a first scrape: cumulative times only (a rate takes two samples)
            utilization, node_usage, usages = None, None, [None] * len(pods)
        else:
            old_times, old_seconds = before
            utilization = {cpu: {state: _rate(value, old_times[cpu][state], elapsed) for state, value in
                                 states.items()} for cpu, states in times.items()}
            node_usage = _rate(_busy(times), _busy(old_times), elapsed)
            usages = [_rate(new, old, elapsed) for new, old in zip(seconds, old_seconds)]
        return (hostmetrics(node, times, utilization, host.load(), host.boot_ns, now)
                + kubeletstats(node, _busy(times), node_usage, host.boot_ns, list(zip(pods, seconds, usages)), now))


def _busy(times: CpuTimes) -> float:
    """CPU seconds spent working, over every CPU: what the kubelet reads as the node's usage."""
    return sum(value for states in times.values() for state, value in states.items() if state not in NOT_BUSY)


def _rate(new: float, old: float, elapsed_s: float) -> float:
    return max(new - old, 0.0) / elapsed_s
