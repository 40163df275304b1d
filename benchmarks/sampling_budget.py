"""Adaptive sampling against its budget: a simulated fleet with a fault, replayed through the policy and the head
sampler.

The simulator writes a healthy-then-faulty fleet (OTLP-JSON), which is ingested into a DuckDB store. The replay
then walks the run in evaluation intervals: at each step the policy is evaluated from the store as `sloscope
serve` would at that moment (observations of the past minute, incidents, hysteresis state), the document is
loaded into one head sampler per (service, node), and every request span of the next interval is offered to its
sampler (trace id and the tier attribute), as a service would at span start.

Prints:
- kept request spans per second against the budget, over the intervals in which no tier is hot;
- the share of the hot tier's traces kept during each SLO incident (analytics.slo.find_incidents over the
  whole run): while the policy holds the tier hot, and over the whole incident including the interval before
  the breach is seen;
- the head sampler's decision cost per span, against the SDK's TraceIdRatioBased sampler on the same spans in
  the same run (and the cost for a span continuing a remote parent that carries `ot=th`).

    .venv/bin/python benchmarks/sampling_budget.py [--nodes 4] [--minutes 20] [--budget 20] [--fault gpu_sm_contention]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace as trace_api  # noqa: E402
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased  # noqa: E402
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags  # noqa: E402
from opentelemetry.trace.span import TraceState  # noqa: E402

from sloscope.sampling.head_sampler import RANDOM_MASK, AdaptiveSampler, threshold_for  # noqa: E402
from sloscope.sampling.config import SamplingConfig  # noqa: E402
from sloscope.sampling.policy import SamplingPolicy, observe  # noqa: E402
from sloscope.analytics.ingest import Ingestor  # noqa: E402
from sloscope.analytics.slo import find_incidents  # noqa: E402
from sloscope.analytics.store import Store  # noqa: E402
from sloscope.enrich.tiers import TierResolver  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from sloscope.slo_spec import load_spec  # noqa: E402

TRACE_ID = "(trace_hi::UHUGEINT << 64) | trace_lo"  # the trace id as one integer, as the SDK samplers see it


def epoch(t: datetime) -> float:
    return t.replace(tzinfo=timezone.utc).timestamp()


def time_calls(fn, calls, repeat=5) -> float:
    """Best per-call seconds of `fn(*args)` over `calls`, out of `repeat` passes."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for args in calls:
            fn(*args)
        best = min(best, (time.perf_counter() - started) / len(calls))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="requests/s per service per node")
    parser.add_argument("--budget", type=float, default=20.0, help="kept request spans/s")
    parser.add_argument("--fault", default="gpu_sm_contention")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--dwell", type=float, default=120.0)
    parser.add_argument("--keep", type=Path, help="keep the simulation and database here")
    args = parser.parse_args()

    spec = load_spec(None)
    config = SamplingConfig(budget_spans_per_s=args.budget, dwell_s=args.dwell)
    interval = config.interval_for(spec)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="sampling-budget-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    truth = simulate(SimulationConfig(out=workdir / "otlp", nodes=args.nodes, duration_s=args.minutes * 60,
                                      rate=args.rate, fault=args.fault, seed=args.seed))
    db = workdir / "sampling.duckdb"
    if db.exists():
        db.unlink()
    store = Store(db)
    Ingestor(store, TierResolver.from_spec(spec)).ingest_files([workdir / "otlp" / truth.extra["files"]["traces"]])
    rows = store.rows(f"SELECT epoch_us(start_time) / 1e6, {TRACE_ID}, service, node, tier, coalesce(route, '') "
                      "FROM requests ORDER BY start_time")
    first, last = rows[0][0], rows[-1][0]
    print(f"fleet: {args.nodes} nodes x {args.minutes} min, {len(rows):,} request spans "
          f"({len(rows) / (last - first):.0f}/s), fault {args.fault} on {truth.fault['node']} "
          f"(simulated and ingested in {time.monotonic() - started:.0f}s)")

    incidents = find_incidents(store, spec, datetime.fromtimestamp(first, timezone.utc).replace(tzinfo=None),
                               datetime.fromtimestamp(last + 1, timezone.utc).replace(tzinfo=None))
    # --- replay ------------------------------------------------------------------------------------------------
    times = [r[0] for r in rows]
    policy = SamplingPolicy(spec, config)
    samplers: dict[tuple[str, str], AdaptiveSampler] = {}
    t = first + config.window_s  # a full minute of history before the first decision
    cold_kept, cold_seconds = 0, 0.0
    per_interval = []
    hot_seen = Counter()  # (tier) -> [offered, kept] while hot
    hot_kept = Counter()
    decided: dict[str, bool] = {}
    hot_intervals = 0
    eval_seconds = 0.0
    while t < last:
        e0 = time.perf_counter()
        doc = policy.evaluate(observe(store, spec, config, t))
        eval_seconds += time.perf_counter() - e0
        hot = {name for name, d in doc["tiers"].items() if d["hot"]}
        for sampler in samplers.values():
            sampler.load(doc)
        lo, hi = bisect.bisect_left(times, t), bisect.bisect_left(times, t + interval)
        kept_here = 0
        for _, trace_id, service, node, tier, route in rows[lo:hi]:
            sampler = samplers.get((service, node))
            if sampler is None:
                sampler = samplers[(service, node)] = AdaptiveSampler("http://unused/sampling", service=service,
                                                                       node=node, start=False)
                sampler.load(doc)
            keep = sampler.should_sample(None, trace_id, "POST", SpanKind.SERVER,
                                         {"slo.tier": tier, "http.route": route}).decision.is_sampled()
            decided[trace_id] = keep
            if tier in hot:
                hot_seen[tier] += 1
                hot_kept[tier] += keep
            else:
                kept_here += keep
        if not hot and not doc["hot_nodes"]:
            cold_kept += kept_here
            cold_seconds += min(interval, last - t)
            per_interval.append(kept_here / min(interval, last - t))
        else:
            hot_intervals += 1
        t += interval
    evaluations = len(per_interval) + hot_intervals

    mean = cold_kept / cold_seconds if cold_seconds else float("nan")
    print(f"\nbudget: {args.budget:g} kept request spans/s; policy evaluated {evaluations} times every {interval:g}s "
          f"({1000 * eval_seconds / max(evaluations, 1):.0f} ms per evaluation from the store)")
    print(f"outside incidents ({len(per_interval)} intervals, no hot tier or node): kept {mean:.2f} spans/s = "
          f"{100 * mean / args.budget:.1f}% of the budget (error {100 * (mean / args.budget - 1):+.1f}%; "
          f"per interval median {statistics.median(per_interval):.1f}, "
          f"p10 {statistics.quantiles(per_interval, n=10)[0]:.1f}, p90 {statistics.quantiles(per_interval, n=10)[-1]:.1f}) "
          f"[target: within 10%]")
    for tier in sorted(hot_seen):
        print(f"while tier {tier} was hot: {hot_kept[tier]:,} of {hot_seen[tier]:,} traces kept "
              f"({100 * hot_kept[tier] / hot_seen[tier]:.2f}%) [target: 100%]")
    if not incidents:
        print("no SLO incident in this run")
    by_window = defaultdict(list)
    for inc in incidents:
        by_window[(inc.tier, inc.start, inc.end)].append(inc)
    for (tier, start, end), group in sorted(by_window.items(), key=lambda x: x[0][1]):
        s, e = epoch(start), epoch(end)
        ids = store.rows(f"SELECT {TRACE_ID} FROM requests WHERE tier = ? AND start_time >= ? AND start_time < ?",
                         [tier, start, end])
        offered = [decided[i] for (i,) in ids if i in decided]
        k = sum(offered)
        nodes = ", ".join(sorted({f"{g.service}@{g.node}" for g in group}))
        lag_ids = [decided[i] for (i,) in store.rows(
            f"SELECT {TRACE_ID} FROM requests WHERE tier = ? AND start_time >= ? AND start_time < ?",
            [tier, start, start + timedelta(seconds=interval)]) if i in decided]
        print(f"incident {tier} {nodes} {start:%H:%M:%S}-{end:%H:%M:%S} ({e - s:.0f}s): {k:,} of {len(offered):,} "
              f"of the tier's traces kept ({100 * k / max(len(offered), 1):.2f}%); in its first {interval:g}s, "
              f"before an evaluation could see the breach: {100 * sum(lag_ids) / max(len(lag_ids), 1):.1f}%")

    # --- decision cost -----------------------------------------------------------------------------------------
    sample = rows[: min(len(rows), 200_000)]
    calls = [(None, r[1], "POST", SpanKind.SERVER, {"slo.tier": r[4], "http.route": r[5]}) for r in sample]
    service, node = sample[0][2], sample[0][3]
    adaptive = samplers[(service, node)]
    ratio = TraceIdRatioBased(0.1)
    cost = time_calls(adaptive.should_sample, calls)
    base = time_calls(ratio.should_sample, calls)
    noop = time_calls(lambda *a: None, calls)
    parent_state = TraceState([("ot", "th:8")])  # callers that kept 50 %: the trace ids they kept
    remote = [(trace_api.set_span_in_context(NonRecordingSpan(SpanContext(
        c[1], 1, True, TraceFlags(TraceFlags.SAMPLED), parent_state))), *c[1:])
        for c in calls if c[1] & RANDOM_MASK >= threshold_for(0.5)][:50_000]
    cost_remote = time_calls(adaptive.should_sample, remote)
    print(f"\ndecision cost per span ({len(calls):,} spans, best of 5, Python {sys.version.split()[0]}): "
          f"adaptive head sampler {cost * 1e6:.2f} us [target: < 2 us]; SDK TraceIdRatioBased {base * 1e6:.2f} us "
          f"(same spans, same run); empty call {noop * 1e6:.2f} us; "
          f"remote parent with ot=th {cost_remote * 1e6:.2f} us")
    store.close()
    if not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
