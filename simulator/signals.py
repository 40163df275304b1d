"""Per-node metric series of the simulated fleet: baselines with noise and slow drift, and their realisation
into the values an exporter would report.

A series keeps its *native* per-second description (a gauge's level, a counter's expected increment per
second, a histogram's observation rate and median) so faults and confounders can bend it before it is
realised. `realize()` turns it into what a collector would see; `observations()` gives the per-second value
an analyst would derive from the exported data (gauge value, counter delta, histogram mean) and is what the
reference anomaly score in ground truth is computed on.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np

from sloscope import catalog

GPUS_PER_NODE = 2
BDEVS = ("Nvme0n1", "Nvme1n1")
BLOCK_DEVICE = "nvme0n1"
REACTOR_LCORES = (0, 1)
COLLECTOR_PROBES = ("syscall", "tcp", "block", "runqueue", "pressure", "diskstats", "tcp_connections", "vmstat")
SYSCALLS = ("read", "write", "sendmsg", "recvmsg", "fsync")
TCP_STATES = ("established", "time_wait", "close_wait")
PSI = (("cpu", "some"), ("io", "some"), ("io", "full"), ("memory", "some"), ("memory", "full"))
GPU_LINKS = ("nvlink", "pcie")
DIRECTIONS = ("transmit", "receive")
GPU_MEMORY_LIMIT = 80 * 2**30
RTT = "sloscope.tcp.rtt"


# ------------------------------------------------------------------------------------------------ helpers


def smooth_noise(rng: np.random.Generator, n: int, sd: float, corr_s: float) -> np.ndarray:
    """Gaussian noise with standard deviation `sd` and an exponential autocorrelation of about `corr_s` s."""
    white = rng.standard_normal(n + 1)
    if corr_s <= 1:
        return white[:n] * sd
    k = np.exp(-np.arange(int(4 * corr_s) + 1) / corr_s)
    k /= math.sqrt(float((k * k).sum()))
    return np.convolve(white, k, mode="full")[:n] * sd


def drift(rng: np.random.Generator, n: int, amp: float) -> np.ndarray:
    """Slow drift: two sinusoids of 15-90 min period with random phase, total amplitude about `amp`."""
    t = np.arange(n, dtype=np.float64)
    out = np.zeros(n)
    for _ in range(2):
        period = rng.uniform(900.0, 5400.0)
        out += (amp / 2) * np.sin(2 * math.pi * t / period + rng.uniform(0, 2 * math.pi))
    return out


def ncdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF (Abramowitz-Stegun 7.1.26 erf, |error| < 1.5e-7), vectorised without scipy."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


# ------------------------------------------------------------------------------------------------ series


@dataclass
class Series:
    name: str
    attrs: tuple  # ((key, value), ...) in emission order; value is str or int
    seed: tuple  # entropy for this series' realisation draws

    @property
    def signal(self) -> catalog.Signal:
        return catalog.signal(self.name)

    @property
    def attributes(self) -> dict:
        return dict(self.attrs)

    def rng(self, salt: int) -> np.random.Generator:
        return np.random.default_rng([*self.seed, salt])


@dataclass
class Gauge(Series):
    values: np.ndarray = None
    lo: float = 0.0
    hi: float = math.inf
    decimals: int = 4
    kind: str = "gauge"

    def realize(self) -> np.ndarray:
        return np.round(np.clip(self.values, self.lo, self.hi), self.decimals)

    def observations(self) -> np.ndarray:
        return self.realize()


@dataclass
class Counter(Series):
    rate: np.ndarray = None  # expected increment per second
    integer: bool = False
    cv: float = 0.05  # relative noise of a double counter's increment
    cap: float = math.inf  # largest possible increment per second (1.0 for a busy/stall ratio)
    kind: str = "counter"
    _inc: np.ndarray = field(default=None, repr=False)

    def increments(self) -> np.ndarray:
        if self._inc is None or len(self._inc) != len(self.rate):
            rate = np.clip(self.rate, 0.0, self.cap)
            if self.integer:
                self._inc = self.rng(1).poisson(rate).astype(np.float64)
            else:
                eps = self.rng(1).standard_normal(len(rate))
                self._inc = np.clip(rate * (1.0 + self.cv * eps), 0.0, self.cap)
        return self._inc

    def invalidate(self) -> None:
        self._inc = None

    def observations(self) -> np.ndarray:
        return self.increments()


@dataclass
class Histogram(Series):
    """Exponential histogram at scale 0 of a lognormal quantity: `count_rate` observations per second with
    median `median` (per second) and log-space spread `sigma`."""

    count_rate: np.ndarray = None
    median: np.ndarray = None
    sigma: float = 0.5
    kind: str = "histogram"
    _real: dict = field(default=None, repr=False)

    def invalidate(self) -> None:
        self._real = None

    def realize(self) -> dict:
        """Per-second (not cumulative) bucket counts over a fixed index window, observation count and sum."""
        if self._real is not None:
            return self._real
        n = len(self.median)
        med = np.maximum(self.median, 1e-12)
        log2m = np.log2(med)
        spread = 4.5 * self.sigma / math.log(2)
        lo = int(math.floor(float(log2m.min()) - spread)) - 1
        hi = int(math.ceil(float(log2m.max()) + spread))
        edges = np.arange(lo, hi + 2, dtype=np.float64)  # bucket i covers (2^i, 2^(i+1)]
        z = (edges[None, :] * math.log(2) - np.log(med)[:, None]) / self.sigma
        cdf = ncdf(z)
        cdf[:, 0] = 0.0
        cdf[:, -1] = 1.0
        probs = np.diff(cdf, axis=1)  # (n, hi-lo+1)
        rng = self.rng(2)
        counts = rng.poisson(np.maximum(self.count_rate, 0.0)[:, None] * probs)
        total = counts.sum(axis=1)
        cv = math.sqrt(math.exp(self.sigma**2) - 1.0)
        mean = med * math.exp(self.sigma**2 / 2) * (1.0 + cv / np.sqrt(np.maximum(total, 1)) *
                                                    rng.standard_normal(n))
        lower = np.exp2(np.arange(lo, hi + 1, dtype=np.float64))
        lo_sum = (counts * lower).sum(axis=1) * 1.001
        hi_sum = (counts * lower * 2).sum(axis=1) * 0.999
        total_sum = np.clip(mean * total, lo_sum, hi_sum)
        self._real = {"offset": lo, "counts": counts, "count": total, "sum": total_sum}
        return self._real

    def observations(self) -> np.ndarray:
        r = self.realize()
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(r["count"] > 0, r["sum"] / np.maximum(r["count"], 1), np.nan)


# ------------------------------------------------------------------------------------------------ a node


@dataclass
class NodeSeries:
    name: str
    index: int
    gpus: tuple[str, ...]
    series: list
    uptime_s: float  # collector process age at run start: cumulative series start there
    phase_ns: int  # the node's sampling phase within the second

    def find(self, name: str, **where) -> list:
        want = {k.replace("__", "."): v for k, v in where.items()}
        return [s for s in self.series if s.name == name and all(str(s.attributes.get(k)) == str(v)
                                                                 for k, v in want.items())]


def gpu_uuid(rng: np.random.Generator) -> str:
    return "GPU-" + str(uuid.UUID(bytes=rng.bytes(16), version=4))


def build_node(seed: int, index: int, name: str, n: int) -> NodeSeries:
    """Every catalog signal on one node, healthy, over `n` one-second samples."""
    rng = np.random.default_rng([seed, 1, index])
    series: list = []
    counter = [0]

    def sid() -> tuple:
        counter[0] += 1
        return (seed, 11, index, counter[0])

    def gauge(sig, attrs, level, drift_amp, noise_sd, corr_s=4.0, lo=0.0, hi=math.inf, decimals=4, gen=None):
        g = gen or rng
        v = level + drift(g, n, drift_amp) + smooth_noise(g, n, noise_sd * 0.6, corr_s) + \
            g.standard_normal(n) * noise_sd * 0.8
        series.append(Gauge(sig, tuple(attrs), sid(), values=v, lo=lo, hi=hi, decimals=decimals))

    def counter_(sig, attrs, rate, drift_rel, noise_rel, integer=False, cv=0.05, cap=math.inf):
        r = rate * (1.0 + drift(rng, n, drift_rel) + smooth_noise(rng, n, noise_rel, 8.0))
        series.append(Counter(sig, tuple(attrs), sid(), rate=np.maximum(r, 0.0), integer=integer, cv=cv,
                              cap=cap))

    def histogram(sig, attrs, rate, median, sigma, drift_rel=0.06, noise_rel=0.03):
        cr = rate * (1.0 + drift(rng, n, 0.1) + smooth_noise(rng, n, 0.05, 10.0))
        med = median * np.exp(drift(rng, n, drift_rel) + smooth_noise(rng, n, noise_rel, 6.0))
        series.append(Histogram(sig, tuple(attrs), sid(), count_rate=np.maximum(cr, 0.0), median=med,
                                sigma=sigma))

    # kernel: syscalls, TCP, block I/O, scheduler, PSI
    syscall_median = {"read": 3e-6, "write": 5e-6, "sendmsg": 9e-6, "recvmsg": 7e-6, "fsync": 4e-4}
    syscall_rate = {"read": 2500.0, "write": 1200.0, "sendmsg": 1500.0, "recvmsg": 1500.0, "fsync": 25.0}
    for sc in SYSCALLS:
        histogram("sloscope.syscall.duration", [("syscall.name", sc)], syscall_rate[sc] * rng.uniform(0.8, 1.2),
                  syscall_median[sc] * rng.uniform(0.85, 1.15), 0.7)
    counter_("sloscope.tcp.retransmits", [], rng.uniform(0.3, 1.5), 0.2, 0.2, integer=True)
    conn = {"established": rng.uniform(150, 400), "time_wait": rng.uniform(60, 200), "close_wait": rng.uniform(1, 6)}
    trans = {"established": rng.uniform(15, 30), "time_wait": rng.uniform(14, 28), "close_wait": rng.uniform(1, 3)}
    for st in TCP_STATES:
        counter_("sloscope.tcp.state_transitions", [("network.connection.state", st)], trans[st], 0.15, 0.1,
                 integer=True)
    for st in TCP_STATES:
        lvl = conn[st]
        gauge("system.network.connection.count", [("network.connection.state", st), ("network.transport", "tcp")],
              lvl, 0.12 * lvl, max(0.5, 0.05 * lvl), corr_s=10.0, decimals=0)
    histogram("sloscope.block.io.duration", [("system.device", BLOCK_DEVICE)], rng.uniform(200, 600),
              rng.uniform(1.5e-4, 3.5e-4), 0.6)
    counter_("system.disk.io_time", [("system.device", BLOCK_DEVICE)], rng.uniform(0.06, 0.15), 0.2, 0.1,
             cv=0.15, cap=1.0)
    histogram("sloscope.cpu.runqueue.delay", [], rng.uniform(2000, 5000), rng.uniform(6e-6, 1.5e-5), 0.8)
    psi_level = {("cpu", "some"): rng.uniform(0.01, 0.03), ("io", "some"): rng.uniform(0.003, 0.01),
                 ("io", "full"): rng.uniform(0.001, 0.004), ("memory", "some"): rng.uniform(0.0005, 0.002),
                 ("memory", "full"): rng.uniform(0.0001, 0.0008)}
    for res, kind in PSI:
        counter_("sloscope.pressure.stall", [("pressure.resource", res), ("pressure.kind", kind)],
                 psi_level[(res, kind)], 0.2, 0.15, cv=0.2, cap=1.0)

    # GPUs
    gpus = tuple(gpu_uuid(rng) for _ in range(GPUS_PER_NODE))
    utils: dict[str, float] = {}
    for hw in gpus:
        util = rng.uniform(0.45, 0.62)
        gauge("hw.gpu.utilization", [("hw.id", hw), ("hw.gpu.task", "general")], util, 0.05, 0.025, lo=0.0, hi=1.0)
        utils[hw] = util
        gauge("sloscope.gpu.kernel.busy.max", [("hw.id", hw)], util + rng.uniform(0.06, 0.1), 0.04, 0.02,
              lo=0.0, hi=1.0)
        gauge("sloscope.gpu.dram.active", [("hw.id", hw)], rng.uniform(0.3, 0.45), 0.04, 0.02, lo=0.0, hi=1.0)
        usage = np.full(n, float(int(rng.uniform(0.38, 0.55) * GPU_MEMORY_LIMIT) // 2**20 * 2**20))
        # a caching allocator: flat, with a rare step as a batch shape changes
        for _ in range(rng.poisson(n / 900.0)):
            at = int(rng.integers(0, n))
            usage[at:] += float(rng.choice([-1, 1]) * rng.integers(1, 4) * 2**28)
        series.append(Gauge("hw.gpu.memory.usage", (("hw.id", hw),), sid(), values=usage, decimals=0))
        series.append(Gauge("hw.gpu.memory.limit", (("hw.id", hw),), sid(),
                            values=np.full(n, float(GPU_MEMORY_LIMIT)), decimals=0))
        for link in GPU_LINKS:
            for d in DIRECTIONS:
                rate = rng.uniform(18e9, 30e9) if link == "nvlink" else rng.uniform(2e9, 4e9)
                counter_("hw.gpu.io", [("hw.id", hw), ("network.io.direction", d), ("sloscope.gpu.link", link)],
                         rate, 0.1, 0.05, cv=0.06)
        gauge("hw.gpu.temperature", [("hw.id", hw)], rng.uniform(56, 63), 2.0, 0.6, corr_s=15.0, decimals=0)

    # SPDK
    for bdev in BDEVS:
        for d, base in (("read", rng.uniform(3e-4, 5e-4)), ("write", rng.uniform(5e-4, 8e-4))):
            lvl = np.log(base) + drift(rng, n, 0.1) + smooth_noise(rng, n, 0.06, 5.0) + rng.standard_normal(n) * 0.07
            series.append(Gauge("spdk.bdev.io.wait", (("spdk.bdev.name", bdev), ("disk.io.direction", d)), sid(),
                                values=np.exp(lvl), decimals=7))
        gauge("spdk.bdev.queue_depth", [("spdk.bdev.name", bdev)], rng.uniform(3, 8), 1.0, 0.6, lo=0.0, decimals=2)
        gauge("spdk.bdev.utilization", [("spdk.bdev.name", bdev)], rng.uniform(0.2, 0.4), 0.05, 0.03, lo=0.0, hi=1.0)
    for lcore in REACTOR_LCORES:
        gauge("spdk.reactor.busy", [("spdk.reactor.lcore", lcore)], rng.uniform(0.25, 0.4), 0.05, 0.03,
              lo=0.0, hi=1.0)
    for bdev in BDEVS:
        gauge("sloscope.nvme.temperature", [("spdk.bdev.name", bdev)], rng.uniform(41, 48), 1.5, 0.5,
              corr_s=20.0, decimals=0)
    for probe in COLLECTOR_PROBES:  # every probe of the node collector healthy
        series.append(Gauge("sloscope.probe.health", (("probe.name", probe), ("probe.running", probe)), sid(),
                            values=np.ones(n), decimals=0))
    # paging, from a generator of its own so that every series above is as it was before it was added
    paging_rng = np.random.default_rng([seed, 2, index])
    for kind, rate in (("major", paging_rng.uniform(0.2, 2.0)), ("minor", paging_rng.uniform(2000.0, 6000.0))):
        r = rate * (1.0 + drift(paging_rng, n, 0.2) + smooth_noise(paging_rng, n, 0.15, 8.0))
        series.append(Counter("system.paging.faults", (("system.paging.type", kind),), sid(),
                              rate=np.maximum(r, 0.0), integer=True, cv=0.2))

    # DCGM's SM share, reserved framebuffer and per-signal probe health, from a generator of their own too
    gpu_rng = np.random.default_rng([seed, 3, index])
    for hw, util in utils.items():
        # below the kernel-busy peak: kernels that leave SMs idle still count as busy time
        gauge("sloscope.gpu.sm.active", [("hw.id", hw)], util * gpu_rng.uniform(0.55, 0.75), 0.04, 0.02,
              lo=0.0, hi=1.0, gen=gpu_rng)
        series.append(Gauge("sloscope.gpu.memory.reserved", (("hw.id", hw),), sid(),
                            values=np.full(n, float(gpu_rng.integers(400, 700)) * 2**20), decimals=0))
    for signal in ("sloscope.gpu.sm.active", "sloscope.gpu.dram.active"):
        series.append(Gauge("sloscope.probe.signal.health", (("probe.name", "dcgm"), ("sloscope.signal.name", signal)),
                            sid(), values=np.ones(n), decimals=0))
    # TCP round-trip time, from a generator of its own as well, where the catalog names it
    if RTT in catalog.BY_NAME:
        rtt_rng = np.random.default_rng([seed, 4, index])
        cr = rtt_rng.uniform(1500.0, 4000.0) * (1.0 + drift(rtt_rng, n, 0.1) + smooth_noise(rtt_rng, n, 0.05, 10.0))
        med = rtt_rng.uniform(1.2e-4, 2.5e-4) * np.exp(drift(rtt_rng, n, 0.08) +
                                                        smooth_noise(rtt_rng, n, 0.04, 6.0))
        series.append(Histogram(RTT, (), sid(), count_rate=np.maximum(cr, 0.0), median=med, sigma=0.5))
    return NodeSeries(name=name, index=index, gpus=gpus, series=series,
                      uptime_s=float(rng.uniform(3600.0, 2 * 86400.0)), phase_ns=int(rng.integers(0, 1000)) * 10**6)
