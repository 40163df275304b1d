"""RCA accuracy: every taxonomy cause injected with several seeds, plus healthy controls.

Prints AC@1 and AC@3 per cause and overall for sloscope's attribution and for a BARO-style baseline on the
same data (the highest robust score over all signals of the incident's node, absolute, with no taxonomy, no
precedence and no locality), whether every incident was on the faulty node, and incidents in the controls.

    .venv/bin/python benchmarks/rca_accuracy.py [--seeds 5] [--causes a,b] [--nodes 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import polars as pl

from analytics.attribution import GROWTH_SUFFIX, Window, series_scores, signal_steps
from analytics.ingest import Ingestor
from analytics.rca import analyse
from analytics.slo import find_incidents
from analytics.store import Store
from enrich.tiers import TierResolver
from simulator.fleet import SimulationConfig, simulate
from sloscope import taxonomy
from sloscope.slo_spec import load_spec


def baro_ranking(store: Store, spec, incident) -> list[str]:
    """Causes in the order of their signals' absolute robust scores on the incident's node."""
    window = Window.around(incident.start, incident.end, spec.resolution_s)
    scores = series_scores(signal_steps(store, window), window, directional=False)
    local = (scores.filter((pl.col("node") == incident.node) & ~pl.col("metric").str.ends_with(GROWTH_SUFFIX))
             .sort("z_observed", descending=True))
    ranked = []
    for metric, attributes in local.select("metric", "attributes").iter_rows():
        attrs = json.loads(attributes)
        causes = [c.id for c in taxonomy.CAUSES if any(ev.signal == metric and ev.matches(attrs) for ev in c.evidence)]
        label = causes[0] if causes else f"(no cause for {metric})"
        if label not in ranked:
            ranked.append(label)
    return ranked


def run_case(cause: str | None, seed: int, nodes: int, rate: float, workdir: Path) -> dict:
    spec = load_spec(None)
    out = workdir / f"{cause or 'control'}-{seed}"
    truth = simulate(SimulationConfig(out=out, nodes=nodes, seed=seed, fault=cause, rate=rate, duration_s=1200))
    with Store(out / "db.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(out.glob("*.jsonl*")))
    with Store(out / "db.duckdb", read_only=True) as store:
        result = analyse(store, spec)
        incidents = result["incidents"]
        case = {"cause": cause, "seed": seed, "incidents": len(incidents)}
        if cause is None:
            return case
        node = truth.fault["node"]
        case["right_node"] = bool(incidents) and all(i["node"] == node for i in incidents)
        on_node = [i for i in incidents if i["node"] == node]
        ours = [c["cause"] for c in on_node[0]["causes"]] if on_node else []
        first = next((i for i in find_incidents(store, spec, *_range(store)) if i.node == node), None)
        baseline = baro_ranking(store, spec, first) if first else []
    case.update(ours=ours[:3], baseline=baseline[:3])
    return case


def _range(store: Store):
    from datetime import timedelta

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
    for cause in taxonomy.CAUSE_IDS:
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
                 f"{total['baseline@1'] / n:>7.2f} {total['baseline@3'] / n:>7.2f} {total['right_node']:>4}/{total['n']}")
    controls = [c for c in cases if c["cause"] is None]
    lines.append(f"healthy controls: {len(controls)} runs, {sum(c['incidents'] for c in controls)} incidents")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--causes", default=",".join(taxonomy.CAUSE_IDS))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rate", type=float, default=6.0, help="requests/s per service per node")
    parser.add_argument("--json", type=Path, help="also write every case here")
    args = parser.parse_args()
    causes = [c for c in args.causes.split(",") if c]
    cases = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            for cause in causes + [None]:
                case = run_case(cause, seed, args.nodes, args.rate, Path(tmp))
                cases.append(case)
                verdict = "" if cause is None else ("ok " if case["ours"][:1] == [cause] else "MISS")
                print(f"{verdict:4} {cause or 'control':<22} seed {seed}: incidents {case['incidents']}, "
                      f"ours {case.get('ours')}, baseline {case.get('baseline')}", file=sys.stderr, flush=True)
                for path in (Path(tmp) / f"{cause or 'control'}-{seed}").iterdir():
                    path.unlink()
    print(summarise(cases))
    print(f"{len(cases)} runs in {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
