"""Faults and confounders: how each cause of the taxonomy bends its own evidence signals on one node, and the
two kinds of misleading movement every faulty run also carries.

* the true cause: its evidence signals (taxonomy `Evidence`) move in the harmful direction over a 10-20 s
  ramp from onset T; request latency on the node follows 5-15 s later (see `traffic.py`);
* an *effect* confounder: 20-60 s after the SLI breaks, another signal on the fault node moves strongly
  (client retries, retransmits, ...): a consequence, not a cause;
* a *fleet-wide* confounder: within 2 min of T one other signal shifts on every node at once (a runtime
  rollout, ambient temperature, ...).

Confounder magnitudes are calibrated against the true cause's reference score (`robust_score`: median shift
in baseline IQRs, harmful direction) by a log-uniform ratio, whatever that score is: a strong fault is no
guarantee against an even stronger rollout or retry storm, so a "largest anomaly wins" baseline is fooled in
a good share of seeds for every cause, while the true cause still moves clearly and only locally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sloscope import catalog, taxonomy
from sloscope.simulator.signals import Counter, Gauge, Histogram, NodeSeries

BASELINE_S = 600  # reference-score baseline: up to 10 min before the anomaly
GUARD_S = 30  # ... ending this long before it
CONFOUNDER_RATIO = (0.4, 3.0)  # log-uniform: confounder score / cause score
MIN_CONFOUNDER_SCORE = 6.0  # ... but always a strong move


def profile(n: int, start: float, ramp: float, end: float | None = None, ramp_down: float = 10.0) -> np.ndarray:
    """0 before `start`, linear to 1 over `ramp` s, 1 until `end`, linear back to 0 over `ramp_down` s."""
    k = np.arange(n, dtype=np.float64)
    p = np.clip((k - start) / max(ramp, 1e-9), 0.0, 1.0)
    if end is not None:
        p *= np.clip(1.0 - (k - end) / max(ramp_down, 1e-9), 0.0, 1.0)
    return p


def _harmful_sign(name: str) -> float:
    return -1.0 if catalog.signal(name).harmful is catalog.Direction.DOWN else 1.0


def growth_per_min(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    g = np.zeros_like(v)
    g[1:] = np.diff(v) / np.maximum(v[:-1], 1.0) * 60.0
    return g


def robust_score(series, base: tuple[int, int], active: tuple[int, int], feature: str = "level") -> float:
    """Median over `active` of the harmful-direction deviation from the `base` median, in base IQRs (floored
    at the catalog noise floor; 1 %/min for the growth feature)."""
    obs = series.observations()
    floor = series.signal.noise_floor
    if feature == "growth":
        obs, floor = growth_per_min(obs), 0.01
    b = obs[max(base[0], 0):max(base[1], 0)]
    a = obs[max(active[0], 0):max(active[1], 0)]
    b, a = b[np.isfinite(b)], a[np.isfinite(a)]
    if len(b) < 10 or len(a) == 0:
        return 0.0
    q1, med, q3 = np.percentile(b, [25, 50, 75])
    iqr = max(float(q3 - q1), floor, 1e-12)
    return float(_harmful_sign(series.name) * (np.median(a) - med) / iqr)


def baseline_window(onset: int) -> tuple[int, int]:
    end = onset - GUARD_S
    if end < 60:
        end = onset
    return max(0, end - BASELINE_S), end


# ------------------------------------------------------------------------------------------------ bending


def scale(series, p: np.ndarray, factor: float) -> None:
    """Multiply the series' native level by `factor` at full profile."""
    m = 1.0 + p * (factor - 1.0)
    if isinstance(series, Histogram):
        series.median = series.median * m
        series.invalidate()
    elif isinstance(series, Counter):
        series.rate = series.rate * m
        series.invalidate()
    else:
        series.values = series.values * m


def toward(series, p: np.ndarray, target: float, noise_keep: float = 0.3) -> None:
    """Move a level series toward `target` at full profile, keeping some of its noise."""
    if isinstance(series, Counter):
        base = np.median(series.rate)
        series.rate = series.rate + p * (target - base) + p * (series.rate - base) * (noise_keep - 1.0)
        series.invalidate()
    elif isinstance(series, Histogram):
        base = float(np.median(series.median))
        scale(series, p, target / base)
    else:
        base = float(np.median(series.values))
        series.values = series.values + p * (target - base) + p * (series.values - base) * (noise_keep - 1.0)


def native_median(series) -> float:
    if isinstance(series, Histogram):
        return float(np.median(series.median))
    if isinstance(series, Counter):
        return float(np.median(series.rate))
    return float(np.median(series.values))


def scale_to(series, p: np.ndarray, target: float) -> None:
    """Multiply so that the native median reaches `target` at full profile (noise scales along)."""
    scale(series, p, target / max(native_median(series), 1e-12))


def shift(series: Gauge, p: np.ndarray, delta: float) -> None:
    series.values = series.values + p * delta


# ------------------------------------------------------------------------------------------------ causes

# The taxonomy's causes that live in a node's hardware or kernel, each bent by `apply_cause`. The taxonomy also
# has causes no node signal shows alone (a slow network path to one pod, the application's own code): only the
# mesh simulates those, from its spans (simulator/mesh.py).
PHYSICAL_CAUSES = ("gpu_sm_contention", "gpu_memory_bandwidth", "gpu_memory_leak", "gpu_interconnect", "gpu_thermal",
                   "storage_queue", "storage_thermal", "disk_io", "network_loss", "connection_churn",
                   "cpu_contention", "memory_pressure", "syscall_overhead")
assert set(PHYSICAL_CAUSES) <= set(taxonomy.CAUSE_IDS)


@dataclass
class FaultSpec:
    cause: str
    node: int
    onset: int  # seconds from run start
    duration: int
    ramp: float


def apply_cause(node: NodeSeries, spec: FaultSpec, n: int, rng: np.random.Generator) -> dict:
    """Bend the node's series for `spec.cause`; return the component it hit (hw.id / bdev), if any."""
    c = spec.cause
    p = profile(n, spec.onset, spec.ramp, spec.onset + spec.duration)
    u = rng.uniform
    target: dict = {}
    if c.startswith("gpu_"):
        hw = node.gpus[int(rng.integers(0, len(node.gpus)))]
        target["hw.id"] = hw
        if c == "gpu_sm_contention":
            for s in node.find("sloscope.gpu.kernel.busy.max", hw__id=hw):
                toward(s, p, u(0.97, 1.02), noise_keep=0.25)
            for s in node.find("sloscope.gpu.sm.active", hw__id=hw):
                toward(s, p, u(0.85, 0.95), noise_keep=0.3)
            for s in node.find("hw.gpu.utilization", hw__id=hw):
                toward(s, p, u(0.94, 1.0), noise_keep=0.3)
            for s in node.find("sloscope.gpu.dram.active", hw__id=hw):
                shift(s, p, 0.04)
        elif c == "gpu_memory_bandwidth":
            for s in node.find("sloscope.gpu.dram.active", hw__id=hw):
                toward(s, p, u(0.88, 0.97), noise_keep=0.4)
        elif c == "gpu_memory_leak":
            (s,) = node.find("hw.gpu.memory.usage", hw__id=hw)
            (lim,) = node.find("hw.gpu.memory.limit", hw__id=hw)
            limit = float(lim.values[0])
            base = s.values.copy()
            u0 = float(base[min(spec.onset, n - 1)])
            growth = u(0.07, 0.12)  # relative growth per minute at full ramp
            g = growth / 60.0 * p  # per-second log growth, ramped, back to 0 after the end
            inside = (np.arange(n) >= spec.onset) & (np.arange(n) < spec.onset + spec.duration)
            grown = u0 * np.exp(np.cumsum(np.where(inside, g, 0.0)))
            grown = np.minimum(grown, 0.97 * limit)
            chunk = 2.0**21  # allocations land in 2 MiB pages
            s.values = np.where(inside, np.maximum(base, np.floor(grown / chunk) * chunk), base)
        elif c == "gpu_interconnect":
            for s in node.find("hw.gpu.io", hw__id=hw, sloscope__gpu__link="nvlink"):
                scale(s, p, u(0.15, 0.3))
            for s in node.find("hw.gpu.io", hw__id=hw, sloscope__gpu__link="pcie"):
                scale(s, p, u(0.3, 0.55))
        elif c == "gpu_thermal":
            for s in node.find("hw.gpu.temperature", hw__id=hw):
                toward(s, p, u(88, 93), noise_keep=0.6)
            for s in node.find("hw.gpu.utilization", hw__id=hw):
                shift(s, p, 0.05)  # throttled clocks: the same work keeps the GPU busy longer
    elif c in ("storage_queue", "storage_thermal"):
        bdev = str(rng.choice(["Nvme0n1", "Nvme1n1"]))
        target["spdk.bdev.name"] = bdev
        if c == "storage_queue":
            for s in node.find("spdk.bdev.io.wait", spdk__bdev__name=bdev):
                lo = 6e-3 if s.attributes["disk.io.direction"] == "read" else 8e-3
                scale_to(s, p, u(lo, 2.2 * lo))
            for s in node.find("spdk.bdev.queue_depth", spdk__bdev__name=bdev):
                scale_to(s, p, u(48, 120))
            for s in node.find("spdk.bdev.utilization", spdk__bdev__name=bdev):
                toward(s, p, u(0.96, 1.02), noise_keep=0.3)
            for s in node.find("spdk.reactor.busy", spdk__reactor__lcore=0):
                toward(s, p, u(0.82, 0.95), noise_keep=0.5)
        else:
            for s in node.find("sloscope.nvme.temperature", spdk__bdev__name=bdev):
                toward(s, p, u(68, 75), noise_keep=0.8)
            for s in node.find("spdk.bdev.io.wait", spdk__bdev__name=bdev):
                scale(s, p, 1.3)  # throttled media: a little slower, far from congestion
    elif c == "disk_io":
        for s in node.find("sloscope.block.io.duration"):
            scale(s, p, u(10, 30))
        for s in node.find("system.disk.io_time"):
            toward(s, p, u(0.9, 0.98))
        for s in node.find("sloscope.pressure.stall", pressure__resource="io", pressure__kind="some"):
            toward(s, p, u(0.3, 0.6))
        for s in node.find("sloscope.pressure.stall", pressure__resource="io", pressure__kind="full"):
            toward(s, p, u(0.1, 0.3))
    elif c == "network_loss":
        for s in node.find("sloscope.tcp.retransmits"):
            scale_to(s, p, u(40, 150))
    elif c == "connection_churn":
        for s in node.find("system.network.connection.count", network__connection__state="time_wait"):
            scale_to(s, p, u(6000, 20000))
        for s in node.find("sloscope.tcp.state_transitions", network__connection__state="time_wait"):
            scale(s, p, u(15, 40))
        for s in node.find("sloscope.tcp.state_transitions", network__connection__state="established"):
            scale(s, p, u(12, 30))
    elif c == "cpu_contention":
        for s in node.find("sloscope.cpu.runqueue.delay"):
            scale(s, p, u(15, 40))
        for s in node.find("sloscope.pressure.stall", pressure__resource="cpu"):
            toward(s, p, u(0.3, 0.7))
        for s in node.find("sloscope.syscall.duration"):
            scale(s, p, 1.3)  # side effect: descheduled syscalls take a little longer
    elif c == "memory_pressure":
        for s in node.find("sloscope.pressure.stall", pressure__resource="memory", pressure__kind="some"):
            toward(s, p, u(0.25, 0.5))
        for s in node.find("sloscope.pressure.stall", pressure__resource="memory", pressure__kind="full"):
            toward(s, p, u(0.08, 0.25))
        for s in node.find("sloscope.pressure.stall", pressure__resource="io", pressure__kind="some"):
            scale(s, p, 2.5)  # side effect: reclaim writes back and refaults pages
        for s in node.find("system.paging.faults", system__paging__type="major"):
            scale_to(s, p, u(300, 3000))  # the refaults: pages read back from disk
    elif c == "syscall_overhead":
        for s in node.find("sloscope.syscall.duration"):
            scale(s, p, u(6, 15))
    else:
        raise ValueError(f"unknown cause {c!r}")
    return target


def cause_series(node: NodeSeries, cause: str, target: dict) -> list[tuple]:
    """(series, feature) pairs that are the cause's evidence on the node, narrowed to the hit component."""
    out = []
    for ev in taxonomy.BY_ID[cause].evidence:
        for s in node.series:
            if s.name != ev.signal or not ev.matches(s.attributes):
                continue
            attrs = s.attributes
            if any(k in attrs and str(attrs[k]) != str(v) for k, v in target.items()):
                continue
            if cause in ("storage_queue",) and s.name == "spdk.reactor.busy" and attrs.get("spdk.reactor.lcore") != 0:
                continue
            out.append((s, ev.feature))
    return out


# ------------------------------------------------------------------------------------------------ confounders


@dataclass(frozen=True)
class Confounder:
    kind: str
    description: str
    signals: tuple  # ((signal, {attr: value}), ...)
    mode: str  # "scale" (multiplicative, calibrated) or "shift" (additive gauge, calibrated)
    cap: float = math.inf  # a level the shifted series must stay below (no seed threshold crossed)


def _c(kind, description, signals, mode="scale", cap=math.inf):
    return Confounder(kind, description, tuple((s, tuple(sorted(w.items()))) for s, w in signals), mode, cap)


EFFECTS = (
    _c("retry_churn", "clients retry the slow node: short-lived connections pile up in TIME_WAIT",
       [("system.network.connection.count", {"network.connection.state": "time_wait"}),
        ("sloscope.tcp.state_transitions", {"network.connection.state": "time_wait"})]),
    _c("retransmit_storm", "the node falls behind and its socket queues overflow: segments are retransmitted",
       [("sloscope.tcp.retransmits", {})]),
    _c("socket_lock_contention", "retried requests contend on socket locks: send/recv syscalls slow down",
       [("sloscope.syscall.duration", {"syscall.name": "sendmsg"}),
        ("sloscope.syscall.duration", {"syscall.name": "recvmsg"})]),
    _c("retry_cpu_storm", "request retries burn CPU: run-queue delay rises",
       [("sloscope.cpu.runqueue.delay", {})]),
    _c("request_queue_memory", "queued requests hold memory: memory stalls rise",
       [("sloscope.pressure.stall", {"pressure.resource": "memory", "pressure.kind": "some"})], cap=0.6),
)

FLEET_WIDE = (
    _c("runtime_rollout", "a container-runtime rollout adds syscall interception on every node",
       [("sloscope.syscall.duration", {})]),
    _c("ambient_temperature", "data-centre ambient temperature rises: every GPU runs warmer",
       [("hw.gpu.temperature", {})], mode="shift", cap=80.0),
    _c("kernel_update", "a kernel update changes the scheduler: run-queue delay rises on every node",
       [("sloscope.cpu.runqueue.delay", {})]),
    _c("spdk_firmware", "an NVMe firmware roll-out raises bdev wait on every node (well below congestion)",
       [("spdk.bdev.io.wait", {})], cap=3.5e-3),
    _c("fabric_change", "a network fabric change raises TCP retransmits on every node",
       [("sloscope.tcp.retransmits", {})]),
    _c("model_rollout", "a new model version is more memory-bound: HBM bandwidth rises on every GPU",
       [("sloscope.gpu.dram.active", {})], mode="shift", cap=0.8),
    _c("nvme_ambient", "rack inlet temperature rises: every NVMe drive runs warmer",
       [("sloscope.nvme.temperature", {})], mode="shift", cap=60.0),
    _c("client_library_rollout", "a client library without keep-alive rolls out: TIME_WAIT rises everywhere",
       [("system.network.connection.count", {"network.connection.state": "time_wait"}),
        ("sloscope.tcp.state_transitions", {"network.connection.state": "time_wait"})]),
)


def confounder_series(node: NodeSeries, conf: Confounder) -> list:
    out = []
    for name, where in conf.signals:
        out.extend(node.find(name, **{k.replace(".", "__"): v for k, v in where}))
    return out


def overlaps(conf: Confounder, cause: str | None, node: NodeSeries) -> bool:
    """Whether the confounder would move one of the cause's evidence series (or nothing at all)."""
    series = confounder_series(node, conf)
    if not series:
        return True
    if cause is None:
        return False
    evs = taxonomy.BY_ID[cause].evidence
    return any(s.name == ev.signal and ev.matches(s.attributes) for s in series for ev in evs)


def calibrate(ref: NodeSeries, conf: Confounder, target_score: float, base: tuple[int, int]) -> list[float]:
    """Per-series factor (scale) or offset (shift) that moves each series by `target_score` base IQRs."""
    out = []
    for s in confounder_series(ref, conf):
        obs = s.observations()[base[0]:base[1]]
        obs = obs[np.isfinite(obs)]
        q1, med, q3 = np.percentile(obs, [25, 50, 75])
        iqr = max(float(q3 - q1), s.signal.noise_floor)
        delta = target_score * iqr
        if conf.mode == "shift":
            room = conf.cap - float(np.max(s.observations()))
            out.append(float(min(delta, max(room, 0.0))))
        else:
            level = float(np.mean(s.rate)) if isinstance(s, Counter) else max(float(med), 1e-12)
            f = 1.0 + delta / level
            if math.isfinite(conf.cap):
                f = min(f, conf.cap / max(float(np.max(s.observations())), 1e-12))
            out.append(float(min(max(f, 1.0), 200.0)))
    return out


def apply_confounder(node: NodeSeries, conf: Confounder, amounts: list[float], p: np.ndarray) -> None:
    for s, amount in zip(confounder_series(node, conf), amounts):
        if conf.mode == "shift":
            shift(s, p, amount)
        else:
            scale(s, p, amount)


def describe_series(series) -> list[dict]:
    return [{"signal": s.name, "attributes": {k: v for k, v in s.attrs}} for s in series]
