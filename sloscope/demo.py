"""`sloscope demo`: the main job end to end on the embedded default — simulate a small fleet with a fault,
ingest it into a DuckDB file, run rca, and show the incidents with their ranked causes next to the truth."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

DEFAULT_DIR = Path("var/demo")


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="simulate a fleet with a fault, ingest it, find and explain the incident",
        description="Runs the whole pipeline on the embedded default (a DuckDB file, no external service): "
        "simulates a small fleet with one injected fault, ingests its OTLP/JSON, runs rca, and prints the "
        "incidents and their ranked causes beside the injected ground truth. Starts from scratch each time.")
    demo.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="working directory (default: %(default)s)")
    demo.add_argument("--fault", default="gpu_sm_contention", help="taxonomy cause to inject (default: %(default)s)")
    demo.add_argument("--nodes", type=int, default=4, help="fleet size (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=1)
    demo.set_defaults(func=run)


def _step(message: str) -> float:
    print(f"==> {message}", file=sys.stderr, flush=True)
    return time.monotonic()


def run(args) -> int:
    from analytics.ingest import Ingestor
    from analytics.rca import analyse, format_table
    from analytics.store import Store
    from enrich.tiers import TierResolver
    from simulator.fleet import SimulationConfig, simulate
    from sloscope.slo_spec import load_spec

    started = time.monotonic()
    shutil.rmtree(args.dir, ignore_errors=True)
    otlp_dir, db_path = args.dir / "otlp", args.dir / "sloscope.duckdb"
    spec = load_spec(None)

    t = _step(f"simulating {args.nodes} nodes for 20 minutes with a {args.fault} fault -> {otlp_dir}")
    truth = simulate(SimulationConfig(out=otlp_dir, nodes=args.nodes, seed=args.seed, fault=args.fault))
    print(f"    {time.monotonic() - t:.1f}s", file=sys.stderr)

    t = _step(f"ingesting into {db_path}")
    with Store(db_path) as store:
        report = Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(otlp_dir.glob("*.jsonl*")))
    print(f"    {report.rows_loaded:,} rows in {report.seconds:.1f}s, {report.rejected_count} lines rejected",
          file=sys.stderr)

    t = _step("rca")
    with Store(db_path, read_only=True) as store:
        result = analyse(store, spec)
    (args.dir / "rca.json").write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))

    fault = truth.fault
    found = [i for i in result["incidents"] if i["node"] == fault["node"]]
    top = found[0]["causes"][0]["cause"] if found and found[0]["causes"] else "none"
    print(f"\ninjected: {fault['cause']} on {fault['node']} at {fault['onset']}; "
          f"sloscope's top cause there: {top} ({'right' if top == fault['cause'] else 'wrong'})")
    print(f"files: {args.dir}/rca.json (Contract 4 JSON), {db_path}, {otlp_dir}/ground_truth.json; "
          f"total {time.monotonic() - started:.1f}s")
    print(f"try: .venv/bin/sloscope rca --db {db_path} --format table")

    from dashboards.cli import build_files, write_report

    _step("report and dashboards")
    report = write_report(db_path, None, args.dir / "report.html")
    boards = build_files(spec, args.dir / "dashboards", "prometheus")
    print(f"report: {report['path']} ({report['incidents']} incident(s), {report['charts']} charts; open it in a "
          f"browser, it needs no network)")
    print(f"dashboards: {', '.join(str(b) for b in boards)} (Grafana JSON; provision them with "
          f".venv/bin/sloscope dashboards push --url URL)")
    return 0 if top == fault["cause"] else 1
