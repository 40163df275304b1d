"""`sloscope demo`: the main job end to end on the embedded default.

Live (`--live`; what `sloscope demo` runs when it can: as root with eBPF and the fault tools available):
`sloscope serve`, `sloscope collect` with the kernel probes, an instrumented service under two-tier load, and
real faults one at a time (live/), each attributed and scored against what was injected.
Simulated (`--simulated`, and the fallback): simulate a small fleet with a fault, ingest it into a DuckDB
file, run rca, and show the incidents with their ranked causes next to the truth."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from sloscope import json_answers
from sloscope.slo_spec import load_spec

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse, format_table, roll_up
from sloscope.analytics.store import Store
from sloscope.dashboards.cli import build_files, write_report
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator.cli import cause_argument
from sloscope.simulator.fleet import SimulationConfig, simulate

from sloscope.live import run as live_run
from sloscope.live.judging import summary_table
from sloscope.live.run import FAULT_NAMES, LiveConfig, LiveDemo

DEFAULT_DIR = Path("var/demo")
LIVE_DIR = Path("var/demo-live")


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="inject faults (live, or in a simulated fleet), find and explain the incidents",
        description="Runs the whole pipeline on the embedded default (a DuckDB file, no external service). "
        "Live: serve, collect with the kernel probes, an instrumented service under load, and real faults "
        "(CPU, disk, packet loss, memory) one at a time, each scored against what was injected; exit status 1 "
        "when a fault is missed or misattributed. Simulated: a small fleet with one injected fault, ingested "
        "and analysed. Without --live or --simulated: live when this machine allows it (root, eBPF, stress-ng, "
        "fio, nft, ip), else it says why and runs the simulated demo. Starts from scratch each time.")
    mode = demo.add_mutually_exclusive_group()
    mode.add_argument("--live", dest="mode", action="store_const", const="live",
                      help="the live demo (needs root, eBPF, stress-ng, fio, nftables, iproute2)")
    mode.add_argument("--simulated", dest="mode", action="store_const", const="simulated",
                      help="the simulated fleet")
    demo.set_defaults(mode="auto")
    demo.add_argument("--dir", type=Path, help=f"working directory (default: {DEFAULT_DIR}, live: {LIVE_DIR})")
    demo.add_argument("--fault", type=cause_argument, default="gpu_sm_contention", metavar="CAUSE",
                      help="taxonomy cause to inject in the simulated fleet (default: %(default)s)")
    demo.add_argument("--nodes", type=int, default=4, help="fleet size (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=1,
                      help="random seed of the simulated fleet (default: %(default)s)")
    live = demo.add_argument_group("live demo")
    live.add_argument("--faults", default=",".join(FAULT_NAMES), metavar="LIST",
                      help="faults to inject, in order (default: %(default)s)")
    live.add_argument("--fault-seconds", type=float, default=40.0,
                      help="each fault lasts this long, in seconds (default: %(default)s)")
    live.add_argument("--recovery-seconds", type=float, default=90.0,
                      help="quiet time after each fault, in seconds (default: %(default)s)")
    live.add_argument("--warmup-seconds", type=float, default=100.0, help="quiet time before the first fault, in "
                      "seconds (default: %(default)s)")
    live.add_argument("--baseline-seconds", type=float, default=60.0,
                      help="rca baseline before each incident, in seconds (default: %(default)s)")
    live.add_argument("--rate", type=float, default=10.0, help="steady requests per second (default: %(default)s)")
    live.add_argument("--json", action="store_true", help="print the results as one JSON document")
    demo.set_defaults(func=run)


def run(args) -> int:
    if args.mode == "simulated":
        return run_simulated(args)
    why = live_run.unavailable()  # through its module: tests replace it
    if args.mode == "live" and why:
        print(f"sloscope demo --live: cannot run here: {'; '.join(why)}", file=sys.stderr)
        return 2
    if why:
        print(f"==> the live demo cannot run here ({'; '.join(why)}); running the simulated demo instead",
              file=sys.stderr)
        return run_simulated(args)
    return run_live(args)


def run_live(args) -> int:
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULT_NAMES]
    if unknown or not faults:
        print(f"sloscope demo: unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULT_NAMES)}",
              file=sys.stderr)
        return 2
    cfg = LiveConfig(dir=args.dir or LIVE_DIR, faults=faults, fault_s=args.fault_seconds,
                     recovery_s=args.recovery_seconds, warmup_s=args.warmup_seconds,
                     baseline_s=args.baseline_seconds, rate=args.rate)
    demo = LiveDemo(cfg, out=sys.stderr if args.json else sys.stdout)
    minutes = (cfg.warmup_s + len(faults) * (cfg.fault_s + cfg.recovery_s)) / 60 + 0.5  # + start-up
    demo.say(f"==> live demo: {', '.join(faults)}, {cfg.fault_s:g}s each with {cfg.recovery_s:g}s of recovery "
             f"after a {cfg.warmup_s:g}s warm-up, about {minutes:.0f} minutes; Ctrl-C stops it and everything "
             f"it started")
    try:
        report = demo.run()
    except KeyboardInterrupt:
        print("sloscope demo: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    (cfg.dir / "results.json").write_text(json_answers.dumps(report, indent=2) + "\n")
    if args.json:
        print(json_answers.dumps(report, indent=2))
    else:
        print("\n" + summary_table(report))
        print(f"files: {cfg.dir}/results.json, {report['db']}; try: .venv/bin/sloscope rca --db {report['db']} "
              f"--baseline {cfg.baseline_s:g}s --lookback {cfg.lookback_s:g}s --format table")
    return 0 if report["ok"] else 1


def _step(message: str) -> float:
    print(f"==> {message}", file=sys.stderr, flush=True)
    return time.monotonic()


def run_simulated(args) -> int:
    started = time.monotonic()
    args.dir = args.dir or DEFAULT_DIR
    shutil.rmtree(args.dir, ignore_errors=True)
    otlp_dir, db_path = args.dir / "otlp", args.dir / "sloscope.duckdb"
    spec = load_spec(None)

    t = _step(f"simulating {args.nodes} nodes for 20 minutes with a {args.fault} fault -> {otlp_dir}")
    truth = simulate(SimulationConfig(out=otlp_dir, nodes=args.nodes, seed=args.seed, fault=args.fault))
    print(f"    {time.monotonic() - t:.1f}s", file=sys.stderr)

    t = _step(f"ingesting into {db_path}")
    with Store(db_path) as store:
        report = Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(otlp_dir.glob("*.jsonl*")))
        roll_up(store, spec)  # as `sloscope ingest` does
    print(f"    {report.rows_loaded:,} rows in {report.seconds:.1f}s, {report.rejected_count} lines rejected",
          file=sys.stderr)

    t = _step("rca")
    with Store(db_path, read_only=True) as store:
        result = analyse(store, spec)
    (args.dir / "rca.json").write_text(json_answers.dumps(result, indent=2) + "\n")
    print(format_table(result))

    fault = truth.fault
    found = [i for i in result["incidents"] if i["node"] == fault["node"]]
    top = found[0]["causes"][0]["cause"] if found and found[0]["causes"] else "none"
    print(f"\ninjected: {fault['cause']} on {fault['node']} at {fault['onset']}; "
          f"sloscope's top cause there: {top} ({'right' if top == fault['cause'] else 'wrong'})")
    print(f"files: {args.dir}/rca.json (the rca JSON), {db_path}, {otlp_dir}/ground_truth.json; "
          f"total {time.monotonic() - started:.1f}s")
    print(f"try: .venv/bin/sloscope rca --db {db_path} --format table")

    _step("report and dashboards")
    report = write_report(db_path, None, args.dir / "report.html")
    boards = build_files(spec, args.dir / "dashboards", "prometheus")
    print(f"report: {report['path']} ({report['incidents']} incident(s), {report['charts']} charts; open it in a "
          f"browser, it needs no network)")
    print(f"dashboards: {', '.join(str(b) for b in boards)} (Grafana JSON; provision them with "
          f".venv/bin/sloscope dashboards push --url URL)")
    return 0 if top == fault["cause"] else 1
