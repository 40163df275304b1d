"""RCA accuracy and incident precision: every taxonomy cause injected with several seeds, plus healthy controls,
on a realistic fleet (5 nodes, 30 minutes, 4 requests/s per service and node, lognormal latency, bursts,
drift, innocent signal blips on the other nodes).

Prints AC@1 and AC@3 per cause and overall for sloscope's attribution and for a BARO-style baseline on the
same data (the highest robust score over all signals of the incident's node, absolute, with no taxonomy, no
precedence and no locality); wrong-node incidents per faulty run; how long after the fault's requests broke
the SLO its first incident could be opened; and false incidents per 100 node-hours of healthy fleet, each
against its target.

    .venv/bin/python benchmarks/rca_accuracy.py [--seeds 5] [--causes a,b] [--nodes 5] [--controls 2] [--clickhouse]

With --clickhouse every run is also loaded into chDB from the same files, and the runs where both stores find the
same incidents (tier, service, node, start, end) and causes are counted.

With --mesh the fleet is a service mesh (`sloscope simulate --mesh`: 8 services, 13 pods over 3 nodes, every
request a trace) and each fault sits on one pod of a service at depth >= 2: every physical cause, network_latency
(calls to the pod slowed on the wire), slow_handler and exceptions (its code slower or failing: cause
`application`). For each, the analysis is asked about the moment 2 minutes into the fault (`explain_moment`, as
`sloscope rca --at`), and its ranked causes are scored on (service, node, cause): AC@1 and AC@3 per fault kind,
the share of code faults whose first cause is `application`, and the first culprit's service, pod and kind.
Healthy meshes give the false incidents per 100 node-hours (`analyse`). Defaults: 2 seeds, 3 nodes, 13 min runs
with the fault from 10 min in, 2 requests/s per node into the mesh, one healthy mesh per seed.

    .venv/bin/python benchmarks/rca_accuracy.py --mesh [--seeds 2] [--causes slow_handler,disk_io] [--nodes 3]

With --inference the fleet is vLLM-like replicas (`sloscope simulate --inference`: one per node, token-level spans
and engine metrics, answers of 20 to 2,000 tokens) judged with the spec the simulator writes beside the data
(`slo.yaml`: ttft, tpot and queue objectives for the tiers chat and batch). Fault kinds: load_surge (expected cause
inference_queue), kv_cache_pressure, long_prompts (prefill_interference), gpu_sm_contention and cpu_contention. Each
is scored on (node, cause) of the first incident that starts after the fault's onset (`analyse`): AC@1 and AC@3 per
fault kind. Healthy fleets give the false incidents per 100 node-hours, with the SLI kind of each, so that an
incident of output length alone (an end-to-end latency one) shows. Defaults: 2 seeds, 3 nodes, 18 min runs with the
fault from 12 min in for 4 min, 4 requests/s per replica, two healthy fleets per seed.

    .venv/bin/python benchmarks/rca_accuracy.py --inference [--seeds 2] [--causes load_surge,long_prompts]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import polars as pl

from sloscope.analytics.attribution import GROWTH_SUFFIX, Window, series_scores, signal_steps
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse, explain_moment
from sloscope.analytics.slo import MIN_BLOCKS, find_incidents
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator import faults, inference, mesh
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope import taxonomy
from sloscope.slo_spec import load_spec
from sloscope.times import parse_rfc3339

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.store_parity import incident_summary  # noqa: E402
from rca_inference import INFERENCE_DEFAULTS, main_inference  # noqa: E402

SLI_RAMP_S = 5.0  # simulator.fleet: the latency response reaches full effect this long after its onset


def baro_ranking(store: Store, spec, incident) -> list[str]:
    """Causes in the order of their signals' absolute robust scores on the incident's node."""
    window = Window.around(incident.start, incident.end, spec.resolution_s)
    scores = series_scores(signal_steps(store, window), window, directional=False)
    local = (scores.filter((pl.col("node") == incident.node) & ~pl.col("metric").cat.ends_with(GROWTH_SUFFIX))
             .sort("z_observed", descending=True))
    ranked = []
    for metric, attributes in local.select("metric", "attributes").iter_rows():
        attrs = json.loads(attributes)
        causes = [c.id for c in taxonomy.CAUSES if any(ev.signal == metric and ev.matches(attrs) for ev in c.evidence)]
        label = causes[0] if causes else f"(no cause for {metric})"
        if label not in ranked:
            ranked.append(label)
    return ranked


TARGET_FALSE_PER_100_NODE_HOURS = 1.0
TARGET_WRONG_NODE_PER_RUN = 0.1
TARGET_AC1 = 0.95
TARGET_DETECT_S = 30.0


def run_case(cause: str | None, seed: int, nodes: int, rate: float, duration_s: int, workdir: Path,
             clickhouse: Path | None = None) -> dict:
    spec = load_spec(None)
    out = workdir / f"{cause or 'control'}-{seed}"
    truth = simulate(SimulationConfig(out=out, nodes=nodes, seed=seed, fault=cause, rate=rate, duration_s=duration_s))
    with Store(out / "db.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(out.glob("*.jsonl*")))
    with Store(out / "db.duckdb", read_only=True) as store:
        result = analyse(store, spec)
        incidents = result["incidents"]
        case = {"cause": cause, "seed": seed, "incidents": len(incidents), "node_hours": nodes * duration_s / 3600}
        if clickhouse is not None:
            case["same_on_clickhouse"] = incident_summary(_on_clickhouse(clickhouse / out.name, out, spec)) == \
                incident_summary(result)
        if cause is None:
            return case
        node = truth.fault["node"]
        case["wrong_node"] = sum(i["node"] != node for i in incidents)
        case["right_node"] = bool(incidents) and not case["wrong_node"]
        on_node = [i for i in incidents if i["node"] == node]
        ours = [c["cause"] for c in on_node[0]["causes"]] if on_node else []
        first = next((i for i in find_incidents(store, spec, *_range(store)) if i.node == node), None)
        baseline = baro_ranking(store, spec, first) if first else []
        case["detected_after_s"] = _detection_delay(first, truth, spec)
    case.update(ours=ours[:3], baseline=baseline[:3])
    return case


def _on_clickhouse(path: Path, otlp: Path, spec) -> dict:
    """The rca document of the same OTLP files loaded into chDB at `path`."""
    with open_store(f"chdb:///{path.resolve()}") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(otlp.glob("*.jsonl*")))
    with open_store(f"chdb:///{path.resolve()}", read_only=True) as store:
        return analyse(store, spec)


def _detection_delay(first, truth, spec) -> float | None:
    """Seconds from the fault's requests breaking the SLO (its latency response at full effect) to the end of
    the incident's second violating window, when it can first be opened."""
    if first is None:
        return None
    onset = parse_rfc3339(truth.fault["sli_onset"], "ground_truth.json: fault.sli_onset")
    broke = onset + timedelta(seconds=SLI_RAMP_S)
    opened = first.start + timedelta(seconds=MIN_BLOCKS * spec.resolution_s)
    return (opened - broke).total_seconds()


def _range(store: Store):
    first, last = store.rows("SELECT min(start_time), max(start_time) FROM requests")[0]
    return first, last + timedelta(seconds=1)


def summarise(cases: list[dict]) -> str:
    per = defaultdict(lambda: defaultdict(int))
    for c in cases:
        if c["cause"] is None:
            continue
        p = per[c["cause"]]
        p["n"] += 1
        p["right_node"] += c["right_node"]
        for who in ("ours", "baseline"):
            p[f"{who}@1"] += c[who][:1] == [c["cause"]]
            p[f"{who}@3"] += c["cause"] in c[who][:3]
    lines = [f"{'cause':<22} {'n':>3} {'AC@1':>6} {'AC@3':>6} {'base@1':>7} {'base@3':>7} {'node ok':>8}"]
    total = defaultdict(int)
    for cause in faults.PHYSICAL_CAUSES:
        p = per.get(cause)
        if not p:
            continue
        for k, v in p.items():
            total[k] += v
        n = p["n"]
        lines.append(f"{cause:<22} {n:>3} {p['ours@1'] / n:>6.2f} {p['ours@3'] / n:>6.2f} "
                     f"{p['baseline@1'] / n:>7.2f} {p['baseline@3'] / n:>7.2f} {p['right_node']:>4}/{n}")
    n = total["n"] or 1
    lines.append(f"{'overall':<22} {total['n']:>3} {total['ours@1'] / n:>6.2f} {total['ours@3'] / n:>6.2f} "
                 f"{total['baseline@1'] / n:>7.2f} {total['baseline@3'] / n:>7.2f} "
                 f"{total['right_node']:>4}/{total['n']}")
    return "\n".join(lines + _targets(cases, total["ours@1"] / n))


def _targets(cases: list[dict], ac1: float) -> list[str]:
    faulty = [c for c in cases if c["cause"] is not None]
    controls = [c for c in cases if c["cause"] is None]
    node_hours = sum(c["node_hours"] for c in controls)
    false_rate = 100 * sum(c["incidents"] for c in controls) / node_hours if node_hours else float("nan")
    wrong = sum(c["wrong_node"] for c in faulty) / len(faulty) if faulty else float("nan")
    delays = [c["detected_after_s"] for c in faulty if c["detected_after_s"] is not None]
    missed = sum(c["detected_after_s"] is None for c in faulty)
    worst = max(delays, default=float("nan"))

    def verdict(ok: bool) -> str:
        return "ok" if ok else "ABOVE TARGET"
    return [
        f"healthy controls: {len(controls)} runs, {node_hours:.1f} node-hours, "
        f"{sum(c['incidents'] for c in controls)} incidents: {false_rate:.2f} per 100 node-hours "
        f"(target <= {TARGET_FALSE_PER_100_NODE_HOURS:g}: {verdict(false_rate <= TARGET_FALSE_PER_100_NODE_HOURS)})",
        f"wrong-node incidents: {wrong:.2f} per faulty run (target <= {TARGET_WRONG_NODE_PER_RUN:g}: "
        f"{verdict(wrong <= TARGET_WRONG_NODE_PER_RUN)})",
        f"AC@1 {ac1:.2f} (target >= {TARGET_AC1:g}: {verdict(ac1 >= TARGET_AC1)})",
        f"detection after the SLO broke: median {sorted(delays)[len(delays) // 2] if delays else float('nan'):.0f} s, "
        f"worst {worst:.0f} s, missed {missed} (target <= {TARGET_DETECT_S:g} s: "
        f"{verdict(not missed and worst <= TARGET_DETECT_S)})",
    ]


# ------------------------------------------------------------------------------------------------ mesh

MESH_DEFAULTS = {"seeds": 2, "nodes": 3, "rate": 2.0, "duration": 780, "controls": 1}
MESH_FAULT_AT_S = 600  # 10 min in: the analysis' baseline (10 min, ending 1 min before the moment) fits the run
MESH_FAULT_DURATION_S = 180
MOMENT_AFTER_S = 120  # the moment asked about, after the fault's onset
TARGET_APPLICATION = 0.9
CODE_FAULTS = ("slow_handler", "exceptions")
# The culprit kind the trace graph should name first for each fault kind (physical causes slow the pod's own code).
CULPRIT_KIND = {"network_latency": "network", "slow_handler": "self", "exceptions": "errors"}


def _at(c: dict, key: str):
    """A field of a cause or culprit; None where the analysis does not give it (a miss, not a crash)."""
    return c.get(key) if isinstance(c, dict) else None


def run_mesh_case(kind: str | None, seed: int, args, workdir: Path) -> dict:
    spec = load_spec(None)
    out = workdir / f"mesh-{kind or 'control'}-{seed}"
    truth = simulate(SimulationConfig(out=out, nodes=args.nodes, seed=seed, fault=kind, rate=args.rate,
                                      duration_s=args.duration, fault_at_s=args.fault_at,
                                      fault_duration_s=args.fault_duration, mesh=True))
    with Store(out / "db.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(out.glob("*.jsonl*")))
    case = {"kind": kind, "seed": seed, "node_hours": args.nodes * args.duration / 3600}
    moment = {}
    with Store(out / "db.duckdb", read_only=True) as store:
        # An analysis that fails on a run scores it as a miss (a false incident for a control) and says why,
        # rather than ending the benchmark with the runs before it lost.
        try:
            if kind is None:
                case["incidents"] = len(analyse(store, spec)["incidents"])
                return case
            at = parse_rfc3339(truth.fault["onset"], "ground_truth.json: fault.onset") + \
                timedelta(seconds=MOMENT_AFTER_S)
            lookback = {} if args.lookback is None else {"lookback": timedelta(seconds=args.lookback)}
            moment = explain_moment(store, spec, at, **lookback).get("moment") or {}
        except Exception as exc:  # noqa: BLE001 - any failure of the analysis is reported with the run
            case["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if kind is None:
                case["incidents"] = 1
                return case
    f = truth.fault
    case["truth"] = {k: f[k] for k in ("service", "pod", "node", "cause")}
    case["ranked"] = [[_at(c, "service"), _at(c, "node"), _at(c, "cause")] for c in moment.get("causes") or []][:5]
    case["culprits"] = [{k: _at(c, k) for k in ("service", "pod", "node", "kind")}
                        for c in moment.get("culprits") or []][:3]
    return case


def _mesh_scores(case: dict) -> dict:
    t = case["truth"]
    want = [t["service"], t["node"], t["cause"]]
    ranked, culprits = case["ranked"], case["culprits"]
    first = culprits[0] if culprits else {}
    return {
        "@1": ranked[:1] == [want], "@3": want in ranked[:3],
        "node_cause@1": bool(ranked) and ranked[0][1:] == want[1:],
        "application@1": bool(ranked) and ranked[0][2] == "application",
        "culprit@1": (first.get("service"), first.get("pod")) == (t["service"], t["pod"]) and
        first.get("kind") == CULPRIT_KIND.get(case["kind"], "self"),
    }


def summarise_mesh(cases: list[dict], kinds: list[str]) -> str:
    per = defaultdict(lambda: defaultdict(int))
    for c in cases:
        if c["kind"] is None:
            continue
        p = per[c["kind"]]
        p["n"] += 1
        for k, v in _mesh_scores(c).items():
            p[k] += v
    lines = [f"{'fault kind':<22} {'cause':<21} {'n':>3} {'AC@1':>6} {'AC@3':>6} {'node+cause@1':>13} "
             f"{'culprit@1':>10}"]
    for kind in kinds:
        p = per.get(kind)
        if not p:
            continue
        n = p["n"]
        lines.append(f"{kind:<22} {mesh.FAULT_CAUSE.get(kind, kind):<21} {n:>3} {p['@1'] / n:>6.2f} "
                     f"{p['@3'] / n:>6.2f} {p['node_cause@1'] / n:>13.2f} {p['culprit@1'] / n:>10.2f}")

    def share(group, key):
        n = sum(per[k]["n"] for k in group if k in per)
        return (sum(per[k][key] for k in group if k in per) / n, n) if n else (float("nan"), 0)

    def verdict(ok: bool) -> str:
        return "ok" if ok else "BELOW TARGET"
    out = []
    physical, n = share(faults.PHYSICAL_CAUSES, "@1")
    if n:
        out.append(f"physical faults: AC@1 {physical:.2f} over {n} runs (target >= {TARGET_AC1:g}: "
                   f"{verdict(physical >= TARGET_AC1)})")
    app, n = share(CODE_FAULTS, "application@1")
    if n:
        out.append(f"code faults: application first in {app:.2f} of {n} runs (target >= {TARGET_APPLICATION:g}: "
                   f"{verdict(app >= TARGET_APPLICATION)})")
    net, n = share(("network_latency",), "@1")
    if n:
        out.append(f"network_latency: AC@1 {net:.2f} over {n} runs (no target)")
    controls = [c for c in cases if c["kind"] is None]
    node_hours = sum(c["node_hours"] for c in controls)
    if controls:
        false = sum(c["incidents"] for c in controls)
        rate = 100 * false / node_hours
        out.append(f"healthy meshes: {len(controls)} runs, {node_hours:.1f} node-hours, {false} incidents: "
                   f"{rate:.2f} per 100 node-hours (target <= {TARGET_FALSE_PER_100_NODE_HOURS:g}: "
                   f"{'ok' if rate <= TARGET_FALSE_PER_100_NODE_HOURS else 'ABOVE TARGET'})")
    failed = [c for c in cases if "error" in c]
    if failed:
        out.append(f"the analysis failed on {len(failed)} of {len(cases)} runs (each counted as a miss, or as one "
                   f"false incident for a healthy mesh): first {failed[0]['error']}")
    return "\n".join(lines + out)


def main_mesh(args, kinds: list[str]) -> int:
    cases = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            for kind in kinds + [None] * args.controls:
                case = run_mesh_case(kind, seed if kind else seed * 100 + len(cases), args, Path(tmp))
                cases.append(case)
                error = f", ANALYSIS FAILED: {case['error']}" if "error" in case else ""
                if kind is None:
                    print(f"     control                seed {case['seed']}: incidents {case['incidents']}{error}",
                          file=sys.stderr, flush=True)
                else:
                    sc = _mesh_scores(case)
                    t = case["truth"]
                    print(f"{'ok ' if sc['@1'] else 'MISS':4} {kind:<22} seed {seed}: truth "
                          f"{[t['service'], t['node'], t['cause']]}, ranked {case['ranked'][:3]}, first culprit "
                          f"{case['culprits'][:1]}{error}", file=sys.stderr, flush=True)
                shutil.rmtree(Path(tmp) / f"mesh-{kind or 'control'}-{case['seed']}", ignore_errors=True)
    print(summarise_mesh(cases, kinds))
    print(f"{len(cases)} runs in {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", action="store_true",
                        help="a service mesh, scored on (service, node, cause) at a moment of each fault")
    parser.add_argument("--inference", action="store_true",
                        help="vLLM-like replicas with token-level traffic, scored on (node, cause) of the first "
                        "incident after each fault's onset")
    parser.add_argument("--seeds", type=int, default=None, help="default: 5, or 2 with --mesh or --inference")
    parser.add_argument("--causes", default=None,
                        help="comma-separated causes, or with --mesh fault kinds (default: all of them)")
    parser.add_argument("--nodes", type=int, default=None, help="default: 5, or 3 with --mesh or --inference")
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s per service per node (default: 4); with --mesh, into the mesh per node "
                        "(default: 2); with --inference, per replica (default: 4)")
    parser.add_argument("--duration", type=int, default=None,
                        help="seconds per run (default: 1800, or 780 with --mesh, 1080 with --inference)")
    parser.add_argument("--controls", type=int, default=None,
                        help="healthy runs per seed (default: 2, or 1 with --mesh)")
    parser.add_argument("--fault-at", type=int, default=MESH_FAULT_AT_S,
                        help="with --mesh: fault onset, s into the run")
    parser.add_argument("--fault-duration", type=int, default=MESH_FAULT_DURATION_S, help="with --mesh: its length, s")
    parser.add_argument("--lookback", type=int, default=None,
                        help="with --mesh: seconds between the baseline's end and the moment (default: the analysis' "
                        "own, 1 min, so the baseline holds the fault's first minute; 150 ends it before the fault)")
    parser.add_argument("--json", type=Path, help="also write every case here")
    parser.add_argument("--clickhouse", action="store_true",
                        help="also load every run into chDB (pip install 'sloscope[clickhouse]') and count the runs "
                        "where it finds the same incidents and causes as DuckDB")
    args = parser.parse_args()
    if args.mesh and args.inference:
        parser.error("--mesh and --inference are different fleets: choose one")
    defaults = MESH_DEFAULTS if args.mesh else INFERENCE_DEFAULTS if args.inference else \
        {"seeds": 5, "nodes": 5, "rate": 4.0, "duration": 1800, "controls": 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    known = mesh.fault_kinds() if args.mesh else inference.FAULT_KINDS if args.inference else faults.PHYSICAL_CAUSES
    if args.causes is None:
        args.causes = ",".join(known)
    unknown = [c for c in args.causes.split(",") if c and c not in known]
    if unknown:
        parser.error(f"unknown {'fault kinds' if args.mesh or args.inference else 'causes'} {', '.join(unknown)}: "
                     f"choose from {', '.join(known)}")
    if args.mesh:
        if args.clickhouse:
            parser.error("--clickhouse compares incidents of flat fleets; it does not apply to --mesh")
        return main_mesh(args, [c for c in args.causes.split(",") if c])
    if args.inference:
        if args.clickhouse:
            parser.error("--clickhouse compares incidents of flat fleets; it does not apply to --inference")
        return main_inference(args, [c for c in args.causes.split(",") if c], TARGET_AC1)
    causes = [c for c in args.causes.split(",") if c]
    cases = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            for cause in causes + [None] * args.controls:
                case = run_case(cause, seed if cause else seed * 100 + len(cases), args.nodes, args.rate,
                                args.duration, Path(tmp), Path(tmp) / "clickhouse" if args.clickhouse else None)
                cases.append(case)
                verdict = "" if cause is None else ("ok " if case["ours"][:1] == [cause] else "MISS")
                print(f"{verdict:4} {cause or 'control':<22} seed {case['seed']}: incidents {case['incidents']}, "
                      f"wrong node {case.get('wrong_node')}, detected after {case.get('detected_after_s')} s, "
                      f"ours {case.get('ours')}, baseline {case.get('baseline')}"
                      + ("" if "same_on_clickhouse" not in case else
                         f", chDB {'agrees' if case['same_on_clickhouse'] else 'DIFFERS'}"),
                      file=sys.stderr, flush=True)
                for path in (Path(tmp) / f"{cause or 'control'}-{case['seed']}").iterdir():
                    path.unlink()
                shutil.rmtree(Path(tmp) / "clickhouse", ignore_errors=True)
    print(summarise(cases))
    if args.clickhouse:
        same = sum(c["same_on_clickhouse"] for c in cases)
        print(f"DuckDB and ClickHouse (chDB) agree on {same}/{len(cases)} runs (incidents, their bounds and causes)")
    print(f"{len(cases)} runs in {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
