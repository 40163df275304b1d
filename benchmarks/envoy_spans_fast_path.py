"""Envoy's spans (Istio sidecar format: 21 string tags, the status code as text, the node id to split) on the
receiver's trace paths, from bytes to frames: the C fast path and the general decoder, each as a ratio to the
baseline measured in the same run on the same bytes, the bare protobuf parse (ParseFromString alone).

    .venv/bin/python benchmarks/envoy_spans_fast_path.py [--spans 200000] [--per-request 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from sloscope.analytics.frames import Frames  # noqa: E402
from sloscope.enrich.tiers import TierResolver, resolve_tiers  # noqa: E402
from sloscope.receiver.server import Decoders, fast_decode  # noqa: E402
from tests.envoy_spans import SIDECAR, envoy_request  # noqa: E402


def to_frames(decode):
    """decode, then what the receiver does next: tiers resolved, the batch as frames."""
    resolver = TierResolver(frozenset({"standard", "p99-latency-critical"}), "standard")

    def frames(body: bytes) -> Frames:
        batch, _ = decode(body)
        resolve_tiers(batch.spans, resolver)
        return Frames.of(batch)

    return frames


def rate(decode, bodies: list[bytes], spans: int) -> float:
    started = time.perf_counter()
    for body in bodies:
        decode(body)
    return spans / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000, help="SERVER spans in all (each with a CLIENT span)")
    parser.add_argument("--per-request", type=int, default=1000)
    args = parser.parse_args()
    body = envoy_request(SIDECAR, spans=args.per_request).SerializeToString()
    bodies = [body] * max(1, args.spans // args.per_request)
    spans = len(bodies) * args.per_request
    assert fast_decode("traces", body, False) is not None, "the fast path declined Envoy's spans"
    decoders = Decoders()
    baseline = rate(lambda b: ExportTraceServiceRequest.FromString(b), bodies, spans)
    fast = rate(to_frames(lambda b: fast_decode("traces", b, False)), bodies, spans)
    general = rate(to_frames(lambda b: decoders.decode("traces", b, False)), bodies, spans)
    print(f"Envoy sidecar spans, {args.per_request} per request, {spans} in all")
    print(f"  protobuf parse alone (baseline): {baseline:12,.0f} spans/s")
    print(f"  fast path, bytes to frames:      {fast:12,.0f} spans/s  {fast / baseline:5.2f} x baseline")
    print(f"  general decoder, bytes to frames:{general:12,.0f} spans/s  {general / baseline:5.2f} x baseline")
    print(f"  fast path / general decoder:     {fast / general:5.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
