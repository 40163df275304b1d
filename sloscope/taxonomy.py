"""The cause taxonomy (docs/taxonomy.md): SLO layer -> intermediate signals -> physical cause.

Cause ids are fixed by contract. Each cause names the catalog signals (optionally narrowed to one attribute
value, e.g. PSI for the cpu resource only) whose harmful movement is evidence for it, and the remediation
that the alerting side maps it to.

Evidence is grouped by what it measures, and ranked within its measure (1 the strongest). sloscope's own probes
and the Collector's receivers often measure one thing twice (eBPF run-queue delay and hostmetrics' CPU
utilization); attribution reads, per measure, only the strongest rank that has a series on the node, so a weaker
duplicate neither adds to a cause's score nor replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from sloscope import catalog


@dataclass(frozen=True)
class Evidence:
    """One catalog signal from one producer, optionally restricted to data points whose attributes match `where`;
    ranked within its measure (1 the strongest)."""

    signal: str
    where: tuple[tuple[str, str], ...] = ()
    feature: str = "level"  # "level": the value itself; "growth": relative growth per minute
    producer: str = catalog.OWN  # who writes the series (catalog.PRODUCERS); declared signals: SPEC_PRODUCER
    measure: str = ""  # what it measures; a cause's evidence of one measure competes by rank
    rank: int = 1

    def matches(self, attributes: dict) -> bool:
        if not all(str(attributes.get(k)) == v for k, v in self.where):
            return False
        sig = catalog.BY_NAME.get(self.signal)
        return sig is None or self.producer == SPEC_PRODUCER or sig.producer_of(attributes).name == self.producer


@dataclass(frozen=True)
class Cause:
    id: str
    layer: str
    evidence: tuple[Evidence, ...]
    physical: str
    remediation: str  # formatted with node=
    seed_threshold: dict = field(default_factory=dict)  # signal -> absolute level that is harmful by itself
    # signal -> the level from which its movement is evidence at all: below it the signal moved within a harmless
    # range (a KV cache filling from a tenth to a third still has room, and preempts nothing)
    harmful_from: dict = field(default_factory=dict)
    # Causes whose movement explains this one's signals (they sit downstream of them): the score keeps only
    # what the best of those leaves unexplained.
    explained_by: tuple[str, ...] = ()
    # Every measure must have moved: the cause is as strong as its weakest measure's best series (load is more
    # arrivals *and* a queue that followed them; either alone is something else).
    requires_all: bool = False


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


def _ev(signal, rank=1, feature="level", producer=None, **where):
    """Evidence from `producer` (default: the signal's own definition's); the measure is set by _measure."""
    sig = catalog.signal(signal)  # fail at import on a name the catalog does not know
    producer = producer or sig.producers[0].name
    assert producer in {p.name for p in sig.producers}, (signal, producer)
    return Evidence(signal, tuple((k.replace("__", "."), v) for k, v in sorted(where.items())), feature, producer,
                    rank=rank)


def _measure(name: str, *evidence: Evidence) -> tuple[Evidence, ...]:
    """One measure's evidence, strongest first."""
    ranked = tuple(sorted((replace(ev, measure=name) for ev in evidence), key=lambda ev: ev.rank))
    assert ranked[0].rank == 1, name
    return ranked


def by_measure(evidence: tuple[Evidence, ...]) -> dict[str, list[Evidence]]:
    """A cause's evidence per measure, strongest first."""
    out: dict[str, list[Evidence]] = {}
    for ev in evidence:
        out.setdefault(ev.measure, []).append(ev)
    return {m: sorted(evs, key=lambda ev: ev.rank) for m, evs in out.items()}


CAUSES: tuple[Cause, ...] = (
    # Kernel-busy time (NVML) says a kernel ran all the time; SM activity (DCGM) says how many SMs had work.
    # Either path's signal is evidence on its own; a node with both gives both. dcgm-exporter's own fields,
    # scraped by the Collector, count only where sloscope's probes do not run.
    # More requests keep a GPU busier: where a surge of arrivals explains it (inference_queue), it is load.
    Cause("gpu_sm_contention", "gpu",
          _measure("gpu.sm_busy", _ev("sloscope.gpu.kernel.busy.max"), _ev("sloscope.gpu.sm.active"),
                   _ev("hw.gpu.utilization"), _ev("DCGM_FI_PROF_SM_ACTIVE", 2), _ev("DCGM_FI_DEV_GPU_UTIL", 2)),
          "SM time-slice preemption, warp-scheduler contention (co-tenant kernels)",
          "shift new requests away from {node} (GPU saturated)", explained_by=("inference_queue",)),
    Cause("gpu_memory_bandwidth", "gpu",
          _measure("gpu.hbm_bandwidth", _ev("sloscope.gpu.dram.active"), _ev("DCGM_FI_PROF_DRAM_ACTIVE", 2)),
          "HBM channel arbitration / bandwidth saturation",
          "shift new requests away from {node} (HBM bandwidth saturated); check co-tenant memory-bound jobs",
          explained_by=("inference_queue",)),
    Cause("gpu_memory_leak", "gpu",
          _measure("gpu.framebuffer_growth", _ev("hw.gpu.memory.usage", feature="growth"),
                   _ev("DCGM_FI_DEV_FB_USED", 2, feature="growth")),
          "framebuffer leak (" + GPU_MEMORY_LEAK.text + ")",
          "restart the leaking inference workload on {node}"),
    Cause("gpu_interconnect", "gpu", _measure("gpu.interconnect_bytes", _ev("hw.gpu.io")),
          "NVLink / PCIe DMA contention",
          "move tensor-parallel peers on {node} off the contended NVLink/PCIe path"),
    Cause("gpu_thermal", "gpu",
          _measure("gpu.temperature", _ev("hw.gpu.temperature"), _ev("DCGM_FI_DEV_GPU_TEMP", 2)),
          "thermal throttling",
          "shift new requests away from {node} and check its cooling (GPU thermal throttling)",
          {"hw.gpu.temperature": 85.0, "DCGM_FI_DEV_GPU_TEMP": 85.0}),
    Cause("storage_queue", "storage",
          _measure("spdk.queue", _ev("spdk.bdev.io.wait"), _ev("spdk.bdev.queue_depth"), _ev("spdk.reactor.busy")),
          "NVMe queue congestion / reactor saturation",
          "throttle background I/O on {node}'s SPDK bdev (queue congestion)",
          {"spdk.bdev.io.wait": 0.005, "spdk.reactor.busy": 0.7}),
    Cause("storage_thermal", "storage", _measure("nvme.temperature", _ev("sloscope.nvme.temperature")),
          "NVMe thermal throttle (> 65 C)",
          "throttle the bdev on {node} to queue depth 32 (NVMe thermal throttle)",
          {"sloscope.nvme.temperature": 65.0}),
    # Block latency per request (eBPF) is the strongest; the device's busy time and time in operations, which
    # hostmetrics reads from the same /proc/diskstats, only where sloscope's probes do not run.
    Cause("disk_io", "storage",
          _measure("disk.wait", _ev("sloscope.block.io.duration"), _ev("system.disk.io_time"),
                   _ev("sloscope.pressure.stall", pressure__resource="io"),
                   _ev("system.disk.io_time", 2, producer=catalog.HOSTMETRICS), _ev("system.disk.operation_time", 2)),
          "kernel block-device latency",
          "move I/O-heavy co-tenants off {node}'s disk",
          # Under memory pressure the disk is busy reading back pages the kernel took away: an effect.
          explained_by=("memory_pressure",)),
    # Retransmits see loss anywhere on the path; interface errors and drops only this node's own.
    Cause("network_loss", "network",
          _measure("network.loss", _ev("sloscope.tcp.retransmits"), _ev("system.network.errors", 2),
                   _ev("system.network.dropped", 2)),
          "packet loss on the path",
          "drain traffic from {node}'s network path and check its link"),
    # The path's own delay: TCP's smoothed round-trip time. The calls' network gaps, which the traces give, are the
    # trace graph's evidence for it (analytics/localize.py). Loss raises round trips too: loss explains them away.
    Cause("network_latency", "network", _measure("network.rtt", _ev("sloscope.tcp.rtt")),
          "added latency on the path (a congested link, a traffic shaper, a longer route)",
          "check the network path to and from {node}: its calls' round trips grew with no loss",
          explained_by=("network_loss",)),
    Cause("connection_churn", "network",
          _measure("tcp.time_wait", _ev("system.network.connection.count", network__connection__state="time_wait"),
                   _ev("sloscope.tcp.state_transitions"), _ev("system.network.connections", 2, state="TIME_WAIT")),
          "connection exhaustion / short-lived connections",
          "enable connection pooling / keep-alive for clients of {node}"),
    # How long runnable work waits for a CPU (eBPF run-queue delay, PSI) is contention itself; the load average
    # and utilization only say the CPUs are crowded or busy, and a pod's usage says who keeps them busy. Only
    # the CPU states that take time from others count: user, system and a hypervisor's steal.
    Cause("cpu_contention", "cpu",
          _measure("cpu.wait", _ev("sloscope.cpu.runqueue.delay"),
                   _ev("sloscope.pressure.stall", pressure__resource="cpu"),
                   _ev("system.cpu.load_average.1m", 2),
                   _ev("system.cpu.utilization", 2, state="user"), _ev("system.cpu.utilization", 2, state="system"),
                   _ev("system.cpu.utilization", 2, state="steal"), _ev("k8s.node.cpu.usage", 2),
                   _ev("k8s.pod.cpu.usage", 3), _ev("container.cpu.usage", 3)),
          "CPU run-queue contention (noisy neighbour)",
          "move the noisy neighbour off {node} or pin the inference pods' CPUs",
          # an engine that tokenizes and schedules on the CPU keeps it busier under more arrivals: load
          explained_by=("inference_queue",)),
    # Stalls on memory and major faults are reclaim itself; memory in use and working sets only approach it.
    Cause("memory_pressure", "memory",
          _measure("memory.reclaim", _ev("sloscope.pressure.stall", pressure__resource="memory"),
                   _ev("system.paging.faults", system__paging__type="major"),
                   _ev("system.paging.faults", 2, producer=catalog.HOSTMETRICS, type="major"),
                   _ev("system.memory.utilization", 3, state="used"), _ev("k8s.node.memory.working_set", 3),
                   _ev("k8s.pod.memory.working_set", 4), _ev("container.memory.working_set", 4)),
          "reclaim / memory stalls",
          "evict or limit memory-hungry co-tenants on {node}"),
    Cause("syscall_overhead", "runtime", _measure("syscall.latency", _ev("sloscope.syscall.duration")),
          "slow syscall path (sandboxed runtimes, lock contention)",
          "check {node}'s container runtime and lock contention (slow syscalls)",
          # A syscall that waits for the disk, a CPU, memory reclaim or a lost packet is slow because of
          # them, not because of its own path.
          explained_by=("disk_io", "cpu_contention", "memory_pressure", "network_loss")),
    # --- the inference engine (docs/inference.md): its queue, its KV cache, its batches ---
    # Load, not a fault: arrivals grew and the engine's queue followed. An engine slowed by a fault under steady
    # arrivals queues too, but its arrivals did not move, and neither does this cause.
    Cause("inference_queue", "inference",
          _measure("inference.arrivals", _ev("sloscope.inference.arrivals"))
          + _measure("inference.queue", _ev("vllm:num_requests_waiting"), _ev("sglang:num_queue_reqs"),
                     _ev("tgi_queue_size"), _ev("nv_inference_pending_request_count"),
                     _ev("vllm:request_queue_time_seconds", 2), _ev("sglang:queue_time_seconds", 2),
                     _ev("tgi_request_queue_duration", 2), _ev("sloscope.inference.queue_time", 2)),
          "more requests than the engine's batches serve: they wait in its queue",
          "add replicas of the model server on {node} or lower its batch limit (max_num_seqs): its requests queue",
          requires_all=True),
    # A KV cache that fills preempts running sequences, which are recomputed later: every token slows. A surge of
    # arrivals fills it too, where more replicas are the fix.
    Cause("kv_cache_pressure", "inference",
          _measure("inference.kv_cache", _ev("vllm:kv_cache_usage_perc"), _ev("vllm:gpu_cache_usage_perc"),
                   _ev("sglang:token_usage"))
          + _measure("inference.preemptions", _ev("vllm:num_preemptions_total"),
                     _ev("sglang:num_retracted_requests_total")),
          "KV cache near full: running sequences are preempted and recomputed",
          "lower max_num_seqs (or max_model_len) of the model server on {node}, or move it to a GPU with more memory",
          {"vllm:kv_cache_usage_perc": 0.9, "vllm:gpu_cache_usage_perc": 0.9, "sglang:token_usage": 0.9},
          explained_by=("inference_queue",),
          harmful_from={"vllm:kv_cache_usage_perc": 0.8, "vllm:gpu_cache_usage_perc": 0.8, "sglang:token_usage": 0.8}),
    # Long prompts prefilled in the batches that decode: each decode step waits for their prefill. More arrivals
    # bring more prompt tokens too, which is load.
    Cause("prefill_interference", "inference",
          _measure("inference.prompt_load", _ev("sloscope.inference.prompt_tokens")),
          "long prompts prefilled beside decoding sequences: every decode step waits for them",
          "enable chunked prefill (or lower max_num_batched_tokens) on {node}'s model server, or route long "
          "prompts to replicas of their own",
          explained_by=("inference_queue",)),
)

BY_ID: dict[str, Cause] = {c.id: c for c in CAUSES}
CAUSE_IDS: tuple[str, ...] = tuple(BY_ID)
assert all(other in BY_ID for c in CAUSES for other in c.explained_by)

# Not a physical cause: the verdict where a service's own time or failures grew and no physical signal explains it
# (analytics/localize.py): its own code or configuration.
APPLICATION = "application"

SPEC_PRODUCER = "slo_spec"  # the producer named for a metric the SLO spec declares as evidence


@dataclass(frozen=True)
class DeclaredSignal:
    """A metric outside the catalog that an SLO spec declares as evidence: how attribution reads it."""

    name: str
    harmful: catalog.Direction
    noise_floor: float = 0.0


@dataclass(frozen=True)
class Taxonomy:
    """The causes an analysis ranks: the built-in ones, with what an SLO spec adds (causes of its own, and metrics
    declared as evidence for them or for built-in ones)."""

    causes: tuple[Cause, ...] = CAUSES
    signals: tuple[DeclaredSignal, ...] = ()

    @cached_property
    def by_id(self) -> dict[str, Cause]:
        return {c.id: c for c in self.causes}

    @cached_property
    def declared_metrics(self) -> frozenset[str]:
        """The metrics the decoders keep beside the catalog's."""
        return frozenset(s.name for s in self.signals)

    @cached_property
    def evidence_signals(self) -> tuple[str, ...]:
        """The metrics some cause reads as evidence (a growth feature reads its metric's level)."""
        return tuple(sorted({ev.signal for c in self.causes for ev in c.evidence}))

    @cached_property
    def growth_signals(self) -> tuple[str, ...]:
        return tuple(sorted({ev.signal for c in self.causes for ev in c.evidence if ev.feature == "growth"}))

    def with_seed_levels(self, levels: dict[str, float]) -> "Taxonomy":
        """The same causes, each seed threshold on a signal of `levels` set to its level there (an SLO spec's
        physical limits, so that the analysis calls harmful by itself what the alerts do)."""
        causes = tuple(replace(c, seed_threshold={s: levels.get(s, level) for s, level in c.seed_threshold.items()})
                       for c in self.causes)
        return Taxonomy(causes, self.signals)

    def reading(self, metric: str) -> tuple[catalog.Direction, float] | None:
        """(harmful direction, noise floor) of a catalog or declared signal; None for any other metric."""
        declared = next((s for s in self.signals if s.name == metric), None)
        if declared is not None:
            return declared.harmful, declared.noise_floor
        sig = catalog.BY_NAME.get(metric)
        return None if sig is None else (sig.harmful, sig.noise_floor)


BUILT_IN = Taxonomy()


def declared(new_causes: tuple[Cause, ...], evidence: tuple[tuple[str, Evidence, float | None], ...],
             signals: tuple[DeclaredSignal, ...]) -> Taxonomy:
    """The built-in taxonomy with `new_causes`, and each (cause id, evidence, seed threshold or None) added to its
    cause. The caller has checked the ids (slo_spec names the YAML line of anything wrong)."""
    causes = {**BY_ID, **{c.id: c for c in new_causes}}
    for cause_id, ev, threshold in evidence:
        cause = causes[cause_id]
        seeds = cause.seed_threshold if threshold is None else {**cause.seed_threshold, ev.signal: threshold}
        causes[cause_id] = replace(cause, evidence=cause.evidence + (ev,), seed_threshold=seeds)
    return Taxonomy(tuple(causes.values()), signals)
