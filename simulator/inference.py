"""Token-level traffic of vLLM-like inference replicas (`sloscope simulate --inference`): one `vllm` service per
node whose engine admits requests into a bounded batch, prefills their prompts and decodes their answers, writing
one SERVER span per request with vLLM's token timings and, every second, its engine's gauges and counters.

Why an engine model rather than drawn latencies: the causes sloscope tells apart are mechanisms of that engine
(requests queue when the batch is full, decode steps slow with the batch's size and with prompts prefilled beside
them, a KV cache that fills preempts sequences), so each fault changes one input of the engine (arrivals, prompt
lengths, KV capacity, prefill and decode speed) and the telemetry follows from it, as it would on a real server.
Answers are 20 to 2,000 tokens long (log-uniform): a healthy request's end-to-end time varies a hundredfold while
its time per output token does not, which is what token SLOs are for.

The node's own signals (GPUs, kernel, storage) come from simulator/signals.py, with the physical faults bent by
simulator/planning.py as for a flat fleet and innocent blips on the other nodes (simulator/blips.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sloscope.simulator import faults, otlp_json, planning
from sloscope.simulator.signals import Counter, Gauge, NodeSeries

SERVICE = "vllm"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROUTE = "/v1/chat/completions"
TIER_SHARES = (("chat", 0.7), ("batch", 0.3))
DEFAULT_NODES = 3
DEFAULT_RATE = 4.0  # requests per second per replica: about 40 % of what its batch serves
SPEC_FILE = "slo.yaml"
# The objectives the traffic is made for: a healthy replica keeps them with a wide margin at any output length.
SPEC = """\
default_tier: chat
resolution: 10s
tiers:
  chat:
    latency: {percentile: 99, threshold_ms: 180000}
    availability: 99.9
    ttft: {percentile: 95, threshold_ms: 1000}
    tpot: {percentile: 95, threshold_ms: 50}
    queue: {percentile: 99, threshold_ms: 1000}
  batch:
    latency: {percentile: 95, threshold_ms: 300000}
    availability: 99.5
    ttft: {percentile: 90, threshold_ms: 3000}
    tpot: {percentile: 90, threshold_ms: 70}
    queue: {percentile: 95, threshold_ms: 5000}
"""
# What each fault changes, and the cause an analysis should name for it.
ENGINE_FAULTS = {"load_surge": "inference_queue", "kv_cache_pressure": "kv_cache_pressure",
                 "long_prompts": "prefill_interference"}
PHYSICAL_FAULTS = ("gpu_sm_contention", "cpu_contention")
FAULT_KINDS = (*ENGINE_FAULTS, *PHYSICAL_FAULTS)
EXPECTED_CAUSE = {**ENGINE_FAULTS, **{k: k for k in PHYSICAL_FAULTS}}
SURGE = 3.0  # load_surge: arrivals times this
LONG_PROMPTS = 3.0  # long_prompts: prompt tokens times this
KV_LEFT = 0.06  # kv_cache_pressure: the share of the KV cache left (a co-located model took the memory)
# A physical fault's effect on the engine at full strength: (prefill, decode) time multipliers.
PHYSICAL_SLOWDOWN = {"gpu_sm_contention": (3.0, 2.0), "cpu_contention": (1.6, 1.7)}
ENGINE_RAMP_S = 5.0


@dataclass(frozen=True)
class Engine:
    """One replica's speeds and limits (an 8B model on one H100, roughly)."""

    max_seqs: int = 128  # vLLM's max_num_seqs: the batch's bound; beyond it requests wait
    kv_tokens: int = 400_000  # KV cache capacity in tokens: 128 KiB each, in the ~52 GB the weights leave
    watermark: float = 0.95  # admit only while the cache stays below this share
    step_s: float = 0.018  # one decode step of a lone sequence
    batch_slowdown: float = 0.6  # a full batch's step is this much longer
    prefill_base_s: float = 0.03
    prefill_per_token_s: float = 8e-5
    prefill_ref_tokens: float = 4000.0  # prompt tokens prefilled per second that double a decode step
    gpu_busy_per_seq: float = 0.3  # kernel-busy share a full batch adds over an empty one


ENGINE = Engine()


@dataclass
class Inputs:
    """Per-second inputs of one replica's engine: what a fault changes."""

    arrivals: np.ndarray  # requests per second
    prompt: np.ndarray  # prompt-length multiplier
    kv: np.ndarray  # share of the KV cache available
    prefill: np.ndarray  # prefill-time multiplier
    decode: np.ndarray  # decode-step multiplier


@dataclass
class Requests:
    """One replica's requests, finished ones only (a span is written when its request ends)."""

    arrival: np.ndarray  # seconds into the run
    tier: np.ndarray  # index into TIER_SHARES
    prompt: np.ndarray
    output: np.ndarray
    queue: np.ndarray  # seconds
    ttft: np.ndarray
    decode: np.ndarray
    ids: np.ndarray  # request ids, unique in the run


@dataclass
class EngineSeries:
    waiting: np.ndarray
    running: np.ndarray
    kv_usage: np.ndarray
    preemptions: np.ndarray  # per second


@dataclass
class InferencePlan:
    """What the renderer writes for every node: its requests."""

    seed: int
    start_ns: int
    flush: int
    requests: list  # Requests per node
    bursts: dict  # none: kept for the ground truth's shape


def healthy_inputs(rng: np.random.Generator, n: int, rate: float) -> Inputs:
    """Arrivals that drift a little (+-10 % over tens of minutes), everything else at its healthy level."""
    t = np.arange(n, dtype=np.float64)
    drift = 1.0 + 0.1 * np.sin(2 * math.pi * t / rng.uniform(1800, 5400) + rng.uniform(0, 2 * math.pi))
    ones = np.ones(n)
    return Inputs(rate * drift, ones.copy(), ones.copy(), ones.copy(), ones.copy())


def apply_fault(inputs: Inputs, kind: str, p: np.ndarray) -> None:
    """Change the engine input the fault kind changes, by profile `p` (0..1)."""
    if kind == "load_surge":
        inputs.arrivals *= 1.0 + (SURGE - 1.0) * p
    elif kind == "long_prompts":
        inputs.prompt *= 1.0 + (LONG_PROMPTS - 1.0) * p
    elif kind == "kv_cache_pressure":
        inputs.kv *= 1.0 - (1.0 - KV_LEFT) * p
    else:
        prefill, decode = PHYSICAL_SLOWDOWN[kind]
        inputs.prefill *= 1.0 + (prefill - 1.0) * p
        inputs.decode *= 1.0 + (decode - 1.0) * p


def draw_requests(rng: np.random.Generator, inputs: Inputs) -> tuple:
    """Poisson arrivals; prompts lognormal (median 250 tokens), answers log-uniform over 20..2,000 tokens."""
    counts = rng.poisson(inputs.arrivals)
    second = np.repeat(np.arange(len(counts)), counts)
    arrival = np.sort(second + rng.random(len(second)))
    total = len(arrival)
    tier = (rng.random(total) >= TIER_SHARES[0][1]).astype(np.int64)
    prompt = np.clip(np.round(250 * np.exp(0.6 * rng.standard_normal(total)) * inputs.prompt[second]), 16, 32000)
    output = np.round(10 ** rng.uniform(math.log10(20), math.log10(2000), total))
    return arrival, tier, prompt.astype(np.int64), output.astype(np.int64)


def run_engine(rng: np.random.Generator, inputs: Inputs, engine: Engine = ENGINE) -> tuple[Requests, EngineSeries]:
    """Second by second: admit waiting requests while the batch and the KV cache have room, prefill them, decode
    every running sequence one step per `step` seconds, and preempt the newest sequences where the cache
    overflows (vLLM's recompute: they wait again and are prefilled anew, their answer so far kept)."""
    n = len(inputs.arrivals)
    arrival, tier, prompt, output = draw_requests(rng, inputs)
    total = len(arrival)
    admitted = np.full(total, np.nan)  # the first admission
    first = np.full(total, np.nan)  # the first token
    finish = np.full(total, np.nan)
    start = np.zeros(total)  # when the current decode stint starts (after its prefill)
    generated = np.zeros(total)
    waiting: deque = deque()
    running: list = []
    series = EngineSeries(*(np.zeros(n) for _ in range(4)))
    nxt = 0
    for t in range(n):
        while nxt < total and arrival[nxt] < t + 1:
            waiting.append(nxt)
            nxt += 1
        capacity = engine.kv_tokens * inputs.kv[t]
        used = float(sum(prompt[r] + generated[r] for r in running))
        prefilled = 0.0
        while waiting and len(running) < engine.max_seqs:
            r = waiting[0]
            need = prompt[r] + generated[r]
            if used + need > engine.watermark * capacity:
                break
            waiting.popleft()
            # a request that found room is scheduled within a step; one that waited, once room freed this second
            at = arrival[r] + rng.uniform(0.002, 0.02) if arrival[r] >= t else t + rng.uniform(0.0, 1.0)
            prefill = (engine.prefill_base_s + need * engine.prefill_per_token_s) * inputs.prefill[t] * \
                (1.0 + 0.3 * len(running) / engine.max_seqs)
            start[r] = at + prefill
            if np.isnan(admitted[r]):
                admitted[r], first[r] = at, at + prefill
            running.append(r)
            used += need
            prefilled += need
        step = engine.step_s * inputs.decode[t] * (1.0 + engine.batch_slowdown * len(running) / engine.max_seqs) * \
            (1.0 + prefilled / engine.prefill_ref_tokens)
        still = []
        for r in running:
            begin = max(float(t), start[r])
            tokens = max(t + 1 - begin, 0.0) / step
            left = output[r] - 1 - generated[r]
            if tokens >= left:
                finish[r] = begin + left * step
                continue
            generated[r] += tokens
            still.append(r)
        running = still
        used = float(sum(prompt[r] + generated[r] for r in running))
        while used > capacity and running:
            r = running.pop()
            used -= prompt[r] + generated[r]
            waiting.appendleft(r)
            series.preemptions[t] += 1
        series.waiting[t], series.running[t], series.kv_usage[t] = len(waiting), len(running), used / capacity
    done = np.isfinite(finish)
    return Requests(arrival[done], tier[done], prompt[done], output[done], (admitted - arrival)[done],
                    (first - arrival)[done], (finish - first)[done], np.flatnonzero(done)), series


def engine_series(node: NodeSeries, seed: int, s: EngineSeries) -> list:
    """The engine's gauges and its preemption counter, as vLLM's Prometheus endpoint gives them."""
    attrs = (("model_name", MODEL), ("engine", "0"))
    ids = iter(range(1, 5))
    sid = lambda: (seed, 40, node.index, next(ids))  # noqa: E731 - a series' entropy, as signals.build_node's
    return [Gauge("vllm:num_requests_waiting", attrs, sid(), values=s.waiting, decimals=0),
            Gauge("vllm:num_requests_running", attrs, sid(), values=s.running, decimals=0),
            Gauge("vllm:kv_cache_usage_perc", attrs, sid(), values=s.kv_usage, hi=1.0),
            Counter("vllm:num_preemptions_total", attrs, sid(), rate=s.preemptions, integer=True, cv=0.0)]


def couple_gpus(node: NodeSeries, running: np.ndarray, engine: Engine = ENGINE) -> None:
    """A bigger batch keeps the GPUs busier: their busy shares follow the running sequences' deviation from the
    run's median, so that load shows on the GPU as it does on a real server (and is load, not contention)."""
    delta = engine.gpu_busy_per_seq * (running - np.median(running)) / engine.max_seqs
    for name in ("sloscope.gpu.kernel.busy.max", "hw.gpu.utilization", "sloscope.gpu.sm.active"):
        for series in node.find(name):
            faults.shift(series, delta, 1.0)


def plan_node(seed: int, node: NodeSeries, n: int, rate: float, fault: tuple | None) -> Requests:
    """Run one replica's engine (with `fault` = (kind, profile) on the fault's node) and add its engine series
    to the node's."""
    rng = np.random.default_rng([seed, 41, node.index])
    inputs = healthy_inputs(rng, n, rate)
    if fault is not None:
        apply_fault(inputs, *fault)
    requests, series = run_engine(rng, inputs)
    requests.ids = requests.ids + (node.index << 40)
    couple_gpus(node, series.running)
    node.series.extend(engine_series(node, seed, series))
    return requests


def inject(run: planning.Run, kind: str, fault_node: int, onset: int, duration_s: float,
           frng: np.random.Generator) -> tuple[dict, np.ndarray]:
    """The fault's truth and the profile of its effect on the engine. A physical fault bends its node's evidence
    first (planning.node_fault) and slows the engine once requests feel it; an engine fault changes only the
    engine's inputs, and its evidence is what the engine shows."""
    duration = planning.fault_window(run.n, onset, duration_s)
    truth = {"cause": EXPECTED_CAUSE[kind], "kind": kind, "layer": "inference", "node": run.names[fault_node]}
    lag = 0
    if kind in PHYSICAL_FAULTS:
        nf = planning.node_fault(run, kind, fault_node, onset, duration, frng)
        lag = nf.lag
        truth.update(layer="physical", **nf.target, evidence=faults.describe_series([s for s, _ in nf.evidence]),
                     reference_score=round(nf.score, 2))
    truth.update(onset=run.at(onset), end=run.at(onset + duration), sli_onset=run.at(onset + lag))
    return truth, faults.profile(run.n, onset + lag, ENGINE_RAMP_S, onset + duration + lag)


# ------------------------------------------------------------------------------------------------ spans

SPAN_TMPL = ('{"traceId":"%032x","spanId":"%016x","name":"POST ' + ROUTE + '","kind":2,"startTimeUnixNano":"%d",'
             '"endTimeUnixNano":"%d","attributes":[%s],"status":{"code":0}}')
STATIC_ATTRS = otlp_json.attributes([("http.request.method", "POST"), ("http.route", ROUTE),
                                     ("http.response.status_code", 200), ("gen_ai.response.model", MODEL)])[1:-1]
TIER_ATTRS = [otlp_json.attribute("http.request.header.x-slo-tier", [name]) for name, _ in TIER_SHARES]


def span_heads(names: list, pods: list) -> list:
    return [otlp_json.traces_resource_head([
        ("service.name", SERVICE), ("service.namespace", "inference"), ("host.name", nm), ("k8s.node.name", nm),
        ("k8s.namespace.name", "inference"), ("k8s.pod.name", pod)], scope="vllm") for nm, pod in zip(names, pods)]


def _span(plan: InferencePlan, r: Requests, k: int) -> str:
    start = plan.start_ns + int(r.arrival[k] * 1e9)
    end = start + int((r.ttft[k] + r.decode[k]) * 1e9)
    token_attrs = otlp_json.attributes([
        ("gen_ai.usage.prompt_tokens", int(r.prompt[k])), ("gen_ai.usage.completion_tokens", int(r.output[k])),
        ("gen_ai.latency.time_in_queue", round(float(r.queue[k]), 6)),
        ("gen_ai.latency.time_to_first_token", round(float(r.ttft[k]), 6)),
        ("gen_ai.latency.time_in_model_decode", round(float(r.decode[k]), 6))])[1:-1]
    ident = (plan.seed << 64) ^ int(r.ids[k])
    return SPAN_TMPL % (ident, int(r.ids[k]) & (2**64 - 1) | 1 << 62, start, end,
                        ",".join((STATIC_ATTRS, TIER_ATTRS[r.tier[k]], token_attrs)))


def chunk_spans(plan: InferencePlan, heads: list, a: int, b: int, intervals: range, stats: dict) -> dict:
    """Trace lines of the requests that arrived in [a, b), one line per flush interval with every node's."""
    lines: dict = {j: [] for j in intervals}
    for i, r in enumerate(plan.requests):
        lo, hi = np.searchsorted(r.arrival, [a, b])
        by_interval: dict = {}
        for k in range(lo, hi):
            by_interval.setdefault(int(r.arrival[k]) // plan.flush, []).append(_span(plan, r, k))
        stats["server_spans"] += int(hi - lo)
        for j, spans in by_interval.items():
            lines[j].append('{"resourceSpans":[' + heads[i] + ",".join(spans) + otlp_json.TRACES_RESOURCE_TAIL +
                            "]}")
    return lines
