"""benchmarks/rca_accuracy.py --inference: vLLM-like replicas (`sloscope simulate --inference`) under each inference
and physical fault, judged with the spec the simulator writes beside them; AC@1 and AC@3 of (node, cause) of the first
incident from the fault's onset, and false incidents per 100 node-hours of healthy fleets (rca_accuracy.py's
docstring says more)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator import inference
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope.slo_spec import load_spec
from sloscope.times import parse_rfc3339

INFERENCE_DEFAULTS = {"seeds": 2, "nodes": 3, "rate": inference.DEFAULT_RATE, "duration": 1080, "controls": 2}
INFERENCE_FAULT_AT_S = 720  # 12 min in: a 10 min baseline before the fault
INFERENCE_FAULT_DURATION_S = 240


def run_inference_case(kind: str | None, seed: int, args, workdir: Path) -> dict:
    out = workdir / f"inference-{kind or 'control'}-{seed}"
    truth = simulate(SimulationConfig(out=out, nodes=args.nodes, seed=seed, fault=kind, rate=args.rate,
                                      duration_s=args.duration, fault_at_s=INFERENCE_FAULT_AT_S,
                                      fault_duration_s=INFERENCE_FAULT_DURATION_S, inference=True))
    spec = load_spec(out / inference.SPEC_FILE)
    with Store(out / "db.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(out.glob("*.jsonl*")))
    with Store(out / "db.duckdb", read_only=True) as store:
        incidents = sorted(analyse(store, spec)["incidents"], key=lambda i: i["start"])
    shutil.rmtree(out, ignore_errors=True)
    case = {"kind": kind, "seed": seed, "node_hours": args.nodes * args.duration / 3600}
    if kind is None:
        case["incidents"] = [i["sli"]["kind"] for i in incidents]
        return case
    # the first incident from the SLI step holding the onset on (steps are aligned to the resolution, the run is not)
    onset = parse_rfc3339(truth.fault["onset"], "ground_truth.json: fault.onset") - \
        timedelta(seconds=spec.resolution_s)
    after = [i for i in incidents if parse_rfc3339(i["start"], "incident start") > onset]
    first = after[0] if after else None
    case["truth"] = [truth.fault["node"], truth.fault["cause"]]
    case["ranked"] = [[first["node"], c["cause"]] for c in first["causes"][:3]] if first else []
    case["sli"] = first["sli"]["kind"] if first else None
    return case


def summarise_inference(cases: list[dict], kinds: list[str], target_ac1: float) -> str:
    lines = [f"{'fault kind':<20} {'expected cause':<21} {'n':>3} {'AC@1':>6} {'AC@3':>6}  first causes"]
    hits1 = hits3 = total = 0
    for kind in kinds:
        runs = [c for c in cases if c["kind"] == kind]
        if not runs:
            continue
        at1 = sum(c["ranked"][:1] == [c["truth"]] for c in runs)
        at3 = sum(c["truth"] in c["ranked"] for c in runs)
        hits1, hits3, total = hits1 + at1, hits3 + at3, total + len(runs)
        firsts = ",".join(c["ranked"][0][1] if c["ranked"] else "-" for c in runs)
        lines.append(f"{kind:<20} {inference.EXPECTED_CAUSE[kind]:<21} {len(runs):>3} {at1 / len(runs):>6.2f} "
                     f"{at3 / len(runs):>6.2f}  {firsts}")
    if total:
        ac1 = hits1 / total
        lines.append(f"{'overall':<42} {total:>3} {ac1:>6.2f} {hits3 / total:>6.2f}  (target AC@1 >= "
                     f"{target_ac1:g}: {'ok' if ac1 >= target_ac1 else 'BELOW TARGET'})")
    controls = [c for c in cases if c["kind"] is None]
    if controls:
        node_hours = sum(c["node_hours"] for c in controls)
        kinds_seen = [k for c in controls for k in c["incidents"]]
        rate = 100 * len(kinds_seen) / node_hours
        lines.append(f"healthy fleets: {len(controls)} runs, {node_hours:.1f} node-hours, {len(kinds_seen)} incidents "
                     f"({', '.join(kinds_seen) or 'none'}): {rate:.2f} per 100 node-hours (target 0: "
                     f"{'ok' if not kinds_seen else 'ABOVE TARGET'}); of output length alone (latency SLI): "
                     f"{kinds_seen.count('latency')}")
    return "\n".join(lines)


def main_inference(args, kinds: list[str], target_ac1: float) -> int:
    cases = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            for kind in kinds + [None] * args.controls:
                case = run_inference_case(kind, seed if kind else seed * 100 + len(cases), args, Path(tmp))
                cases.append(case)
                if kind is None:
                    print(f"     control              seed {case['seed']}: incidents {case['incidents']}",
                          file=sys.stderr, flush=True)
                else:
                    verdict = "ok " if case["ranked"][:1] == [case["truth"]] else "MISS"
                    print(f"{verdict:4} {kind:<20} seed {seed}: truth {case['truth']}, first incident {case['sli']}, "
                          f"ranked {case['ranked']}", file=sys.stderr, flush=True)
    print(summarise_inference(cases, kinds, target_ac1))
    print(f"{len(cases)} runs in {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0
