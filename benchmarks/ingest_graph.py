"""What keeping every span kind costs the intake (docs/traces.md): traces of 5 to 10 spans of mixed kinds (an
entry SERVER span, CLIENT calls with the SERVER spans they reach, INTERNAL spans) against the same number of SERVER
spans alone (the shape of a fleet whose services send requests only), in alternating rounds through `sloscope
serve --ack log`, as benchmarks/ingest_throughput.py runs it: spans/s of each, their ratio, and the bytes the
store's file takes per span.

    .venv/bin/python benchmarks/ingest_graph.py [--spans 300000] [--per-request 1000] [--rounds 3] [--clients 10]
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
from opentelemetry.proto.trace.v1.trace_pb2 import Span

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_throughput import T0, _kv, end_to_end, trace_payloads  # noqa: E402


SERVICES = ("gateway", "router", "tokenizer", "retriever", "vector-db", "reranker", "llm", "kv-cache")


def graph_payloads(total: int, per_request: int) -> list[bytes]:
    """Traces of 5 to 10 spans: the entry's SERVER span (the tier header), then calls, each a CLIENT span in the
    caller and the SERVER span it reached in the callee, and now and then an INTERNAL span; one resource per
    service and node, as a node's collector batches them."""
    rng = random.Random(2)
    payloads, n = [], 0
    while n < total:
        req, by_place = ExportTraceServiceRequest(), {}
        while n < total and sum(len(s) for s in by_place.values()) < per_request:
            trace, start = rng.randbytes(16), T0 + n * 1000
            spans = _trace(rng, trace, start, min(rng.randint(5, 10), total - n))  # the last one fills up to total
            for service, node, span in spans:
                by_place.setdefault((service, node), []).append(span)
            n += len(spans)
        for (service, node), spans in by_place.items():
            rs = req.resource_spans.add()
            rs.resource.attributes.extend([_kv("service.name", service), _kv("host.name", node),
                                           _kv("k8s.pod.name", f"{service}-7f9c-{node[-1]}")])
            rs.scope_spans.add().spans.extend(spans)
        payloads.append(req.SerializeToString())
    return payloads


def _trace(rng: random.Random, trace: bytes, start: int, size: int) -> list[tuple[str, str, Span]]:
    """One trace of `size` spans: (service, node, span)."""
    def span(kind, parent: bytes, name: str, begin: int, ms: int, *attributes) -> Span:
        made = Span(trace_id=trace, span_id=rng.randbytes(8), parent_span_id=parent, name=name, kind=kind,
                    start_time_unix_nano=begin, end_time_unix_nano=begin + ms * 1_000_000)
        made.attributes.extend(attributes)
        return made

    node = f"gpu-node-{rng.randrange(16)}"
    entry = span(Span.SPAN_KIND_SERVER, b"", "POST /v1/chat/completions", start, rng.randint(50, 900),
                 _kv("http.route", "/v1/chat/completions"), _kv("http.response.status_code", 200),
                 _kv("http.request.header.x-slo-tier", rng.choice(["standard", "p99-latency-critical"])))
    out, caller = [(SERVICES[0], node, entry)], (SERVICES[0], node, entry)
    while len(out) < size:
        if size - len(out) == 1:
            out.append((SERVICES[0], node, span(Span.SPAN_KIND_INTERNAL, entry.span_id, "render", start, 2)))
            break
        callee, callee_node = rng.choice(SERVICES[1:]), f"gpu-node-{rng.randrange(16)}"
        call = span(Span.SPAN_KIND_CLIENT, caller[2].span_id, "POST", start + 1000, 20, _kv("peer.service", callee),
                    _kv("server.address", f"{callee}.inference.svc"))
        served = span(Span.SPAN_KIND_SERVER, call.span_id, "POST /", start + 200_000, 19,
                      _kv("http.response.status_code", 200), _kv("http.route", "/"))
        out += [(caller[0], caller[1], call), (callee, callee_node, served)]
        caller = (callee, callee_node, served)
    return out


def graph_round(server_only: list[bytes], graph: list[bytes], args, workdir: Path) -> dict:
    """Spans/s and stored bytes per span of each shape, through serve with --ack log."""
    out = {}
    for name, payloads, tables in (("server", server_only, ("requests",)), ("graph", graph, ("requests", "spans"))):
        rate, rows, _, _, size = end_to_end("/v1/traces", payloads, args.spans, tables, args.clients, workdir,
                                            ("--ack", "log"))
        out[name] = (rate, size / rows)
    return out


def graph_report(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server_only, graph = trace_payloads(args.spans, args.per_request), graph_payloads(args.spans, args.per_request)
        rounds = [graph_round(server_only, graph, args, Path(tmp)) for _ in range(args.rounds)]
    ratios = [r["graph"][0] / r["server"][0] for r in rounds]
    for name, shape in (("server", "SERVER spans only"), ("graph", "traces of 5-10 spans, mixed kinds")):
        print(f"  {shape:<36} {median(r[name][0] for r in rounds):>11,.0f} spans/s, "
              f"{median(r[name][1] for r in rounds):.0f} bytes stored per span")
    print(f"  every span kept, against SERVER spans only: ratio {median(ratios):.3f} (target >= 0.8; rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)})")
    print(f"({os.cpu_count()} CPUs; client, server and writer share them; {args.spans:,} spans per shape per round)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=300_000, help="spans per shape per round")
    parser.add_argument("--per-request", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    graph_report(parser.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
