"""The signal catalog (docs/catalog.md): the one place that names every signal sloscope emits or reads.

Probes emit these names, analytics reads them, rules and dashboards query them. A signal's `harmful`
direction says which way of moving hurts requests; attribution only counts movement that way.
`noise_floor` is the smallest change (in the signal's unit) worth calling a change: it keeps a signal that
was perfectly flat in its baseline from producing an infinite anomaly score on the first jitter.

Besides sloscope's own probes, the OpenTelemetry Collector's receivers produce some of these signals under their
own names (hostmetrics, kubeletstats, and the prometheus receiver scraping dcgm-exporter). Each signal names its
producers; where two produce one name (`system.disk.io_time`, `system.paging.faults`), they write different
attribute names, and a series' attributes say which one it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"  # OTLP Sum, monotonic; stored as per-interval deltas
    HISTOGRAM = "histogram"  # OTLP exponential histogram; stored as per-interval deltas


class Direction(str, Enum):
    UP = "up"
    DOWN = "down"


OWN = "sloscope"  # the producer of what sloscope's own probes (through its node collector) emit
# The OpenTelemetry Collector receivers whose metrics the catalog names, as their configuration calls them.
HOSTMETRICS, KUBELETSTATS, PROMETHEUS = "hostmetrics", "kubeletstats", "prometheus"
PRODUCERS = (OWN, HOSTMETRICS, KUBELETSTATS, PROMETHEUS)


@dataclass(frozen=True)
class Producer:
    """Who writes a signal, with which attribute names, read from where."""

    name: str  # one of PRODUCERS
    attributes: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Signal:
    name: str
    instrument: Instrument
    unit: str
    producers: tuple[Producer, ...]  # the first is the signal's own definition; others write the same name
    harmful: Direction = Direction.UP
    noise_floor: float = 0.0
    description: str = ""
    # Resource attributes that tell the signal's series apart (kubeletstats: one resource per pod or container),
    # kept among the series' attributes.
    resource_attributes: tuple[str, ...] = ()
    # A data point attribute that names the node where the resource names none (dcgm-exporter's Hostname label,
    # which the prometheus receiver keeps as a data point attribute).
    node_attribute: str = ""
    # Values from here up are no measurement (DCGM's blank sentinels: a field with no value); not kept.
    blank_from: float = math.inf
    # Data point attributes that name what uses the measured thing at the moment, not the thing: not kept, so
    # that the series goes on when its user changes (dcgm-exporter's pod mapping, at every rollout).
    dropped_attributes: tuple[str, ...] = ()

    @property
    def attributes(self) -> tuple[str, ...]:
        return self.producers[0].attributes

    @property
    def source(self) -> str:
        return "; ".join(p.source for p in self.producers)

    @property
    def own(self) -> bool:
        """Whether sloscope's own probes emit it."""
        return any(p.name == OWN for p in self.producers)

    def producer_of(self, attribute_names: Iterable[str]) -> Producer:
        """The producer of a series with these attribute names: the one that writes them all (of two that write
        one name, only one does), else the signal's own definition."""
        names = set(attribute_names)
        if len(self.producers) > 1:
            for producer in self.producers:
                if names and names <= set(producer.attributes):
                    return producer
        return self.producers[0]


def _signal(name, instrument, unit, attributes=(), source="", harmful=Direction.UP, noise_floor=0.0, description="",
            producer=OWN, also=(), **details):
    producers = (Producer(producer, tuple(attributes), source), *also)
    return Signal(name, Instrument(instrument), unit, producers, Direction(harmful), noise_floor, description,
                  **details)


def _hostmetrics(scraper: str, name, instrument, unit, attributes, noise_floor, description, what=""):
    return _signal(name, instrument, unit, attributes, f"hostmetrics receiver, {scraper} scraper{what}",
                   noise_floor=noise_floor, description=description, producer=HOSTMETRICS)


# kubeletstats: one resource per pod (and per container), named by these resource attributes.
POD_RESOURCE = ("k8s.pod.name", "k8s.namespace.name")
CONTAINER_RESOURCE = (*POD_RESOURCE, "k8s.container.name")


def _kubeletstats(name, unit, resource, noise_floor, description):
    return _signal(name, "gauge", unit, resource, f"kubeletstats receiver ({name.split('.')[-3]} metric group)",
                   noise_floor=noise_floor, description=description, producer=KUBELETSTATS,
                   resource_attributes=resource)


# dcgm-exporter's labels, which the prometheus receiver turns into data point attributes (job and instance
# become resource attributes). Kubernetes adds container, namespace and pod where a GPU is assigned: the GPU's
# tenant of the moment, not kept (a GPU's series would start again, without a baseline, whenever a new pod takes
# it, as a rollout does).
DCGM_TENANT_LABELS = ("container", "namespace", "pod")
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
               "GPU_I_PROFILE", "GPU_I_ID")
DCGM_BLANK_FROM = 2.0**47  # DCGM's blank fp64 value; its int64 blanks are larger still
DCGM_NODE_LABEL = "Hostname"
# dcgm-exporter's fields all begin so: a field an SLO spec declares is read by the same rules as the catalog's.
DCGM_PREFIX = "DCGM_"


def _dcgm(name, unit, noise_floor, description):
    return _signal(name, "gauge", unit, DCGM_LABELS, "dcgm-exporter through the prometheus receiver (a gauge)",
                   noise_floor=noise_floor, description=description, producer=PROMETHEUS,
                   node_attribute=DCGM_NODE_LABEL, blank_from=DCGM_BLANK_FROM, dropped_attributes=DCGM_TENANT_LABELS)


SIGNALS: tuple[Signal, ...] = (
    _signal("sloscope.syscall.duration", "histogram", "s", ["syscall.name", "process.pid"],
            "eBPF syscalls:sys_enter/exit_*", noise_floor=2e-6, description="syscall latency"),
    _signal("sloscope.tcp.retransmits", "counter", "{segment}", [],
            "eBPF tcp:tcp_retransmit_skb, else /proc/net/snmp RetransSegs", noise_floor=1.0,
            description="TCP segments retransmitted"),
    _signal("sloscope.tcp.state_transitions", "counter", "{transition}", ["network.connection.state"],
            "eBPF sock:inet_sock_set_state", noise_floor=2.0, description="TCP state transitions by new state"),
    _signal("system.network.connection.count", "gauge", "{connection}",
            ["network.connection.state", "network.transport"],
            "netlink sock_diag, else /proc/net/tcp{,6}; one point per 10 s", noise_floor=100.0,
            # a node's connection counts move by hundreds with its clients; exhaustion is thousands
            description="TCP connections per state"),
    _signal("sloscope.tcp.rtt", "histogram", "s", [],
            "eBPF tcp:tcp_probe (srtt per received segment), else netlink sock_diag tcp_info rtt (per connection)",
            # a path inside a data centre takes some 50-500 us; a tenth of a millisecond more is a path that changed
            noise_floor=1e-4, description="smoothed round-trip time of established TCP connections"),
    _signal("sloscope.block.io.duration", "histogram", "s", ["system.device"],
            "eBPF block:block_rq_issue/complete", noise_floor=1e-4, description="block request latency"),
    _signal("system.disk.io_time", "counter", "s", ["system.device"], "/proc/diskstats field 10",
            noise_floor=0.02, description="time the device was busy",
            also=(Producer(HOSTMETRICS, ("device",), "hostmetrics receiver, disk scraper (attribute `device`)"),)),
    _signal("sloscope.cpu.runqueue.delay", "histogram", "s", [],
            "eBPF sched:sched_wakeup/sched_switch, else /proc/schedstat run_delay (Sum, s)", noise_floor=2e-5,
            description="wake-up to running delay"),
    _signal("sloscope.pressure.stall", "counter", "s", ["pressure.resource", "pressure.kind"],
            "/proc/pressure/* total", noise_floor=0.01, description="time stalled on a resource (PSI)"),
    _signal("system.paging.faults", "counter", "{fault}", ["system.paging.type"],
            "/proc/vmstat pgmajfault (major), pgfault - pgmajfault (minor)", noise_floor=20.0,
            description="page faults; major ones read the page from disk (page cache taken back under memory "
            "pressure and needed again)",
            # hostmetrics writes its unit as {faults}: the same count
            also=(Producer(HOSTMETRICS, ("type",), "hostmetrics receiver, paging scraper (attribute `type`)"),)),
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
    # --- the OpenTelemetry Collector's hostmetrics receiver (its scrapers' metadata.yaml) ---
    _hostmetrics("cpu", "system.cpu.utilization", "gauge", "1", ["cpu", "state"], 0.05,
                 "share of each logical CPU's time in each state", " (optional metric)"),
    _hostmetrics("load", "system.cpu.load_average.1m", "gauge", "{thread}", [], 0.5,
                 "runnable and uninterruptible threads, averaged over a minute"),
    _hostmetrics("memory", "system.memory.utilization", "gauge", "1", ["state"], 0.02,
                 "share of memory in each state", " (optional metric)"),
    _hostmetrics("disk", "system.disk.operation_time", "counter", "s", ["device", "direction"], 0.02,
                 "time spent in disk operations, summed over the operations in flight"),
    _hostmetrics("network", "system.network.errors", "counter", "{errors}", ["device", "direction"], 1.0,
                 "interface errors"),
    _hostmetrics("network", "system.network.dropped", "counter", "{packets}", ["device", "direction"], 1.0,
                 "packets the interface dropped"),
    _hostmetrics("network", "system.network.connections", "gauge", "{connections}", ["protocol", "state"], 100.0,
                 "TCP connections per state (upper-case states, e.g. TIME_WAIT)",
                 " (a non-monotonic sum, read as a level)"),
    # --- the kubeletstats receiver: the node's and each pod's and container's usage, from the kubelet ---
    _kubeletstats("k8s.node.cpu.usage", "{cpu}", (), 0.1, "CPUs the node uses"),
    _kubeletstats("k8s.node.memory.working_set", "By", (), 2**28, "the node's working set"),
    # A pod often uses a few millicores: a floor of a tenth of a CPU would hide it going from 1 m to 50 m.
    _kubeletstats("k8s.pod.cpu.usage", "{cpu}", POD_RESOURCE, 0.005, "CPUs a pod uses"),
    _kubeletstats("k8s.pod.memory.working_set", "By", POD_RESOURCE, 2**26, "a pod's working set"),
    _kubeletstats("container.cpu.usage", "{cpu}", CONTAINER_RESOURCE, 0.005, "CPUs a container uses"),
    _kubeletstats("container.memory.working_set", "By", CONTAINER_RESOURCE, 2**26, "a container's working set"),
    # --- dcgm-exporter's fields as the prometheus receiver writes them: names and units as DCGM defines them,
    # kept apart from sloscope's own GPU signals (a 0..100 percent is never compared with a 0..1 ratio) ---
    _dcgm("DCGM_FI_DEV_GPU_UTIL", "%", 5.0, "GPU utilization, 0..100 percent (field 203)"),
    _dcgm("DCGM_FI_PROF_SM_ACTIVE", "1", 0.05, "mean share of SMs with a warp resident, 0..1 (field 1002)"),
    _dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "1", 0.05, "HBM bandwidth utilization, 0..1 (field 1005)"),
    _dcgm("DCGM_FI_DEV_FB_USED", "MiBy", 256.0, "framebuffer in use, MiB (field 252)"),
    _dcgm("DCGM_FI_DEV_GPU_TEMP", "Cel", 2.0, "GPU temperature (field 150)"),
)

BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}
assert len(BY_NAME) == len(SIGNALS), "one entry per name; other producers of a name go in its producers"
assert all(p.name in PRODUCERS for s in SIGNALS for p in s.producers)


def signal(name: str) -> Signal:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the signal catalog") from None


# Resource attributes every metric carries; analytics resolves a sample's node with this precedence.
NODE_ATTRIBUTES = ("k8s.node.name", "host.name")
# A request span's SLO tier (docs/tiers.md): the x-slo-tier request header as OpenTelemetry names a captured
# header, else the Istio custom tag of deploy/istio-telemetry.yaml; read in this order.
TIER_HEADER_ATTRIBUTE = "http.request.header.x-slo-tier"
TIER_ISTIO_TAG = "slo.tier"
TIER_ATTRIBUTES = (TIER_HEADER_ATTRIBUTE, TIER_ISTIO_TAG)
# The node of a span or data point that names none (and, for a span, no GPU whose node is known): stored as this
# name, counted (spans_node_unknown, points_node_unknown), and skipped by node attribution; tier SLIs count it.
UNKNOWN_NODE = "unknown"
# The node of an incident judged over every replica of its service together (docs/tiers.md): a fault deep in a
# mesh slows a few requests on each of many entry pods, too few on any one of them to be judged there. No
# Kubernetes node or host can bear this name (a DNS name has no '*').
EVERY_NODE = "*"
