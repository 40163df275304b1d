"""The signal catalog (docs/catalog.md): the one place that names every signal sloscope emits or reads.

Probes emit these names, analytics reads them, rules and dashboards query them. A signal's `harmful`
direction says which way of moving hurts requests; attribution only counts movement that way.
`noise_floor` is the smallest change (in the signal's unit) worth calling a change: it keeps a signal that
was perfectly flat in its baseline from producing an infinite anomaly score on the first jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"  # OTLP Sum, monotonic; stored as per-interval deltas
    HISTOGRAM = "histogram"  # OTLP exponential histogram; stored as per-interval deltas


class Direction(str, Enum):
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class Signal:
    name: str
    instrument: Instrument
    unit: str
    attributes: tuple[str, ...]
    source: str
    harmful: Direction = Direction.UP
    noise_floor: float = 0.0
    description: str = ""


def _signal(name, instrument, unit, attributes=(), source="", harmful=Direction.UP, noise_floor=0.0, description=""):
    return Signal(name, Instrument(instrument), unit, tuple(attributes), source, Direction(harmful), noise_floor, description)


SIGNALS: tuple[Signal, ...] = (
    _signal("sloscope.syscall.duration", "histogram", "s", ["syscall.name", "process.pid"],
            "eBPF syscalls:sys_enter/exit_*", noise_floor=2e-6, description="syscall latency"),
    _signal("sloscope.tcp.retransmits", "counter", "{segment}", [],
            "eBPF tcp:tcp_retransmit_skb, else /proc/net/snmp RetransSegs", noise_floor=1.0,
            description="TCP segments retransmitted"),
    _signal("sloscope.tcp.state_transitions", "counter", "{transition}", ["network.connection.state"],
            "eBPF sock:inet_sock_set_state", noise_floor=2.0, description="TCP state transitions by new state"),
    _signal("system.network.connection.count", "gauge", "{connection}",
            ["network.connection.state", "network.transport"], "/proc/net/tcp{,6}", noise_floor=100.0,
            # a node's connection counts move by hundreds with its clients; exhaustion is thousands
            description="TCP connections per state"),
    _signal("sloscope.block.io.duration", "histogram", "s", ["system.device"],
            "eBPF block:block_rq_issue/complete", noise_floor=1e-4, description="block request latency"),
    _signal("system.disk.io_time", "counter", "s", ["system.device"], "/proc/diskstats field 10",
            noise_floor=0.02, description="time the device was busy"),
    _signal("sloscope.cpu.runqueue.delay", "histogram", "s", [],
            "eBPF sched:sched_wakeup/sched_switch, else /proc/schedstat run_delay (Sum, s)", noise_floor=2e-5,
            description="wake-up to running delay"),
    _signal("sloscope.pressure.stall", "counter", "s", ["pressure.resource", "pressure.kind"],
            "/proc/pressure/* total", noise_floor=0.01, description="time stalled on a resource (PSI)"),
    _signal("system.paging.faults", "counter", "{fault}", ["system.paging.type"],
            "/proc/vmstat pgmajfault (major), pgfault - pgmajfault (minor)", noise_floor=20.0,
            description="page faults; major ones read the page from disk (page cache taken back under memory "
            "pressure and needed again)"),
    _signal("hw.gpu.utilization", "gauge", "1", ["hw.id", "hw.gpu.task", "process.pid"],
            "NVML / DCGM_FI_DEV_GPU_UTIL (process.pid: NVML per-process SM utilization, optional)",
            noise_floor=0.05, description="GPU utilization"),
    # Two SM signals with different meanings (one small kernel reads ~1.0 on the first, ~1/132 on the second
    # on an H100/H200), kept apart so that baselines and z-scores never mix them.
    _signal("sloscope.gpu.kernel.busy.max", "gauge", "1", ["hw.id"],
            "NVML: max of nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES) within the window", noise_floor=0.05,
            description="peak share of time a kernel was running, within the collection window (0 when idle)"),
    _signal("sloscope.gpu.sm.active", "gauge", "1", ["hw.id"],
            "DCGM_FI_PROF_SM_ACTIVE (DCGM 4.x name DCGM_FI_PROF_SM_UTIL_RATIO, field 1002)", noise_floor=0.05,
            description="mean share of SMs with at least one warp resident over DCGM's sample period"),
    _signal("sloscope.gpu.dram.active", "gauge", "1", ["hw.id"], "DCGM_FI_PROF_DRAM_ACTIVE", noise_floor=0.05,
            description="HBM bandwidth utilization"),
    _signal("hw.gpu.memory.usage", "gauge", "By", ["hw.id"],
            "NVML nvmlDeviceGetMemoryInfo_v2 used (v1 on drivers without it) / DCGM_FI_DEV_FB_USED",
            noise_floor=256 * 2**20, description="framebuffer in use, without the driver's reserved memory"),
    _signal("sloscope.gpu.memory.reserved", "gauge", "By", ["hw.id"],
            "NVML nvmlDeviceGetMemoryInfo_v2 reserved / DCGM_FI_DEV_FB_RESERVED", noise_floor=256 * 2**20,
            description="framebuffer the driver and firmware reserve (not available to applications)"),
    _signal("hw.gpu.memory.limit", "gauge", "By", ["hw.id"], "NVML / DCGM FB total", noise_floor=2**30,
            description="framebuffer size"),
    _signal("hw.gpu.io", "counter", "By", ["hw.id", "network.io.direction", "sloscope.gpu.link"],
            "NVML NVLink throughput / DCGM_FI_PROF_{NVLINK,PCIE}_{TX,RX}_BYTES", harmful="down",
            noise_floor=2**26, description="GPU interconnect bytes (falls when contended)"),
    _signal("hw.gpu.temperature", "gauge", "Cel", ["hw.id"], "NVML / DCGM_FI_DEV_GPU_TEMP", noise_floor=2.0,
            description="GPU temperature"),
    _signal("spdk.bdev.io.wait", "gauge", "s", ["spdk.bdev.name", "disk.io.direction"],
            "SPDK bdev_get_iostat", noise_floor=2e-4, description="mean bdev I/O wait"),
    _signal("spdk.bdev.queue_depth", "gauge", "{io}", ["spdk.bdev.name"], "SPDK bdev_get_iostat",
            noise_floor=2.0, description="mean bdev queue depth"),
    _signal("spdk.bdev.utilization", "gauge", "1", ["spdk.bdev.name"], "SPDK bdev_get_iostat", noise_floor=0.05,
            description="bdev busy ratio"),
    _signal("spdk.reactor.busy", "gauge", "1", ["spdk.reactor.lcore"], "SPDK framework_get_reactors",
            noise_floor=0.05, description="SPDK reactor busy ratio"),
    _signal("sloscope.probe.health", "gauge", "1", ["probe.name", "probe.running"],
            "the node collector: 1 when a requested probe runs itself and its last collection worked, else 0",
            harmful="down", noise_floor=0.5, description="probe health (probe.running: what runs in its place)"),
    _signal("sloscope.probe.signal.health", "gauge", "1", ["probe.name", "sloscope.signal.name", "probe.needs"],
            "the node collector: per signal of a running probe, 1 while it is produced, 0 while the source lacks "
            "what it needs (probe.needs: the missing DCGM fields, or SPDK's bdev_set_qd_sampling_period)",
            harmful="down", noise_floor=0.5, description="whether a running probe can produce each of its signals"),
    _signal("sloscope.nvme.temperature", "gauge", "Cel", ["spdk.bdev.name", "system.device"],
            "SPDK NVMe health info, else /sys/class/nvme/*/hwmon*", noise_floor=2.0,
            description="NVMe composite temperature"),
)

BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}


def signal(name: str) -> Signal:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the signal catalog") from None


# Resource attributes every metric carries; analytics resolves a sample's node with this precedence.
NODE_ATTRIBUTES = ("k8s.node.name", "host.name")
# The node of a span or data point that names none (and, for a span, no GPU whose node is known): stored as this
# name, counted (spans_node_unknown, points_node_unknown), and skipped by node attribution; tier SLIs count it.
UNKNOWN_NODE = "unknown"
