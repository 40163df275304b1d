"""A small vLLM-shaped inference service for the tests, as OTLP/JSON export requests: its llm_request SERVER spans
with token timings, and its engine's and node's metrics every 10 s, healthy or changed from FAULT_AT on."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from tests.otlp_builders import counter, gauge, metrics, span, traces

T0 = datetime(2026, 12, 1, 10, 0, 0)
MINUTES = 15
FAULT_AT = timedelta(minutes=10)
NODE, SERVICE, POD = "gpu-node-1", "vllm", "vllm-0"
SPEC = """\
default_tier: standard
tiers:
  chat:
    latency: {percentile: 99, threshold_ms: 120000}
    availability: 99.9
    ttft: {percentile: 95, threshold_ms: 400}
    tpot: {percentile: 95, threshold_ms: 40}
    queue: {percentile: 99, threshold_ms: 300}
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
"""
EPOCH_NS = int((T0 - datetime(1970, 1, 1)).total_seconds() * 1e9)


@dataclass(frozen=True)
class Change:
    """What changes from FAULT_AT on (1.0: nothing)."""

    ttft: float = 1.0  # the first token's time (a slower prefill)
    tpot: float = 1.0  # each further token's time (a slower decode)
    arrivals: float = 1.0  # requests per second (load)
    prompt: float = 1.0  # prompt tokens per request (long prompts)
    queue_s: float = 0.0  # added time in the engine's queue
    gpu_busy: float = 0.0  # added to the GPU's kernel-busy share
    kv_cache: float = 0.0  # added to the KV cache's usage
    preemptions_per_s: float = 0.0


HEALTHY = Change()
RATE = 5  # requests per second


def requests(change: Change = HEALTHY, seed: int = 5) -> list[dict]:
    """Five chat requests a second (times `arrivals` once changed) for MINUTES; answers of 20 to 2,000 tokens
    (log-uniform), TTFT about 150 ms and TPOT about 20 ms."""
    rng, lines, n = random.Random(seed), [], 0
    for second in range(MINUTES * 60):
        changed = second >= FAULT_AT.total_seconds()
        c = change if changed else HEALTHY
        count = RATE * c.arrivals
        count = int(count) + (rng.random() < count - int(count))
        spans = []
        for k in range(count):
            n += 1
            output = int(round(10 ** rng.uniform(1.3, 3.3)))
            queue = rng.uniform(0.001, 0.02) + c.queue_s
            ttft = rng.gauss(0.15, 0.03) * c.ttft + queue
            tpot = max(rng.gauss(0.02, 0.003) * c.tpot, 0.001)
            decode = tpot * (output - 1)
            attrs = {"gen_ai.response.model": "llama", "gen_ai.usage.prompt_tokens": int(rng.randint(50, 800) * c.prompt),
                     "gen_ai.usage.completion_tokens": output, "gen_ai.latency.time_in_queue": queue,
                     "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.time_in_model_decode": decode}
            start = EPOCH_NS + second * 10**9 + int(k * 10**9 / count)
            spans.append(span(f"{n:032x}", f"{n:016x}", start, (ttft + decode) * 1e3 + 1.0, tier="chat",
                              extra=attrs))
        if spans:
            lines.append(traces(spans, service=SERVICE, node=NODE))
    return lines


def engine_metrics(change: Change = HEALTHY, seed: int = 6) -> list[dict]:
    """Every 10 s: the engine's waiting requests, KV cache usage and preemptions (cumulative), and the GPU's
    kernel-busy share, each with its healthy noise."""
    rng, lines, preempted = random.Random(seed), [], 0.0
    for tick in range(MINUTES * 6):
        changed = tick * 10 >= FAULT_AT.total_seconds()
        c = change if changed else HEALTHY
        at = EPOCH_NS + tick * 10 * 10**9
        waiting = max(rng.gauss(1.0, 0.7), 0.0) + (c.queue_s * RATE * c.arrivals)
        preempted += 10 * c.preemptions_per_s
        points = [gauge("vllm:num_requests_waiting", [(at, round(waiting))]),
                  gauge("vllm:kv_cache_usage_perc", [(at, min(rng.gauss(0.55, 0.03) + c.kv_cache, 1.0))]),
                  counter("vllm:num_preemptions_total", EPOCH_NS, [(at, int(preempted))]),
                  gauge("sloscope.gpu.kernel.busy.max", [(at, min(rng.gauss(0.45, 0.03) + c.gpu_busy, 1.0))],
                        attrs={"hw.id": "GPU-0"})]
        lines.append(metrics(points, node=NODE))
    return lines
