"""What reading an inference request's token timings costs the intake (docs/inference.md): vLLM's llm_request
SERVER spans, each with its seven gen_ai.* latency and usage attributes (TTFT, queue, prefill, decode and
end-to-end times in seconds, prompt and completion tokens, as vLLM writes them), against the same number of the
plain SERVER spans benchmarks/ingest_throughput.py sends (five HTTP attributes), in alternating rounds through `sloscope serve --ack log`, as
benchmarks/ingest_throughput.py runs it: spans/s of each, their ratio (target >= 0.9), and the bytes the store's
file takes per span.

    .venv/bin/python benchmarks/ingest_tokens.py [--spans 300000] [--per-request 1000] [--rounds 3] [--clients 10]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path
from statistics import median

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_throughput import T0, _kv, end_to_end, trace_payloads  # noqa: E402


def _seconds(key: str, value: float) -> KeyValue:
    kv = KeyValue(key=key)
    kv.value.double_value = value
    return kv


def token_payloads(total: int, per_request: int) -> list[bytes]:
    """vLLM's llm_request spans (vllm/v1/engine/output_processor.py's attributes), one resource per replica."""
    rng = random.Random(3)
    payloads, n = [], 0
    while n < total:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([_kv("service.name", "vllm"), _kv("host.name", f"gpu-node-{n % 16}"),
                                       _kv("k8s.pod.name", "vllm-7f9c"), _kv("k8s.namespace.name", "inference")])
        spans = rs.scope_spans.add().spans
        for _ in range(min(per_request, total - n)):
            n += 1
            start, queue, ttft = T0 + n * 1000, rng.uniform(0.001, 0.05), rng.uniform(0.05, 0.4)
            output = rng.randint(20, 2000)
            decode = output * rng.uniform(0.015, 0.03)
            span = spans.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="llm_request",
                             kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start,
                             end_time_unix_nano=start + int((ttft + decode) * 1e9) + 1_000_000)
            span.attributes.extend([
                _kv("gen_ai.request.id", f"cmpl-{n}"), _kv("gen_ai.usage.prompt_tokens", rng.randint(50, 4000)),
                _kv("gen_ai.usage.completion_tokens", output), _seconds("gen_ai.latency.time_in_queue", queue),
                _seconds("gen_ai.latency.time_to_first_token", ttft),
                _seconds("gen_ai.latency.time_in_model_prefill", ttft - queue),
                _seconds("gen_ai.latency.time_in_model_decode", decode), _seconds("gen_ai.latency.e2e", ttft + decode),
                _kv("http.request.header.x-slo-tier", rng.choice(["standard", "p99-latency-critical"]))])
        payloads.append(req.SerializeToString())
    return payloads


def token_round(plain: list[bytes], tokens: list[bytes], args, workdir: Path) -> dict:
    """Spans/s and stored bytes per span of each shape, through serve with --ack log."""
    out = {}
    for name, payloads in (("plain", plain), ("tokens", tokens)):
        rate, rows, _, _, size = end_to_end("/v1/traces", payloads, args.spans, ("requests",), args.clients, workdir,
                                            ("--ack", "log"))
        out[name] = (rate, size / rows)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=300_000, help="spans per shape per round")
    parser.add_argument("--per-request", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain, tokens = trace_payloads(args.spans, args.per_request), token_payloads(args.spans, args.per_request)
        print(f"request bytes per span: plain {sum(map(len, plain)) / args.spans:.0f}, "
              f"with token timings {sum(map(len, tokens)) / args.spans:.0f}")
        rounds = [token_round(plain, tokens, args, Path(tmp)) for _ in range(args.rounds)]
    ratios = [r["tokens"][0] / r["plain"][0] for r in rounds]
    for name, shape in (("plain", "plain SERVER spans"), ("tokens", "vLLM llm_request spans, token timings")):
        print(f"  {shape:<38} {median(r[name][0] for r in rounds):>11,.0f} spans/s, "
              f"{median(r[name][1] for r in rounds):.0f} bytes stored per span")
    print(f"  token timings read, against plain spans: ratio {median(ratios):.3f} (target >= 0.9; rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)})")
    print(f"({os.cpu_count()} CPUs; client, server and writer share them; {args.spans:,} spans per shape per round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
