"""The signal catalog (docs/catalog.md): the one place that names every signal sloscope emits or reads.

Probes emit these names, analytics reads them, rules and dashboards query them. A signal's `harmful`
direction says which way of moving hurts requests; attribution only counts movement that way.
`noise_floor` is the smallest change (in the signal's unit) worth calling a change: it keeps a signal that
was perfectly flat in its baseline from producing an infinite anomaly score on the first jitter.

Besides sloscope's own probes, the OpenTelemetry Collector's receivers produce some of these signals under their
own names (hostmetrics, kubeletstats, the prometheus receiver scraping dcgm-exporter and the inference engines, and
the otlp receiver for the GenAI semantic conventions' server metrics). Each signal names its producers; where two
produce one name (`system.disk.io_time`, `system.paging.faults`), they write different attribute names, and a
series' attributes say which one it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Iterable


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"  # OTLP Sum, monotonic; stored as per-interval deltas
    # OTLP exponential histogram (or explicit-bucket, where Signal.explicit_buckets); stored as per-interval deltas
    HISTOGRAM = "histogram"


class Direction(str, Enum):
    UP = "up"
    DOWN = "down"


OWN = "sloscope"  # the producer of what sloscope's own probes (through its node collector) emit
# The OpenTelemetry Collector receivers whose metrics the catalog names, as their configuration calls them.
HOSTMETRICS, KUBELETSTATS, PROMETHEUS, OTLP = "hostmetrics", "kubeletstats", "prometheus", "otlp"
REQUESTS = "requests"  # what the stored requests themselves say (INFERENCE_LOAD): derived, not received
PRODUCERS = (OWN, HOSTMETRICS, KUBELETSTATS, PROMETHEUS, OTLP, REQUESTS)


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
    # A histogram its producers write with explicit buckets (a Prometheus histogram through the prometheus receiver,
    # an SDK's default aggregation): kept, its buckets folded onto the store's scale-0 slots, count and sum exact.
    explicit_buckets: bool = False

    @property
    def derived(self) -> bool:
        """Derived from the stored requests, not received (INFERENCE_LOAD): the decoders keep no point of its name."""
        return self.producers[0].name == REQUESTS

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


# An inference engine's /metrics as the prometheus receiver delivers them by its defaults: a histogram's _bucket,
# _sum and _count series become one explicit-bucket histogram under the base name, a counter keeps its _total
# (TGI's and Triton's counters never had one) and a gauge stays a gauge, names as the engine wrote them, colons and
# all. The receiver makes the scrape target the resource (service.name: the job, service.instance.id: the
# instance), with the pod and its node (k8s.pod.name, k8s.namespace.name, k8s.node.name) where
# kubernetes_sd_configs with role pod or the k8sattributes processor name them. The pod is kept among the series'
# attributes: two replicas of one model on a node are two series, not one whose counters jump between them, and a
# series whose resource names no node can be placed on its pod's (enrich/pods.py).
ENGINE_RESOURCE = POD_RESOURCE
VLLM, SGLANG, TGI, TRITON = "vLLM", "SGLang", "TGI", "Triton"
VLLM_LABELS = ("model_name", "engine")  # the served model; the engine core's index ("0") in a data-parallel server
SGLANG_LABELS = ("model_name",)  # its tokenizer manager's metrics
# Its scheduler's: one series per engine type (unified, prefill, decode) and parallel rank.
SGLANG_SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank")
TRITON_LABELS = ("model", "version")
# The usual swings, minute to minute, of a healthy engine's means, each the noise floor of the signals that measure
# it: the time to a first token moves with the prompts' lengths by some tens of milliseconds, the time between
# tokens with the batch's size by a few, and a whole request's time (and its decode) with the answers' lengths by
# about a second. A request or two waits now and then as a batch fills, and the running batch follows the offered
# load by a few requests.
FIRST_TOKEN_FLOOR_S, PER_TOKEN_FLOOR_S, WHOLE_REQUEST_FLOOR_S = 0.05, 0.005, 1.0
WAITING_FLOOR, RUNNING_FLOOR = 2.0, 4.0
# A healthy engine preempts (or retracts) no request; a few a minute in a burst are no change yet.
PREEMPTION_FLOOR = 0.1
# Tokens per second: prompts arrive whole, so prefill throughput swings by some thousand tokens a second where
# generation, a token per running request per step, moves by a few hundred.
PROMPT_TOKENS_FLOOR, GENERATION_TOKENS_FLOOR = 1000.0, 200.0
# Triton's cumulative microseconds per second of wall time: a twentieth of a second more spent in the queue or a
# compute phase each second (one request in twenty waiting throughout) is worth calling a change.
TRITON_DURATION_FLOOR_US = 5e4


def _engine(engine, name, instrument, unit, labels, noise_floor, description, harmful=Direction.UP):
    return _signal(name, instrument, unit, labels, f"{engine} through the prometheus receiver", harmful=harmful,
                   noise_floor=noise_floor, description=description, producer=PROMETHEUS,
                   resource_attributes=ENGINE_RESOURCE, explicit_buckets=instrument == "histogram")


# The OpenTelemetry GenAI semantic conventions' server metrics (gen-ai-metrics.md), which an inference server's SDK
# sends over OTLP: histograms in seconds, explicit-bucket by the SDKs' default aggregation (exponential ones are
# read as well). The k8sattributes processor adds the pod and its node, as it does for the spans.
GENAI_LABELS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
                "gen_ai.response.model", "server.address", "server.port")


def _genai(name, noise_floor, description, labels=GENAI_LABELS):
    return _signal(name, "histogram", "s", labels,
                   "an inference server's OpenTelemetry SDK (GenAI semantic conventions) through the otlp receiver",
                   noise_floor=noise_floor, description=description, producer=OTLP,
                   resource_attributes=ENGINE_RESOURCE, explicit_buckets=True)


# What an inference service's own requests say of the load on its engine, per node and service at the analysis'
# steps (analytics/sql/inference_load.sql): its columns and the signals they are. They tell a surge of arrivals,
# which the engine's queue follows, from a fault under a steady load.
INFERENCE_LOAD = {"arrivals": "sloscope.inference.arrivals", "prompt_tokens": "sloscope.inference.prompt_tokens",
                  "queue_s": "sloscope.inference.queue_time"}
SERVICE_ATTRIBUTE = "service.name"
_FROM_REQUESTS = "derived from the service's stored requests that give token timings (docs/inference.md)"

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
    # --- inference engines' metrics as the prometheus receiver writes them: histograms read as their mean per step,
    # counters as a rate per second. Where an engine renamed one, both names are signals: each engine's release
    # writes one of them ---
    _engine(VLLM, "vllm:time_to_first_token_seconds", "histogram", "s", VLLM_LABELS, FIRST_TOKEN_FLOOR_S,
            "time from a request's arrival to its first token"),
    _engine(VLLM, "vllm:inter_token_latency_seconds", "histogram", "s", VLLM_LABELS, PER_TOKEN_FLOOR_S,
            "time between two output tokens of a request (vLLM 0.11 and later)"),
    _engine(VLLM, "vllm:time_per_output_token_seconds", "histogram", "s", VLLM_LABELS, PER_TOKEN_FLOOR_S,
            "time between two output tokens of a request (before vLLM 0.11, which renamed it "
            "vllm:inter_token_latency_seconds)"),
    _engine(VLLM, "vllm:request_time_per_output_token_seconds", "histogram", "s", VLLM_LABELS, PER_TOKEN_FLOOR_S,
            "a request's decode time over its output tokens after the first"),
    _engine(VLLM, "vllm:request_queue_time_seconds", "histogram", "s", VLLM_LABELS, FIRST_TOKEN_FLOOR_S,
            "time a request waited to be scheduled"),
    _engine(VLLM, "vllm:request_prefill_time_seconds", "histogram", "s", VLLM_LABELS, FIRST_TOKEN_FLOOR_S,
            "time from a request's scheduling to its first token"),
    _engine(VLLM, "vllm:request_decode_time_seconds", "histogram", "s", VLLM_LABELS, WHOLE_REQUEST_FLOOR_S,
            "time from a request's first token to its last"),
    _engine(VLLM, "vllm:e2e_request_latency_seconds", "histogram", "s", VLLM_LABELS, WHOLE_REQUEST_FLOOR_S,
            "time from a request's arrival to its last token"),
    _engine(VLLM, "vllm:num_requests_waiting", "gauge", "{request}", VLLM_LABELS, WAITING_FLOOR,
            "requests waiting to be scheduled"),
    _engine(VLLM, "vllm:num_requests_running", "gauge", "{request}", VLLM_LABELS, RUNNING_FLOOR,
            "requests in the running batch"),
    _engine(VLLM, "vllm:kv_cache_usage_perc", "gauge", "1", VLLM_LABELS, 0.05,
            "share of the KV cache in use, 0..1 despite its name (vLLM 0.9.2 and later)"),
    _engine(VLLM, "vllm:gpu_cache_usage_perc", "gauge", "1", VLLM_LABELS, 0.05,
            "share of the GPU KV cache in use, 0..1 (before vLLM 0.9.2, which renamed it vllm:kv_cache_usage_perc)"),
    _engine(VLLM, "vllm:num_preemptions_total", "counter", "{preemption}", VLLM_LABELS, PREEMPTION_FLOOR,
            "requests preempted (their KV cache given up, to be recomputed) for lack of KV cache"),
    # Prompt work takes steps from decoding: more of it slows every running request's tokens.
    _engine(VLLM, "vllm:prompt_tokens_total", "counter", "{token}", VLLM_LABELS, PROMPT_TOKENS_FLOOR,
            "prompt tokens processed (prefill throughput)"),
    # An engine that slows emits fewer tokens, as interconnect bytes fall when a link is contended.
    _engine(VLLM, "vllm:generation_tokens_total", "counter", "{token}", VLLM_LABELS, GENERATION_TOKENS_FLOOR,
            "output tokens generated (decode throughput)", harmful="down"),
    _engine(SGLANG, "sglang:time_to_first_token_seconds", "histogram", "s", SGLANG_LABELS, FIRST_TOKEN_FLOOR_S,
            "time from a request's arrival to its first token"),
    _engine(SGLANG, "sglang:inter_token_latency_seconds", "histogram", "s", SGLANG_LABELS, PER_TOKEN_FLOOR_S,
            "time between two output tokens of a request"),
    _engine(SGLANG, "sglang:time_per_output_token_seconds", "histogram", "s", SGLANG_LABELS, PER_TOKEN_FLOOR_S,
            "time between two output tokens of a request (older SGLang; now sglang:inter_token_latency_seconds)"),
    _engine(SGLANG, "sglang:queue_time_seconds", "histogram", "s", SGLANG_SCHEDULER_LABELS, FIRST_TOKEN_FLOOR_S,
            "time a request waited in the scheduler's queue"),
    _engine(SGLANG, "sglang:e2e_request_latency_seconds", "histogram", "s", SGLANG_LABELS, WHOLE_REQUEST_FLOOR_S,
            "time from a request's arrival to its last token"),
    _engine(SGLANG, "sglang:num_queue_reqs", "gauge", "{request}", SGLANG_SCHEDULER_LABELS, WAITING_FLOOR,
            "requests waiting in the scheduler's queue"),
    _engine(SGLANG, "sglang:num_running_reqs", "gauge", "{request}", SGLANG_SCHEDULER_LABELS, RUNNING_FLOOR,
            "requests in the running batch"),
    _engine(SGLANG, "sglang:token_usage", "gauge", "1", SGLANG_SCHEDULER_LABELS, 0.05,
            "share of the KV cache's token slots in use, 0..1"),
    _engine(SGLANG, "sglang:num_retracted_requests_total", "counter", "{request}", SGLANG_SCHEDULER_LABELS,
            PREEMPTION_FLOOR, "requests retracted from the running batch (their KV cache given up) for lack of room"),
    _engine(SGLANG, "sglang:prompt_tokens_total", "counter", "{token}", SGLANG_LABELS, PROMPT_TOKENS_FLOOR,
            "prompt tokens processed (prefill throughput)"),
    _engine(SGLANG, "sglang:generation_tokens_total", "counter", "{token}", SGLANG_LABELS, GENERATION_TOKENS_FLOOR,
            "output tokens generated (decode throughput)", harmful="down"),
    _engine(TGI, "tgi_request_queue_duration", "histogram", "s", (), FIRST_TOKEN_FLOOR_S,
            "time a request waited in the router's queue"),
    # TGI's time per token is its inference time over the generated tokens, so it takes in the prefill.
    _engine(TGI, "tgi_request_mean_time_per_token_duration", "histogram", "s", (), PER_TOKEN_FLOOR_S,
            "a request's inference time over its generated tokens, prefill included"),
    _engine(TGI, "tgi_request_inference_duration", "histogram", "s", (), WHOLE_REQUEST_FLOOR_S,
            "time from a request's first batch to its last token"),
    _engine(TGI, "tgi_request_duration", "histogram", "s", (), WHOLE_REQUEST_FLOOR_S,
            "time from a request's arrival to its response"),
    _engine(TGI, "tgi_queue_size", "gauge", "{request}", (), WAITING_FLOOR, "requests waiting in the router's queue"),
    _engine(TGI, "tgi_batch_current_size", "gauge", "{request}", (), RUNNING_FLOOR, "requests in the running batch"),
    _engine(TRITON, "nv_inference_queue_duration_us", "counter", "us", TRITON_LABELS, TRITON_DURATION_FLOOR_US,
            "time requests waited in the scheduler's queue (cumulative microseconds)"),
    _engine(TRITON, "nv_inference_compute_input_duration_us", "counter", "us", TRITON_LABELS,
            TRITON_DURATION_FLOOR_US, "time spent taking in requests' input tensors (cumulative microseconds)"),
    _engine(TRITON, "nv_inference_compute_infer_duration_us", "counter", "us", TRITON_LABELS,
            TRITON_DURATION_FLOOR_US, "time spent running the model (cumulative microseconds)"),
    _engine(TRITON, "nv_inference_compute_output_duration_us", "counter", "us", TRITON_LABELS,
            TRITON_DURATION_FLOOR_US, "time spent writing requests' output tensors (cumulative microseconds)"),
    _engine(TRITON, "nv_inference_request_duration_us", "counter", "us", TRITON_LABELS, TRITON_DURATION_FLOOR_US,
            "time from a request's arrival to its response (cumulative microseconds)"),
    # Served work, as the generation tokens above: a server that slows completes fewer.
    _engine(TRITON, "nv_inference_count", "counter", "{inference}", TRITON_LABELS, 1.0,
            "inferences performed (a batch of n counts n)", harmful="down"),
    _engine(TRITON, "nv_inference_request_success", "counter", "{request}", TRITON_LABELS, 1.0,
            "requests served successfully", harmful="down"),
    _engine(TRITON, "nv_inference_pending_request_count", "gauge", "{request}", TRITON_LABELS, WAITING_FLOOR,
            "requests received and not yet executing"),
    # --- the GenAI semantic conventions' server metrics, from an instrumented inference server's SDK ---
    _genai("gen_ai.server.time_to_first_token", FIRST_TOKEN_FLOOR_S,
           "time to a successful response's first token"),
    _genai("gen_ai.server.time_per_output_token", PER_TOKEN_FLOOR_S,
           "a request's time after its first token over its output tokens after the first"),
    _genai("gen_ai.server.request.duration", WHOLE_REQUEST_FLOOR_S, "time to a request's last output token",
           labels=(*GENAI_LABELS, "error.type")),
    # --- derived from the requests (INFERENCE_LOAD) ---
    _signal(INFERENCE_LOAD["arrivals"], "gauge", "{request}/s", [SERVICE_ATTRIBUTE], _FROM_REQUESTS, noise_floor=1.0,
            description="requests arriving at an inference service, per second", producer=REQUESTS),
    _signal(INFERENCE_LOAD["prompt_tokens"], "gauge", "{token}/s", [SERVICE_ATTRIBUTE], _FROM_REQUESTS,
            noise_floor=PROMPT_TOKENS_FLOOR, description="prompt tokens arriving at an inference service, per second",
            producer=REQUESTS),
    _signal(INFERENCE_LOAD["queue_s"], "gauge", "s", [SERVICE_ATTRIBUTE], _FROM_REQUESTS,
            noise_floor=FIRST_TOKEN_FLOOR_S, description="the mean time its requests waited in the engine's queue",
            producer=REQUESTS),
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
