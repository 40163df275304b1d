"""The trace graph: where the entry's latency and errors went, along the traces' call trees (docs/traces.md).

A span's own time is its duration less the time its children cover: the union of their intervals, clipped to its
own, so that calls made in parallel count once. A SERVER, INTERNAL or CONSUMER span's own time is its service's
work on its pod. A CLIENT or PRODUCER span's own time is the network gap of its call: its duration less the SERVER
span it reached; a call no span answered counts as its caller's own time.

Each trace is judged by its entry: the earliest of its spans whose parent is not stored (the gateway's or first
service's span; deeper services see no tier header, so the entry's tier is the trace's). Per entry request, each
(service, pod, node)'s own time, each call edge's network gap and each place where a trace's failure began (a
failed span with no failed child) is compared between a baseline window and the observed one: what grew by
much more than its traces' own variation (a Welch z of at least MIN_Z) and holds a share of the entry's growth
of at least MIN_SHARE is a culprit. A pod whose calls grew slower on the wire is named once for all its edges,
caller or callee: the pod that the slowed edges share. Where the calls a place makes per request fell by a
third or more, the trace now ends early there: a request answered without the work it used to do (an early return, or
a failure the spans record no status for). The culprit is the place the cut traces now end at: the callee whose
answer came last before the caller gave up, or the place itself where it now makes no call at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from sloscope.catalog import EVERY_NODE
from sloscope.records import SPAN_KIND_CLIENT, SPAN_KIND_PRODUCER, SPAN_KIND_SERVER, SPAN_KINDS

from sloscope.analytics.store_api import StoreReader

SELF, NETWORK, ERRORS, CUT = "self", "network", "errors", "cut"
MIN_Z = 4.0  # a change of the mean per entry request this many standard errors away from the baseline's
MIN_SHARE = 0.1  # of the entry's growth (latency or failures per request)
MIN_GROWTH_MS = 1.0  # less added per entry request is no one's fault worth naming
# Of the calls a place makes per request: a changed mix of requests moves a busy place's calls per request by a few
# per cent from minute to minute (about 2 % on Online Boutique's frontend), far less than a third.
CUT_DROP = 0.3
MIN_TRACES = 20  # per window: fewer entry requests say nothing about a mean
UNINSTRUMENTED = "(no span)"  # the service graph's callee of a call that names no peer and was answered by no span
ONSET_STEP = timedelta(seconds=10)  # the resolution at which a culprit's onset is placed
ONSET_Z = 2.0  # a step above the baseline by this many standard errors, in a run that lasts, is the change
CALLERS = (SPAN_KIND_CLIENT, SPAN_KIND_PRODUCER)
LIFT_LIMIT = 2**62  # own_times' lifted ends stay below this, inside a signed 64-bit integer
PLACE = ("service", "pod", "node")


@dataclass(frozen=True)
class Entry:
    """The entry requests whose traces an analysis reads: those of `service` on `node` (on any node where it is
    EVERY_NODE) of `tier` (an incident's), or every trace where `service` is empty."""

    service: str = ""
    node: str = ""
    tier: str = ""


EVERY_TRACE = Entry()


def _entry_params(entry: Entry) -> dict:
    """trace_spans.sql's parameters that choose the traces of `entry`."""
    return {"service": entry.service, "node": entry.node, "tier": entry.tier, "every_node": EVERY_NODE}


def trace_spans(store: StoreReader, since: datetime, until: datetime, entry: Entry = EVERY_TRACE,
                tiers: dict | None = None) -> pl.DataFrame:
    """Every span that started in [since, until) (analytics/sql/trace_spans.sql), of the traces of `entry`, their
    tiers by `tiers` (the spec's StoreReader.tier_params; else the store's own rules)."""
    spans = store.frame(store.sql("trace_spans"), {**(tiers or {}), "since": since, "until": until,
                                                   **_entry_params(entry)})
    return spans.with_columns(pl.col("failed").cast(pl.Boolean))  # ClickHouse answers its booleans as integers


def own_times(spans: pl.DataFrame) -> pl.DataFrame:
    """The spans with their own time (`own_ms`), whether a child failed, and for a call the callee's place
    (`callee_service`, `callee_pod`, `callee_node`: the SERVER or CONSUMER span it reached, null where none)."""
    spans = spans.with_columns(start_us=pl.col("start_time").dt.epoch("us"),
                               end_us=pl.col("start_time").dt.epoch("us") + (pl.col("duration_ms") * 1000).cast(
                                   pl.Int64)).with_columns(pl.col(p).fill_null("") for p in ("pod", "peer"))
    parents = spans.select("trace", parent_id="span_id", p_start="start_us", p_end="end_us")
    # The children carry their row in `spans`, not their strings: the join and the sort move numbers only.
    children = (spans.select("trace", "parent_id", "kind", "failed", c_start="start_us", c_end="end_us",
                             row=pl.int_range(pl.len(), dtype=pl.UInt32))
                .join(parents, on=["trace", "parent_id"])
                .with_columns(c_start=pl.max_horizontal("c_start", "p_start"),
                              c_end=pl.min_horizontal("c_end", "p_end"))
                .filter(pl.col("c_end") > pl.col("c_start"))
                .sort("trace", "parent_id", "c_start"))
    covered = _covered(children).group_by("rank").agg(
        pl.col("trace", "parent_id").first(), covered_us=pl.col("covered").sum(),
        child_failed=pl.col("failed").any(),
        # The first SERVER or CONSUMER child, by its start: the callee a call reached.
        callee=pl.col("row").filter(pl.col("kind").is_in([SPAN_KIND_SERVER, 5])).first())
    places = spans.select(*PLACE)[covered["callee"]]  # a null row gathers nulls: a call no span answered
    covered = pl.concat([covered.drop("rank", "callee"), places.rename({p: f"callee_{p}" for p in PLACE})],
                        how="horizontal")
    return (spans.join(covered.rename({"parent_id": "span_id"}), on=["trace", "span_id"], how="left")
            .with_columns(own_ms=(pl.col("duration_ms") - pl.col("covered_us").fill_null(0) / 1000).clip(0.0),
                          child_failed=pl.col("child_failed").fill_null(False)))


def _covered(children: pl.DataFrame) -> pl.DataFrame:
    """The children, sorted by parent and start, each with the time it `covered` that its earlier siblings had not:
    its interval less the latest end before it. That running latest end is one cumulative maximum over all the
    rows rather than one per parent (a window per parent costs seconds over a million calls): each parent's ends,
    taken from its first child's start, are lifted above every earlier parent's by its rank times the longest of
    them."""
    first = ((pl.col("trace") != pl.col("trace").shift(1)) | (pl.col("parent_id") != pl.col("parent_id").shift(1))
             ).fill_null(True)
    rows = children.with_columns(rank=first.cum_sum().cast(pl.Int64),
                                 base=pl.when(first).then(pl.col("c_start")).forward_fill())
    lift = int(rows.select((pl.col("c_end") - pl.col("base")).max()).item() or 0) + 1
    if rows.height * lift >= LIFT_LIMIT:  # parents long enough to overflow the lift: one window per parent
        before = pl.col("c_end").cum_max().shift(1).over("trace", "parent_id")
    else:
        lifted = pl.col("rank") * lift
        before = pl.when(~first).then((lifted + pl.col("c_end") - pl.col("base")).cum_max().shift(1)
                                      - lifted + pl.col("base"))
    return rows.with_columns(covered=(pl.col("c_end") - pl.max_horizontal("c_start", before.fill_null(
        pl.col("c_start")))).clip(lower_bound=0))


def entries(spans: pl.DataFrame) -> pl.DataFrame:
    """Per trace its entry span: the earliest of those whose parent is not stored (the longest, where two
    began together)."""
    stored = spans.select("trace", parent_id="span_id")
    roots = spans.join(stored, on=["trace", "parent_id"], how="anti")
    return (roots.sort("trace", "start_time", pl.col("duration_ms"), descending=[False, False, True])
            .group_by("trace", maintain_order=True).first()
            .select("trace", entry_service="service", entry_start="start_time", entry_ms="duration_ms",
                    entry_failed="failed", entry_tier="tier"))


@dataclass(frozen=True)
class Windows:
    """The baseline and observed windows, by the entry span's start."""

    baseline_start: datetime
    baseline_end: datetime
    observed_start: datetime
    observed_end: datetime

    def label(self) -> pl.Expr:
        """baseline, observed, or lookback (between them: where onsets are searched, in no comparison)."""
        start = pl.col("entry_start")
        return (pl.when((start >= self.baseline_start) & (start < self.baseline_end)).then(pl.lit("baseline"))
                .when((start >= self.observed_start) & (start < self.observed_end)).then(pl.lit("observed"))
                .when((start >= self.baseline_end) & (start < self.observed_start)).then(pl.lit("lookback")))


def culprits(store: StoreReader, windows: Windows, entry: Entry = EVERY_TRACE,
             tiers: dict | None = None) -> tuple[list[dict], dict]:
    """(culprits ranked by their share of the entry's growth, the entry's own change), over the traces of
    `entry`, their tiers as trace_spans reads them by `tiers`."""
    spans = own_times(trace_spans(store, windows.baseline_start, windows.observed_end, entry, tiers))
    traced = spans.join(entries(spans), on="trace").with_columns(window=windows.label()).filter(
        pl.col("window").is_not_null())
    per_trace = traced.group_by("trace").agg(pl.col("window", "entry_start", "entry_ms", "entry_failed").first(),
                                             spans=pl.len())
    counts = dict(per_trace.group_by("window").len().iter_rows())
    # Traces of one span each (services that send no calls' spans) say who slowed, not whether its own code did.
    linked = bool(per_trace.height) and per_trace["spans"].max() > 1
    if counts.get("baseline", 0) < MIN_TRACES or counts.get("observed", 0) < MIN_TRACES or not linked:
        return [], {"traces": counts, "linked": linked}
    entry = _entry_change(per_trace)
    found = (_latency_culprits(traced, counts, entry["latency_growth_ms"]) +
             _error_culprits(traced, counts, entry["error_growth"]))
    found.sort(key=lambda c: -c["share"])
    for culprit in found:
        culprit["onset"] = _onset(_measured(traced, culprit), per_trace, windows)
    # A cut explains no growth of the entry's latency or failures, so it follows those that do.
    found += _cut_culprits(traced, counts, per_trace, windows, {tuple(c[p] for p in PLACE) for c in found})
    for culprit in found:
        culprit["path"] = _path(traced, culprit)
    return found, {"traces": counts, "linked": linked, **entry}


def _measured(traced: pl.DataFrame, culprit: dict) -> pl.DataFrame:
    """(trace, x): what the culprit's measure took in each trace where it took anything."""
    place = pl.all_horizontal(pl.col(p) == (culprit[p] or "") for p in PLACE)
    calls, reached = pl.col("kind").is_in(CALLERS), pl.col("callee_service").is_not_null()
    if culprit["kind"] == ERRORS:
        return traced.filter(place & pl.col("failed") & ~pl.col("child_failed")).group_by("trace").agg(
            x=pl.lit(1.0))
    if culprit["kind"] == NETWORK:
        callee = pl.all_horizontal(pl.col(f"callee_{p}") == (culprit[p] or "") for p in PLACE)
        rows = traced.filter(calls & reached & (place | callee))
    else:
        rows = traced.filter(place & ~(calls & reached))
    return rows.group_by("trace").agg(x=pl.col("own_ms").sum())


def _onset(measured: pl.DataFrame, per_trace: pl.DataFrame, windows: Windows) -> datetime:
    """When the culprit's change began: the first ONSET_STEP after the baseline from which every step's mean per
    entry request lies ONSET_Z standard errors above the baseline's mean, to the end of the window (a change that
    has held since, found as early as its own traffic shows it; each step alone needs far fewer traces than the
    culprit's whole test); else the first whose mean, and the next one's, lie MIN_Z above; else the observed
    window's start."""
    values = per_trace.join(measured, on="trace", how="left").with_columns(pl.col("x").fill_null(0.0))
    base = values.filter(pl.col("window") == "baseline")["x"]
    mean, spread = base.mean(), base.std(ddof=0) or 0.0
    steps = (values.filter(pl.col("entry_start") >= windows.baseline_end)
             .group_by(step=pl.col("entry_start").dt.truncate(f"{int(ONSET_STEP.total_seconds())}s"))
             .agg(mean=pl.col("x").mean(), n=pl.len()).sort("step")
             .with_columns(above=pl.col("mean") > mean + MIN_Z * spread / pl.col("n").sqrt(),
                           raised=(pl.col("mean") > mean + ONSET_Z * spread / pl.col("n").sqrt()).cast(pl.Int8)))
    since = steps.filter(steps["raised"].reverse().cum_min().reverse() == 1)["step"]
    if len(since):
        return since[0]
    held = steps.filter(steps["above"] & steps["above"].shift(-1, fill_value=True))["step"]
    return held[0] if len(held) else windows.observed_start


def _entry_change(per_trace: pl.DataFrame) -> dict:
    stats = dict((w, (ms, failed)) for w, ms, failed in per_trace.group_by("window").agg(
        pl.col("entry_ms").mean(), pl.col("entry_failed").mean()).iter_rows())
    (base_ms, base_failed), (seen_ms, seen_failed) = stats["baseline"], stats["observed"]
    return {"baseline_ms": round(base_ms, 3), "observed_ms": round(seen_ms, 3),
            "latency_growth_ms": seen_ms - base_ms, "baseline_error_ratio": round(base_failed, 4),
            "observed_error_ratio": round(seen_failed, 4), "error_growth": seen_failed - base_failed}


def _welch(per_key: pl.DataFrame, key: list[str], counts: dict, within: bool = False) -> pl.DataFrame:
    """Per key: the mean of `x` per entry request in each window (traces without the key count 0) and its change
    (`growth`, what a share is of), with the change's Welch z. With `within`, the z is taken over the traces that
    hold the key: a service on a path one trace in twenty takes shows its change there, where the mean per entry
    request dilutes it in the other nineteen's zeros (and a path taken more often, at the same time per trace, is
    no one's fault)."""
    sums = per_key.group_by(*key, "window").agg(s1=pl.col("x").sum(), s2=(pl.col("x") ** 2).sum(), k=pl.len())
    n = pl.col("window").replace_strict(counts, return_dtype=pl.Float64) if not within else pl.col("k")
    sums = sums.with_columns(mean=pl.col("s1") / pl.col("window").replace_strict(counts, return_dtype=pl.Float64),
                             tested=pl.col("s1") / n).with_columns(
        var=(pl.col("s2") / n - pl.col("tested") ** 2).clip(0.0) / n)
    wide = sums.pivot("window", index=key, values=["mean", "tested", "var"]).fill_null(0.0)
    for column in ("mean_baseline", "mean_observed", "tested_baseline", "tested_observed", "var_baseline",
                   "var_observed"):
        if column not in wide.columns:
            wide = wide.with_columns(pl.lit(0.0).alias(column))
    change = pl.col("tested_observed") - pl.col("tested_baseline")
    return wide.with_columns(growth=pl.col("mean_observed") - pl.col("mean_baseline"),
                             z=change / (pl.col("var_baseline") + pl.col("var_observed")).sqrt().clip(1e-9))


def _latency_culprits(traced: pl.DataFrame, counts: dict, entry_growth: float) -> list[dict]:
    calls = pl.col("kind").is_in(CALLERS)
    reached = pl.col("callee_service").is_not_null()
    # A call no span answered counts as its caller's own time: it was measured there, and the caller's node (a
    # starved pod waits longer on everything) can explain it as well as the callee can; the service graph still
    # names the peer it called.
    selves = _welch(traced.filter(~(calls & reached)).group_by("trace", "window", *PLACE).agg(
        x=pl.col("own_ms").sum()), list(PLACE), counts, within=True)
    edge = [*PLACE, "callee_service", "callee_pod", "callee_node"]
    edges = _welch(traced.filter(calls & reached).group_by("trace", "window", *edge).agg(x=pl.col("own_ms").sum()),
                   edge, counts, within=True)
    moved = (pl.col("z") >= MIN_Z) & (pl.col("growth") >= MIN_GROWTH_MS)
    found = [_culprit(row, SELF, "ms", entry_growth) for row in selves.filter(moved).iter_rows(named=True)]
    found += _network_culprits(edges.with_columns(moved=moved), entry_growth)
    return [c for c in found if c["share"] >= MIN_SHARE]


def _network_culprits(edges: pl.DataFrame, entry_growth: float) -> list[dict]:
    """The pods that the slowed edges (`moved`) share, greedily. A delay on a pod's network slows every call to and
    from it, so a pod is weighed by the gap added on its slowed edges times the share of its edges that slowed:
    a caller with one slow callee among many is not the place, the callee is."""
    calls: dict[tuple, int] = {}
    for row in edges.iter_rows(named=True):
        for end in (tuple(row[p] for p in PLACE), tuple(row[f"callee_{p}"] for p in PLACE)):
            calls[end] = calls.get(end, 0) + 1
    rows, found = edges.filter("moved").to_dicts(), []
    while rows:
        ends: dict[tuple, list[dict]] = {}
        for row in rows:
            ends.setdefault(tuple(row[p] for p in PLACE), []).append(row)
            ends.setdefault(tuple(row[f"callee_{p}"] for p in PLACE), []).append(row)
        place, through = max(ends.items(), key=lambda item: sum(r["growth"] for r in item[1]) * len(item[1]) /
                             calls[item[0]])
        found.append(_culprit({**dict(zip(PLACE, place)), "mean_baseline": sum(r["mean_baseline"] for r in through),
                               "mean_observed": sum(r["mean_observed"] for r in through),
                               "growth": sum(r["growth"] for r in through), "z": min(r["z"] for r in through)},
                              NETWORK, "ms", entry_growth,
                              edges=[{"caller": r["service"], "callee": r["callee_service"],
                                      "baseline_ms": round(r["mean_baseline"], 3),
                                      "observed_ms": round(r["mean_observed"], 3)} for r in through]))
        rows = [r for r in rows if not any(r is t for t in through)]
    return found


def _error_culprits(traced: pl.DataFrame, counts: dict, entry_growth: float) -> list[dict]:
    began = traced.filter(pl.col("failed") & ~pl.col("child_failed")).group_by("trace", "window", *PLACE).agg(
        x=pl.lit(1.0))
    if began.is_empty():
        return []
    moved = _welch(began, list(PLACE), counts).filter((pl.col("z") >= MIN_Z) & (pl.col("growth") > 0))
    found = [_culprit(row, ERRORS, "failures per request", entry_growth) for row in moved.iter_rows(named=True)]
    return [c for c in found if c["share"] >= MIN_SHARE]


def _cut_culprits(traced: pl.DataFrame, counts: dict, per_trace: pl.DataFrame, windows: Windows,
                  named: set[tuple]) -> list[dict]:
    """The places whose calls per request fell by CUT_DROP or more (a Welch z of -MIN_Z over the traces that
    reach them), each named at where its cut traces now end (`_cut_end`); the places already `named` are not
    named again. Its share is the fall's; its onset that of the fall."""
    made = traced.group_by("trace", "window", *PLACE).agg(x=pl.col("kind").is_in(CALLERS).sum().cast(pl.Float64))
    fell = _welch(made, list(PLACE), counts, within=True).filter(
        (pl.col("z") <= -MIN_Z) & (pl.col("tested_observed") <= (1 - CUT_DROP) * pl.col("tested_baseline")))
    found = []
    for row in fell.sort("z").iter_rows(named=True):
        at = tuple(row[p] for p in PLACE)
        end = _cut_end(traced, at)
        if end in named:
            continue
        named.add(end)
        fall = row["tested_baseline"] - row["tested_observed"]  # its share: of the calls the place made
        culprit = _culprit({**row, **dict(zip(PLACE, end)), "mean_baseline": row["tested_baseline"],
                            "mean_observed": row["tested_observed"], "growth": fall, "z": -row["z"]},
                           CUT, "calls per request", row["tested_baseline"],
                           cut_at={"service": row["service"], "pod": row["pod"] or None})
        calls_made = made.filter(pl.all_horizontal(pl.col(p) == v for p, v in zip(PLACE, at))).select(
            "trace", x=-pl.col("x"))  # fewer calls, a higher measure: the onset looks for a rise
        culprit["onset"] = _onset(calls_made, per_trace, windows)
        found.append(culprit)
    return found


def _cut_end(traced: pl.DataFrame, at: tuple) -> tuple:
    """Where the traces through `at` now end: per trace, the place of the callee whose answer came last among
    `at`'s calls (`at` itself where it made none); the end whose share of those traces grew the most from the
    baseline, where it grew by MIN_Z standard errors (a two-proportion z), else `at`."""
    here = traced.filter(pl.all_horizontal(pl.col(p) == v for p, v in zip(PLACE, at)))
    last = (here.filter(pl.col("kind").is_in(CALLERS) & pl.col("callee_service").is_not_null()).sort("end_us")
            .group_by("trace").agg(*(pl.col(f"callee_{p}").last().alias(p) for p in PLACE)))
    ends = (here.group_by("trace").agg(pl.col("window").first()).join(last, on="trace", how="left")
            .with_columns(pl.col(p).fill_null(v) for p, v in zip(PLACE, at)))
    n = dict(ends.group_by("window").len().iter_rows())
    if not n.get("baseline") or not n.get("observed"):
        return at
    shares = ends.group_by(*PLACE, "window").len().pivot("window", index=list(PLACE), values="len").fill_null(0)
    best, best_z = at, MIN_Z
    for row in shares.iter_rows(named=True):
        k_b, k_o = row.get("baseline", 0), row.get("observed", 0)
        pooled = (k_b + k_o) / (n["baseline"] + n["observed"])
        spread = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n["baseline"] + 1 / n["observed"]))
        z = (k_o / n["observed"] - k_b / n["baseline"]) / spread
        if z >= best_z:
            best, best_z = tuple(row[p] for p in PLACE), z
    return best


def _culprit(row: dict, kind: str, unit: str, entry_growth: float, **extra) -> dict:
    share = row["growth"] / entry_growth if entry_growth > 0 else 1.0
    return {"service": row["service"], "pod": row["pod"] or None, "node": row["node"], "kind": kind,
            "share": round(min(1.0, share), 3), "baseline": _round(row["mean_baseline"]),
            "observed": _round(row["mean_observed"]), "unit": unit, "z": round(min(row["z"], 1e6), 1), **extra}


def described(culprit: dict) -> str:
    """A culprit's change in words, for tables and reports."""
    change = f"{culprit['baseline']} -> {culprit['observed']} {culprit['unit']}"
    if culprit["kind"] == CUT:
        return f"cut: {culprit['cut_at']['service']}'s {change}, {culprit['share']:.0%} fewer; its requests end here"
    return f"{culprit['kind']}: {change}, {culprit['share']:.0%} of the entry's change"


def _path(traced: pl.DataFrame, culprit: dict) -> list[str]:
    """The services from the entry to the culprit, in the observed trace where it took the most."""
    where = pl.all_horizontal(pl.col(p) == (culprit[p] or "") for p in PLACE) & (pl.col("window") == "observed")
    spot = traced.filter(where).sort("own_ms", descending=True).head(1)
    if spot.is_empty():
        return [culprit["service"]]
    trace = traced.filter(pl.col("trace") == spot["trace"][0])
    parent_of = dict(zip(trace["span_id"].to_list(), trace["parent_id"].to_list()))
    service_of = dict(zip(trace["span_id"].to_list(), trace["service"].to_list()))
    path, span = [], spot["span_id"][0]
    while span in service_of and len(path) < 64:  # a trace's depth; a cycle of bad ids ends here too
        if not path or path[-1] != service_of[span]:
            path.append(service_of[span])
        span = parent_of[span]
    if culprit["service"] not in path:
        path.insert(0, culprit["service"])
    return path[::-1]


def service_graph(store: StoreReader, since: datetime, until: datetime) -> dict:
    """The services with their pods and nodes, and the calls between them: calls per second, mean latency, error
    ratio and mean network gap (the CLIENT span less the SERVER span it reached), over [since, until), aggregated
    where the spans are stored (service_graph_nodes.sql, service_graph_edges.sql)."""
    params = {"since": since, "until": until, **_entry_params(EVERY_TRACE), "uninstrumented": UNINSTRUMENTED}
    seconds = max((until - since).total_seconds(), 1e-9)
    services = store.frame(store.sql("service_graph_nodes"), params)
    kinds = sorted({k for listed in services["kinds"].to_list() for k in listed})
    nodes = services.filter(pl.col("serves").cast(pl.Boolean)).select(
        id="service", service="service", pods="pods", nodes="nodes", requests_per_s=pl.col("requests") / seconds,
        mean_ms="mean_ms", error_ratio="error_ratio")
    edges = store.frame(store.sql("service_graph_edges"), params).select(
        id=pl.concat_str("source", pl.lit("->"), "target"), source="source", target="target",
        calls_per_s=pl.col("calls") / seconds, mean_ms="mean_ms", error_ratio="error_ratio",
        network_gap_ms="network_gap_ms")
    return {"since": since, "until": until, "nodes": _rounded(nodes.to_dicts()), "edges": _rounded(edges.to_dicts()),
            "kinds": {str(k): SPAN_KINDS.get(k, "internal") for k in kinds}}


def _rounded(rows: list[dict]) -> list[dict]:
    return [{k: _round(v) if isinstance(v, float) else v for k, v in row.items()} for row in rows]


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")
