"""Every metric name sloscope exports to Prometheus, in one place.

serve's /metrics (alerts/store_metrics.py) builds its families from these constants, and the rule generator
(alerts/rules.py) writes its expressions with them, so a rule can only name a series that is exported; a test
parses every rule expression and checks that each series it names is either exported here or recorded by
another rule.

Naming follows Prometheus conventions: base units (seconds, bytes, ratios in [0, 1], degrees Celsius),
unit suffixes (`_seconds`, `_bytes`, `_ratio`, `_celsius`), `_total` for counters. Labels are short and
bounded: `tier` (only tiers of the SLO spec), `service`, `node`, `gpu` (GPU UUID), `bdev`, `direction`,
`lcore`, `device`, `cause` (taxonomy ids).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from sloscope.latency_buckets import buckets_for, le_seconds  # noqa: F401 (the request families' bounds)

NAMESPACE = "sloscope"

# --- requests (from ingested SERVER spans, cumulative over the store) ---------------------------------------------
REQUEST_DURATION = "sloscope_request_duration_seconds"  # histogram: _bucket{le}, _count, _sum
REQUESTS = "sloscope_requests_total"
REQUEST_ERRORS = "sloscope_request_errors_total"
REQUEST_LABELS = ("tier", "service", "node")


@dataclass(frozen=True)
class TokenFamily:
    """A histogram of one of an inference request's token timings (slo_spec.TOKEN_SLIS), over the requests whose
    spans give it (receiver/token_timings.py), by REQUEST_LABELS; its bounds include every tier's threshold for it
    (latency_buckets.buckets_for(spec, sli))."""

    sli: str
    name: str
    short: str  # as titles name it
    what: str  # what it times, as descriptions say it


TOKEN_FAMILIES = (
    TokenFamily("ttft", "sloscope_request_ttft_seconds", "TTFT", "time to first token"),
    TokenFamily("tpot", "sloscope_request_tpot_seconds", "TPOT", "time per output token"),
    TokenFamily("queue", "sloscope_request_queue_seconds", "queue time", "time in the queue"),
)
TOKEN_FAMILY = {f.sli: f for f in TOKEN_FAMILIES}

# --- current RCA result ------------------------------------------------------------------------------------------
INCIDENT_CAUSE_SCORE = "sloscope_incident_cause_score"
INCIDENT_LABELS = ("tier", "service", "node", "cause")

# --- ingest and /metrics itself ---------------------------------------------------------------------------------
INGEST_PREFIX = "sloscope_ingest_"  # + <ingest_counters.name> + "_total"
SERIES_DROPPED = "sloscope_exporter_series_dropped_total"  # {family}: label sets left out by the cardinality cap
EXPORTER_ERRORS = "sloscope_exporter_errors_total"  # {part}: parts of a scrape that failed and were left out


@dataclass(frozen=True)
class GaugeFamily:
    """A physical signal exported as a gauge: the latest stored value of each series of a catalog signal.

    `labels` maps exported label names to the sample attribute they come from (`node` is the sample's node).
    A series carrying any attribute in `exclude_if` is not exported (e.g. per-process GPU utilization).
    """

    name: str
    signal: str
    help: str
    labels: tuple[tuple[str, str], ...]
    exclude_if: tuple[str, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.labels)


_NODE = ("node", "node")
_GPU = ("gpu", "hw.id")
_BDEV = ("bdev", "spdk.bdev.name")

GPU_UTILIZATION = "sloscope_gpu_utilization_ratio"
GPU_KERNEL_BUSY_MAX = "sloscope_gpu_kernel_busy_max_ratio"
GPU_SM_ACTIVE = "sloscope_gpu_sm_active_ratio"
GPU_DRAM_ACTIVE = "sloscope_gpu_dram_active_ratio"
GPU_MEMORY_USED = "sloscope_gpu_memory_used_bytes"
GPU_MEMORY_LIMIT = "sloscope_gpu_memory_limit_bytes"
GPU_MEMORY_RESERVED = "sloscope_gpu_memory_reserved_bytes"
GPU_TEMPERATURE = "sloscope_gpu_temperature_celsius"
NVME_TEMPERATURE = "sloscope_nvme_temperature_celsius"
SPDK_BDEV_IO_WAIT = "sloscope_spdk_bdev_io_wait_seconds"
SPDK_BDEV_QUEUE_DEPTH = "sloscope_spdk_bdev_queue_depth"
SPDK_REACTOR_BUSY = "sloscope_spdk_reactor_busy_ratio"
PROBE_UP = "sloscope_probe_up"
PROBE_SIGNAL_UP = "sloscope_probe_signal_up"

GAUGES: tuple[GaugeFamily, ...] = (
    GaugeFamily(GPU_UTILIZATION, "hw.gpu.utilization", "GPU utilization (0..1), latest sample per GPU.",
                (_NODE, _GPU), exclude_if=("process.pid",)),
    GaugeFamily(GPU_KERNEL_BUSY_MAX, "sloscope.gpu.kernel.busy.max",
                "Peak share of time a kernel ran (0..1, NVML) within the last collection window, latest sample.",
                (_NODE, _GPU)),
    GaugeFamily(GPU_SM_ACTIVE, "sloscope.gpu.sm.active",
                "Mean share of SMs with a warp resident (0..1, DCGM SM_ACTIVE), latest sample per GPU.",
                (_NODE, _GPU)),
    GaugeFamily(GPU_DRAM_ACTIVE, "sloscope.gpu.dram.active", "HBM bandwidth utilization (0..1), latest sample.",
                (_NODE, _GPU)),
    GaugeFamily(GPU_MEMORY_USED, "hw.gpu.memory.usage", "GPU framebuffer in use, bytes, latest sample.",
                (_NODE, _GPU)),
    GaugeFamily(GPU_MEMORY_LIMIT, "hw.gpu.memory.limit", "GPU framebuffer size, bytes, latest sample.",
                (_NODE, _GPU)),
    GaugeFamily(GPU_MEMORY_RESERVED, "sloscope.gpu.memory.reserved",
                "GPU framebuffer reserved by the driver, bytes, latest sample.", (_NODE, _GPU)),
    GaugeFamily(GPU_TEMPERATURE, "hw.gpu.temperature", "GPU temperature, degrees Celsius, latest sample.",
                (_NODE, _GPU)),
    GaugeFamily(NVME_TEMPERATURE, "sloscope.nvme.temperature",
                "NVMe composite temperature, degrees Celsius, latest sample (by SPDK bdev or kernel device).",
                (_NODE, _BDEV, ("device", "system.device"))),
    GaugeFamily(SPDK_BDEV_IO_WAIT, "spdk.bdev.io.wait", "Mean SPDK bdev I/O wait, seconds, latest sample.",
                (_NODE, _BDEV, ("direction", "disk.io.direction"))),
    GaugeFamily(SPDK_BDEV_QUEUE_DEPTH, "spdk.bdev.queue_depth", "Mean SPDK bdev queue depth, latest sample.",
                (_NODE, _BDEV)),
    GaugeFamily(SPDK_REACTOR_BUSY, "spdk.reactor.busy", "SPDK reactor busy ratio (0..1), latest sample.",
                (_NODE, ("lcore", "spdk.reactor.lcore"))),
    GaugeFamily(PROBE_UP, "sloscope.probe.health",
                "1 when the node collector's probe runs itself and collects, 0 when it is missing (`running` names "
                "the fallback in its place) or failing; latest report.",
                (_NODE, ("probe", "probe.name"), ("running", "probe.running"))),
    GaugeFamily(PROBE_SIGNAL_UP, "sloscope.probe.signal.health",
                "1 while a running probe produces the signal, 0 while its source lacks what it needs (`needs`: the "
                "DCGM fields the exporter does not serve, or SPDK's bdev_set_qd_sampling_period); latest report.",
                (_NODE, ("probe", "probe.name"), ("signal", "sloscope.signal.name"), ("needs", "probe.needs"))),
)
GAUGES_BY_NAME = {g.name: g for g in GAUGES}


class SignalFamily(GaugeFamily):
    """A catalog counter (exported as a `_total` counter: the stored increases summed) or histogram (exported
    as a Prometheus histogram with SIGNAL_BUCKETS_S) of every series of a signal, cumulative over the store."""


GPU_IO = "sloscope_gpu_io_bytes_total"
TCP_RETRANSMITS = "sloscope_tcp_retransmits_total"
PRESSURE_STALL = "sloscope_pressure_stall_seconds_total"
SYSCALL_DURATION = "sloscope_syscall_duration_seconds"
BLOCK_IO_DURATION = "sloscope_block_io_duration_seconds"
RUNQUEUE_DELAY = "sloscope_cpu_runqueue_delay_seconds"

COUNTERS: tuple[SignalFamily, ...] = (
    SignalFamily(GPU_IO, "hw.gpu.io", "GPU interconnect bytes (NVLink, PCIe) by direction.",
                 (_NODE, _GPU, ("link", "sloscope.gpu.link"), ("direction", "network.io.direction"))),
    SignalFamily(TCP_RETRANSMITS, "sloscope.tcp.retransmits", "TCP segments retransmitted.", (_NODE,)),
    SignalFamily(PRESSURE_STALL, "sloscope.pressure.stall", "Time stalled on a resource (PSI), seconds.",
                 (_NODE, ("resource", "pressure.resource"), ("kind", "pressure.kind"))),
)
SIGNAL_HISTOGRAMS: tuple[SignalFamily, ...] = (
    SignalFamily(SYSCALL_DURATION, "sloscope.syscall.duration", "Syscall latency, seconds (eBPF).",
                 (_NODE, ("syscall", "syscall.name"))),
    SignalFamily(BLOCK_IO_DURATION, "sloscope.block.io.duration", "Block request latency, seconds (eBPF).",
                 (_NODE, ("device", "system.device"))),
    SignalFamily(RUNQUEUE_DELAY, "sloscope.cpu.runqueue.delay", "Wake-up to running delay, seconds (eBPF).",
                 (_NODE,)),
)
# Powers of four from about 1 us to 16 s: the stored scale-0 buckets, merged in pairs to keep series few.
SIGNAL_BUCKETS_S = tuple(2.0 ** k for k in range(-20, 5, 2))

# --- remediation ---------------------------------------------------------------------------------------------------
REMEDIATION_ACTIONS = "sloscope_remediation_actions_total"
REMEDIATION_LABELS = ("alert", "action", "target", "decision")  # targets: validated node, bdev, tier names

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def exported_series() -> frozenset[str]:
    """Every series name a scrape can carry, histogram series spelled out (the ingest counters, whose names
    come from the store, are matched by INGEST_PREFIX instead)."""
    names = {REQUESTS, REQUEST_ERRORS, INCIDENT_CAUSE_SCORE, SERIES_DROPPED, EXPORTER_ERRORS, REMEDIATION_ACTIONS}
    names.update(h + s for h in (REQUEST_DURATION, *(f.name for f in (*TOKEN_FAMILIES, *SIGNAL_HISTOGRAMS)))
                 for s in HISTOGRAM_SUFFIXES)
    names.update(g.name for g in GAUGES)
    names.update(c.name for c in COUNTERS)
    return frozenset(names)


def le_label(seconds: float) -> str:
    """The `le` label value /metrics writes for a bucket bound, so that rules select exactly that bucket."""
    return floatToGoString(seconds)

