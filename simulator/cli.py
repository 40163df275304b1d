"""`sloscope simulate`: write a simulated fleet's OTLP-JSON metrics and spans plus its ground truth."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sloscope import taxonomy
from sloscope.arguments import Parser
from sloscope.durations import duration_argument

from sloscope.simulator import faults, inference, mesh
from sloscope.simulator.fleet import SimulationConfig, simulate

DEFAULT_SERVICES = ("llm-gateway", "embedder", "reranker")  # = simulator.traffic.DEFAULT_SERVICES


def _seconds(text: str) -> int:
    value = duration_argument(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: whole seconds only")
    return int(value)


def cause_argument(text: str) -> str:
    """A taxonomy cause id, as an argparse type (also the demo's --fault)."""
    if text in taxonomy.CAUSE_IDS:
        return text
    raise argparse.ArgumentTypeError(f"unknown cause {text!r}; choose one of: {', '.join(taxonomy.CAUSE_IDS)}")


def _fault(text: str) -> str:
    """A physical cause, a mesh's own fault, an inference fault, or none for a healthy control (which the fleet
    accepts is checked with --mesh or --inference known)."""
    known = (*mesh.fault_kinds(), *(k for k in inference.FAULT_KINDS if k not in mesh.fault_kinds()))
    if text == "none" or text in known:
        return text
    raise argparse.ArgumentTypeError(f"unknown fault {text!r}; choose one of: {', '.join(known)}")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="write a simulated GPU inference fleet (OTLP-JSON metrics + spans) with an optional injected fault; "
        "--mesh: a tree of services calling each other, as traces",
        description="Simulate a GPU inference fleet: every catalog signal on every node at 1 s resolution, "
        "request spans per service and SLO tier, and optionally one injected physical fault with its "
        "confounders. Writes metrics.jsonl.gz and traces.jsonl.gz (OTLP/JSON, one export request per line, "
        "as the OpenTelemetry Collector's file exporter writes) and ground_truth.json (what really happened; "
        "root-cause analysis must not read it). With --mesh, every node runs a few pods of a service mesh "
        "(gateway -> router -> {tokenizer, retriever -> {vector-db, reranker}, llm -> kv-cache}) and every "
        "request is one trace of SERVER, CLIENT and INTERNAL spans; the fault sits on one pod of a service at "
        "depth >= 2.",
        epilog="faults: the physical causes " + ", ".join(faults.PHYSICAL_CAUSES) + "; with --mesh also "
        "network_latency (calls to the pod slowed on the network), slow_handler (its code slower) and "
        "exceptions (its code failing); with --inference " + ", ".join(inference.FAULT_KINDS) + ". "
        "Durations: 90s, 20m, 1h, 1h30m. Examples: "
        "sloscope simulate --out /tmp/fleet --fault gpu_thermal --nodes 8 --duration 30m --seed 3; "
        "sloscope simulate --out /tmp/mesh --mesh --fault slow_handler --fault-service reranker; "
        "sloscope simulate --out /tmp/vllm --inference --fault load_surge --duration 18m --fault-at 12m",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (created)")
    p.add_argument("--nodes", type=int, default=None,
                   help="number of nodes, named gpu-node-1..N (default: 4, or "
                   f"{inference.DEFAULT_NODES} with --inference)")
    p.add_argument("--duration", type=_seconds, default=1200, help="run length (default: 20m)")
    p.add_argument("--start", default=None,
                   help="run start, RFC 3339 (default: now minus duration, truncated to the second)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed: the same seed and start give the same files (default: 0)")
    p.add_argument("--rate", type=float, default=None,
                   help="requests per second per service per node, before bursts; with --mesh, requests per second "
                   "entering the mesh per node (default: 10); with --inference, per replica (default: "
                   f"{inference.DEFAULT_RATE:g})")
    p.add_argument("--services", default=None,
                   help=f"comma-separated service names, without --mesh (default: {','.join(DEFAULT_SERVICES)})")
    p.add_argument("--mesh", action="store_true",
                   help="a service mesh: an entry service calling a tree of services whose pods are spread over the "
                   "nodes, each request one trace")
    p.add_argument("--inference", action="store_true",
                   help="one vLLM-like replica per node: token-level spans (TTFT, TPOT, queue, tokens; tiers chat and "
                   f"batch), engine metrics, and the spec of their token objectives written as {inference.SPEC_FILE}; "
                   f"default {inference.DEFAULT_NODES} nodes at {inference.DEFAULT_RATE:g} requests/s each")
    p.add_argument("--fault", type=_fault, default="none", metavar="FAULT",
                   help="fault to inject (listed below), or none for a healthy control (default: none)")
    p.add_argument("--fault-node", default=None,
                   help="node for the fault: name or 1-based number (default: drawn by seed); with --mesh, the node "
                   "of the fault's pod")
    p.add_argument("--fault-service", default=None,
                   help="with --mesh: the service whose pod has the fault (default: drawn among those at depth >= 2)")
    p.add_argument("--fault-at", type=_seconds, default=None,
                   help="fault onset as an offset into the run, 30 s to the run's length less 30 s (default: 60 %% "
                   "into a run shorter than 1000 s, else 10 min in or half-way, whichever is later)")
    p.add_argument("--fault-duration", type=_seconds, default=300, help="how long the fault lasts (default: 5m)")
    p.add_argument("--flush-interval", type=_seconds, default=10,
                   help="collector batching: one line per node per interval (default: 10s)")
    p.add_argument("--plain", action="store_true", help="write uncompressed .jsonl instead of .jsonl.gz")
    p.add_argument("--workers", type=int, default=None,
                   help="rendering processes (default: 1 for small runs, else up to 8 by CPU count)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if (args.mesh or args.inference) and args.services is not None:
        print("sloscope simulate: error: --services does not apply to --mesh or --inference, whose services are "
              "their own", file=sys.stderr)
        return 2
    nodes = args.nodes if args.nodes is not None else inference.DEFAULT_NODES if args.inference else 4
    rate = args.rate if args.rate is not None else inference.DEFAULT_RATE if args.inference else 10.0
    services = tuple(s.strip() for s in (args.services or ",".join(DEFAULT_SERVICES)).split(",") if s.strip())
    cfg = SimulationConfig(
        out=args.out, nodes=nodes, duration_s=args.duration, start=args.start, seed=args.seed,
        rate=rate, services=services, fault=None if args.fault == "none" else args.fault,
        fault_node=args.fault_node, fault_at_s=args.fault_at, fault_duration_s=args.fault_duration,
        flush_interval_s=args.flush_interval, compress=not args.plain, workers=args.workers, mesh=args.mesh,
        fault_service=args.fault_service, inference=args.inference,
    )
    t0 = time.monotonic()
    try:
        truth = simulate(cfg)
    except ValueError as e:
        print(f"sloscope simulate: error: {e}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - t0
    counts = truth.extra["counts"]
    files = truth.extra["files"]
    out = Path(args.out)
    print(f"simulated {len(truth.nodes)} nodes x {args.duration}s from {truth.start} in {elapsed:.1f}s",
          file=sys.stderr)
    print(f"  {out / files['metrics']}: {counts['metric_lines']} lines, {counts['data_points']} data points",
          file=sys.stderr)
    internal = f", {counts['internal_spans']} internal spans" if counts.get("internal_spans") else ""
    print(f"  {out / files['traces']}: {counts['trace_lines']} lines, {counts['server_spans']} server spans, "
          f"{counts['client_spans']} client spans{internal}", file=sys.stderr)
    if "topology" in truth.extra:
        topo = truth.extra["topology"]
        print(f"  mesh: {len(topo['services'])} services, {len(topo['pods'])} pods, entry {topo['entry']}",
              file=sys.stderr)
    if args.inference:
        print(f"  {out / inference.SPEC_FILE}: the SLO spec of the replicas' token objectives", file=sys.stderr)
    print(f"  {out / 'ground_truth.json'}", file=sys.stderr)
    if truth.fault:
        f = truth.fault
        where = f.get("hw.id") or f.get("spdk.bdev.name")
        pod = f" pod {f['pod']} ({f['service']})" if "pod" in f else ""
        kind = f" ({f['kind']})" if f.get("kind", f["cause"]) != f["cause"] else ""
        print(f"  fault: {f['cause']}{kind} on {f['node']}{' ' + where if where else ''}{pod} from {f['onset']} "
              f"to {f['end']} (SLI from {f['sli_onset']})", file=sys.stderr)
        if truth.effect:
            print(f"  effect confounder: {truth.effect['kind']} from {truth.effect['onset']}", file=sys.stderr)
    else:
        print("  fault: none (healthy control)", file=sys.stderr)
    if truth.fleet_wide:
        print(f"  fleet-wide confounder: {truth.fleet_wide['kind']} from {truth.fleet_wide['onset']}",
              file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = Parser(prog="simulate")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["simulate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
