"""The cause taxonomy (docs/taxonomy.md): SLO layer -> intermediate signals -> physical cause.

Cause ids are fixed by contract. Each cause names the catalog signals (optionally narrowed to one attribute
value, e.g. PSI for the cpu resource only) whose harmful movement is evidence for it, and the remediation
that the alerting side maps it to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sloscope import catalog


@dataclass(frozen=True)
class Evidence:
    """One catalog signal, optionally restricted to data points whose attributes match `where`."""

    signal: str
    where: tuple[tuple[str, str], ...] = ()
    feature: str = "level"  # "level": the value itself; "growth": relative growth per minute

    def matches(self, attributes: dict) -> bool:
        return all(str(attributes.get(k)) == v for k, v in self.where)


@dataclass(frozen=True)
class Cause:
    id: str
    layer: str
    evidence: tuple[Evidence, ...]
    physical: str
    remediation: str  # formatted with node=
    seed_threshold: dict = field(default_factory=dict)  # signal -> absolute level that is harmful by itself
    # Causes whose movement explains this one's signals (they sit downstream of them): the score keeps only
    # what the best of those leaves unexplained.
    explained_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class GrowthRule:
    """A gauge growing by more than `per_step` (relative) over each of `in_a_row` consecutive steps of
    `step_s` seconds, each step measured from the reading one step earlier. The Prometheus alert
    (alerts/rules.py) is written from this, so there is one rule, in one unit and at one cadence."""

    signal: str
    per_step: float  # relative growth per step, e.g. 0.05 = 5 %
    step_s: int
    in_a_row: int

    @property
    def text(self) -> str:
        return (f"{self.in_a_row} steps of {self.step_s} s in a row each growing more than "
                f"{self.per_step:.0%} over the step before")


# GPU memory leak (cause gpu_memory_leak): more than 5 % a minute, three minutes in a row. A caching
# allocator's sawtooth (grow, give back) never grows three whole minutes running.
GPU_MEMORY_LEAK = GrowthRule("hw.gpu.memory.usage", per_step=0.05, step_s=60, in_a_row=3)


def _ev(signal, feature="level", **where):
    catalog.signal(signal)  # fail at import on a name the catalog does not know
    return Evidence(signal, tuple((k.replace("__", "."), v) for k, v in sorted(where.items())), feature)


CAUSES: tuple[Cause, ...] = (
    # Kernel-busy time (NVML) says a kernel ran all the time; SM activity (DCGM) says how many SMs had work.
    # Either path's signal is evidence on its own; a node with both gives both.
    Cause("gpu_sm_contention", "gpu",
          (_ev("sloscope.gpu.kernel.busy.max"), _ev("sloscope.gpu.sm.active"), _ev("hw.gpu.utilization")),
          "SM time-slice preemption, warp-scheduler contention (co-tenant kernels)",
          "shift new requests away from {node} (GPU saturated)"),
    Cause("gpu_memory_bandwidth", "gpu", (_ev("sloscope.gpu.dram.active"),),
          "HBM channel arbitration / bandwidth saturation",
          "shift new requests away from {node} (HBM bandwidth saturated); check co-tenant memory-bound jobs"),
    Cause("gpu_memory_leak", "gpu", (_ev("hw.gpu.memory.usage", feature="growth"),),
          "framebuffer leak (" + GPU_MEMORY_LEAK.text + ")",
          "restart the leaking inference workload on {node}"),
    Cause("gpu_interconnect", "gpu", (_ev("hw.gpu.io"),),
          "NVLink / PCIe DMA contention",
          "move tensor-parallel peers on {node} off the contended NVLink/PCIe path"),
    Cause("gpu_thermal", "gpu", (_ev("hw.gpu.temperature"),),
          "thermal throttling",
          "shift new requests away from {node} and check its cooling (GPU thermal throttling)",
          {"hw.gpu.temperature": 85.0}),
    Cause("storage_queue", "storage",
          (_ev("spdk.bdev.io.wait"), _ev("spdk.bdev.queue_depth"), _ev("spdk.reactor.busy")),
          "NVMe queue congestion / reactor saturation",
          "throttle background I/O on {node}'s SPDK bdev (queue congestion)",
          {"spdk.bdev.io.wait": 0.005, "spdk.reactor.busy": 0.7}),
    Cause("storage_thermal", "storage", (_ev("sloscope.nvme.temperature"),),
          "NVMe thermal throttle (> 65 C)",
          "throttle the bdev on {node} to queue depth 32 (NVMe thermal throttle)",
          {"sloscope.nvme.temperature": 65.0}),
    Cause("disk_io", "storage",
          (_ev("sloscope.block.io.duration"), _ev("system.disk.io_time"),
           _ev("sloscope.pressure.stall", pressure__resource="io")),
          "kernel block-device latency",
          "move I/O-heavy co-tenants off {node}'s disk",
          # Under memory pressure the disk is busy reading back pages the kernel took away: an effect.
          explained_by=("memory_pressure",)),
    Cause("network_loss", "network", (_ev("sloscope.tcp.retransmits"),),
          "packet loss on the path",
          "drain traffic from {node}'s network path and check its link"),
    Cause("connection_churn", "network",
          (_ev("system.network.connection.count", network__connection__state="time_wait"),
           _ev("sloscope.tcp.state_transitions")),
          "connection exhaustion / short-lived connections",
          "enable connection pooling / keep-alive for clients of {node}"),
    Cause("cpu_contention", "cpu",
          (_ev("sloscope.cpu.runqueue.delay"), _ev("sloscope.pressure.stall", pressure__resource="cpu")),
          "CPU run-queue contention (noisy neighbour)",
          "move the noisy neighbour off {node} or pin the inference pods' CPUs"),
    Cause("memory_pressure", "memory", (_ev("sloscope.pressure.stall", pressure__resource="memory"),
                                        _ev("system.paging.faults", system__paging__type="major")),
          "reclaim / memory stalls",
          "evict or limit memory-hungry co-tenants on {node}"),
    Cause("syscall_overhead", "runtime", (_ev("sloscope.syscall.duration"),),
          "slow syscall path (sandboxed runtimes, lock contention)",
          "check {node}'s container runtime and lock contention (slow syscalls)",
          # A syscall that waits for the disk, a CPU, memory reclaim or a lost packet is slow because of
          # them, not because of its own path.
          explained_by=("disk_io", "cpu_contention", "memory_pressure", "network_loss")),
)

BY_ID: dict[str, Cause] = {c.id: c for c in CAUSES}
CAUSE_IDS: tuple[str, ...] = tuple(BY_ID)
assert all(other in BY_ID for c in CAUSES for other in c.explained_by)
