"""SLI windows per tier and their merge into incidents per (tier, service, node).

Both SLIs are ratios, as docs/slo-spec.md defines them: the share of requests slower than the tier's threshold
against the allowance its percentile implies (p99: 1 %), and the share of failed requests against the error
budget (1 - availability). A tier's token objectives (TTFT, TPOT, queue time) are the latency SLI's kind, each
over the requests whose spans give that time. A window violates only when its slow (or failed) requests would be
improbable for a service running exactly at the objective: the upper tail of Poisson(requests x allowance). A
window with fewer than MIN_BLOCK_REQUESTS requests is not judged alone: it is pooled with the windows that follow
it (up to MAX_BLOCK_WINDOWS) into one test whose verdict they share.

Every test of the analysis (every tier, service and node, every SLI) is judged together, with the false
discovery rate held at FLEET_FDR (Benjamini-Hochberg): on a healthy fleet the chance that any window at all
violates is at most FLEET_FDR, however many nodes and hours are analysed, while a real fault, which makes many
windows bad at once, lowers the bar for its own windows. Violating windows a short gap apart merge into one
incident; an incident needs violating windows from MIN_BLOCKS separate tests, so a single-window blip is not
an incident.

A service on more than one node is also judged over all of them together, as node EVERY_NODE, in the same
family of tests: a fault deep in a mesh slows a few of the requests of each of many entry pods, too few on any
one node to be judged there. Such an incident is kept only where no incident of its tier and service on one node
overlaps it, since that one says where.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from sloscope.catalog import EVERY_NODE, UNKNOWN_NODE
from sloscope.slo_spec import TOKEN_SLIS, SloSpec, TierObjective

from sloscope.analytics.significance import fleet_discoveries, poisson_tail
from sloscope.analytics.store_api import StoreReader

FLEET_FDR = 0.01
MIN_BLOCK_REQUESTS = 10  # fewer and a window is pooled with its neighbours before it is judged
MAX_BLOCK_WINDOWS = 6
MIN_REQUESTS = 5  # below this a window's percentile says nothing (shown, never tested)
MIN_BLOCKS = 2
MAX_GAP_WINDOWS = 3
WINDOW_KEY = ("tier", "service", "node")  # whose windows are tested apart
PARENT_LOOKBACK = timedelta(minutes=10)  # how long before a request its parent span may have started


@dataclass(frozen=True)
class Sli:
    """One SLI as sli_windows.sql counts it per window: `bad` of `judged` requests. Its windows' p-values are
    `<name>_p` and their verdicts `<name>_violation`."""

    kind: str  # the incident's sli.kind
    name: str
    bad: str
    judged: str

    @property
    def p(self) -> str:
        return f"{self.name}_p"

    @property
    def violation(self) -> str:
        return f"{self.name}_violation"


LATENCY = Sli("latency", "latency", "slow", "requests")
AVAILABILITY = Sli("availability", "error", "failures", "requests")
TOKENS = tuple(Sli(kind, kind, f"{kind}_slow", f"{kind}_requests") for kind in TOKEN_SLIS)
SLIS = (LATENCY, AVAILABILITY, *TOKENS)
COUNTS = ("requests", "failures", "slow", *(c for sli in TOKENS for c in (sli.judged, sli.bad)))


def tier_slis(objective: TierObjective) -> tuple[Sli, ...]:
    """The SLIs a tier is judged by: latency and availability, and the token objectives it gives."""
    return (LATENCY, AVAILABILITY, *(sli for sli in TOKENS if objective.token(sli.kind) is not None))


@dataclass(frozen=True)
class Incident:
    tier: str
    service: str
    node: str
    start: datetime
    end: datetime
    sli: dict
    windows: int


def slow_allowance(objective: TierObjective) -> float:
    """The share of requests the percentile allows above the threshold (p99: 0.01)."""
    return 1.0 - objective.percentile / 100.0


def _key_changes(frame: pl.DataFrame) -> np.ndarray:
    """Whether each window's (tier, service, node) differs from the window's before it."""
    return frame.select(pl.any_horizontal(pl.col(key).ne_missing(pl.col(key).shift()) for key in WINDOW_KEY)
                        .fill_null(True)).to_series().to_numpy()


def _key_hashes(frame: pl.DataFrame) -> pl.Series:
    return frame.select(pl.struct(WINDOW_KEY).hash()).to_series()


def _in_window_order(frame: pl.DataFrame) -> pl.DataFrame:
    """The windows of each (tier, service, node) together, in time order. They are sorted by the hash of their
    key, in a third of the time a sort by the names takes (the engine takes twice as long again). Two keys that
    shared a hash would interleave, and then the key changes more often than the hash does: those windows are
    sorted by their names."""
    by_hash = frame.with_columns(key_hash=_key_hashes(frame)).sort("key_hash", "window_start")
    if _key_changes(by_hash).sum() == by_hash["key_hash"].n_unique():
        return by_hash.drop("key_hash")
    return frame.sort(*WINDOW_KEY, "window_start")


def _blocks(frame: pl.DataFrame, step_s: float) -> np.ndarray:
    """Test ids: consecutive windows of one (tier, service, node) pooled until they hold MIN_BLOCK_REQUESTS
    requests or span MAX_BLOCK_WINDOWS windows. The frame is in _in_window_order."""
    span_us = round(step_s * MAX_BLOCK_WINDOWS * 1e6)
    new_key = _key_changes(frame)
    starts = frame["window_start"].dt.epoch("us").to_numpy()
    requests = frame["requests"].to_numpy()
    # A window that holds enough requests fills its block, so the window after it begins one: only the windows
    # after a small one depend on what was pooled before them, and only they are walked one by one.
    begins = new_key.copy()
    begins[1:] |= requests[:-1] >= MIN_BLOCK_REQUESTS
    first = pooled = 0
    for i in np.flatnonzero(~begins).tolist():
        if begins[i - 1]:
            first, pooled = int(starts[i - 1]), int(requests[i - 1])
        if pooled >= MIN_BLOCK_REQUESTS or starts[i] >= first + span_us:
            begins[i] = True
            first, pooled = int(starts[i]), 0
        pooled += int(requests[i])
    return np.cumsum(begins) - 1


def judging_params(spec: SloSpec) -> dict:
    """The parameters of judged_requests.sql: the tiers judged at named services, those services ('TIER SERVICE'),
    and each one's own threshold."""
    named = [(tier, s) for tier in spec.tiers.values() for s in tier.services]
    return {"named_tiers": sorted({tier.name for tier, _ in named}),
            "tier_services": [f"{tier.name} {s.service}" for tier, s in named],
            "service_keys": [f"{tier.name} {s.service}" for tier, s in named],
            "service_thresholds_ms": [float(s.threshold_ms) for _, s in named],
            "parent_lookback_s": PARENT_LOOKBACK.total_seconds()}


def sli_params(store: StoreReader, spec: SloSpec, since: datetime, until: datetime) -> dict:
    """The parameters of sli_windows.sql for every tier of the spec in [since, until): a token objective's
    threshold is infinite where the tier has none, so that none of its requests is counted over it."""
    objectives = list(spec.tiers.values())
    tokens = {f"{sli.kind}_thresholds_ms": [_token_threshold(o, sli.kind) for o in objectives] for sli in TOKENS}
    return {**store.tier_params(spec), **judging_params(spec), "tiers": [o.name for o in objectives],
            "thresholds_ms": [float(o.threshold_ms) for o in objectives], **tokens, "step_s": spec.resolution_s,
            "since": since, "until": until}


def _token_threshold(objective: TierObjective, kind: str) -> float:
    token = objective.token(kind)
    return math.inf if token is None else float(token.threshold_ms)


def sli_windows(store: StoreReader, spec: SloSpec, since: datetime, until: datetime) -> dict[str, pl.DataFrame]:
    """Per tier of the spec, its windows per (service, node) with their test (`block`) and a p-value per SLI
    (`latency_p` for the slow requests, `error_p` for the failures, `ttft_p` ...), each against a service at exactly
    the objective (1 where the tier has no such objective). One query reads the requests for every
    tier."""
    objectives = list(spec.tiers.values())
    tiers = [o.name for o in objectives]
    frame = _in_window_order(_with_every_node(store.computed("sli_windows", sli_params(store, spec, since, until))))
    block = _blocks(frame, spec.resolution_s)
    # A block's windows are next to each other: its sums are taken over its run of rows, and its p-values are
    # handed back to its windows by its number.
    firsts = np.flatnonzero(_first_of_test(block))
    sums = {c: np.add.reduceat(frame[c].to_numpy(), firsts) for c in COUNTS}
    test_tier = frame["tier"].gather(firsts)
    allowed = {LATENCY: slow_allowance, AVAILABILITY: lambda o: o.error_budget,
               **{sli: (lambda o, kind=sli.kind: o.token(kind).allowance if o.token(kind) else 0.0) for sli in TOKENS}}
    own = {f"{o.name} {s.service}": o.at(s.service) for o in objectives for s in o.services}
    tested = test_tier + " " + frame["service"].gather(firsts) if own else None
    p_values = {}
    for sli, allowance_of in allowed.items():
        allowance = test_tier.replace_strict({o.name: allowance_of(o) for o in objectives}, return_dtype=pl.Float64)
        if own:  # services the spec gives their own objective
            allowance = tested.replace_strict({key: allowance_of(o) for key, o in own.items()}, default=allowance,
                                              return_dtype=pl.Float64)
        p_values[sli.p] = _tails(sums[sli.bad], sums[sli.judged] * allowance.to_numpy())[block]
    frame = frame.with_columns(block=pl.Series(block), **p_values)
    return {tier: frame.filter(pl.col("tier") == tier).drop("tier") for tier in tiers}


def _with_every_node(frame: pl.DataFrame) -> pl.DataFrame:
    """The windows, and those of each (tier, service) on more than one node summed over its nodes (EVERY_NODE). A
    service's threshold is the same on every node, so the sums count its slow requests exactly. The unknown node
    is no node of its own: a service on one node with a few requests that named none is on one node."""
    known = pl.col("node").filter(pl.col("node") != UNKNOWN_NODE)
    spread = frame.group_by("tier", "service").agg(nodes=known.n_unique()).filter(pl.col("nodes") > 1)
    every = (frame.join(spread.select("tier", "service"), on=["tier", "service"])
             .group_by("tier", "service", "window_start").agg(pl.col(COUNTS).sum())
             .with_columns(node=pl.lit(EVERY_NODE)))
    return pl.concat([frame, every.select(frame.columns).cast(frame.schema)])


def window_latencies(store: StoreReader, spec: SloSpec, objective: TierObjective, since: datetime,
                     until: datetime, measure: str = LATENCY.kind) -> pl.DataFrame:
    """One tier's percentile of the latency (or of a token time, `measure`: ttft, tpot, queue) per (service, node)
    and window, at its objective's percentile, as people are shown it: the verdicts read the slow requests
    instead, so finding incidents does not compute it."""
    token = objective.token(measure)
    percentile = objective.percentile if token is None else token.percentile
    return store.frame(store.sql("window_latencies"), {**_window_params(store, spec, objective, since, until),
                                                       "quantile": percentile / 100.0, "measure": measure})


def _window_params(store: StoreReader, spec: SloSpec, objective: TierObjective, since: datetime,
                   until: datetime) -> dict:
    return {**store.tier_params(spec), **judging_params(spec), "tier": objective.name, "step_s": spec.resolution_s,
            "since": since, "until": until, "every_node": EVERY_NODE, "unknown_node": UNKNOWN_NODE}


def _tails(bad: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """poisson_tail of each test, computed only where it can be below 1 (more bad requests than expected): on a
    healthy fleet that is a few of the fleet's windows. A test that allows none (no such objective) is 1."""
    p = np.ones(len(bad))
    for i in np.flatnonzero((bad > expected) & (expected > 0)):
        p[i] = poisson_tail(int(bad[i]), float(expected[i]))
    return p


def judge_fleet(frames: dict[str, pl.DataFrame], spec: SloSpec) -> dict[str, pl.DataFrame]:
    """Per tier, its windows with a `<name>_violation` per SLI (latency, error, ttft ...) and `violating`, every
    test of every tier judged together at FLEET_FDR: a tier's tests are those of the SLIs it is judged by
    (tier_slis), so that an objective no tier gives adds no test to the family. Each tier's windows are in block
    order, as sli_windows gives them."""
    first = {tier: _first_of_test(f["block"].to_numpy()) for tier, f in frames.items()}
    tested = [(tier, sli) for tier in frames for sli in tier_slis(spec.tiers[tier])]
    p_values = np.concatenate([frames[tier][sli.p].to_numpy()[first[tier]] for tier, sli in tested]
                              or [np.zeros(0)])
    found = fleet_discoveries(p_values, FLEET_FDR)
    verdicts: dict[str, dict] = {tier: {sli.violation: np.zeros(len(f), dtype=bool) for sli in SLIS}
                                 for tier, f in frames.items()}
    at = 0
    for tier, sli in tested:
        is_first = first[tier]
        n = int(is_first.sum())
        verdicts[tier][sli.violation] = found[at:at + n][np.cumsum(is_first) - 1]
        at += n
    return {tier: frames[tier].with_columns(**{name: pl.Series(v, dtype=pl.Boolean) for name, v in found_at.items()},
                                            violating=pl.Series(np.logical_or.reduce(list(found_at.values())),
                                                                dtype=pl.Boolean))
            for tier, found_at in verdicts.items()}


def _first_of_test(block: np.ndarray) -> np.ndarray:
    """Whether each window is the first of its test: a test's windows are next to each other."""
    return np.diff(block, prepend=-1) != 0


def _runs(windows: pl.DataFrame, step_s: float) -> pl.DataFrame:
    """Group violating windows into runs per (service, node), allowing MAX_GAP_WINDOWS missing windows."""
    max_gap = timedelta(seconds=step_s * (MAX_GAP_WINDOWS + 1))
    return (windows.filter(pl.col("violating")).sort("service", "node", "window_start")
            .with_columns(new_run=(pl.col("window_start").diff().over("service", "node").fill_null(max_gap * 2)
                                   > max_gap))
            .with_columns(run=pl.col("new_run").cum_sum())
            .group_by("service", "node", "run")
            .agg(start=pl.col("window_start").min(), last=pl.col("window_start").max(), windows=pl.len(),
                 tests=pl.col("block").n_unique(),
                 **{f"{sli.name}_windows": pl.col(sli.violation).sum() for sli in SLIS})
            .filter(pl.col("tests") >= MIN_BLOCKS).sort("start", "service", "node"))


def _rounded(ms) -> float | None:
    """A latency for the JSON, None where there is none (a percentile of no requests is NaN, which JSON lacks)."""
    return round(float(ms), 1) if ms is not None and math.isfinite(ms) else None


def _measured(objective: TierObjective, run: dict) -> tuple[str, float, float]:
    """What a run's incident is reported on: the SLI with the most violating windows (the first of SLIS where
    several have as many), with the percentile and threshold it is judged at."""
    kind = max(SLIS, key=lambda sli: run[f"{sli.name}_windows"]).kind
    token = objective.token(kind)
    if token is not None:
        return kind, token.percentile, token.threshold_ms
    own = objective.at(run["service"])
    return kind, own.percentile, own.threshold_ms


def _incident_slis(store: StoreReader, spec: SloSpec, objective: TierObjective, runs: list[dict],
                   ends: list[datetime]) -> list[dict]:
    """The SLI of each of a tier's runs over its whole incident (to its end in `ends`), from one query per
    measured time and percentile (incident_sli.sql)."""
    measured, what = {}, [_measured(objective, run) for run in runs]
    for measure, percentile in sorted({(kind, percentile) for kind, percentile, _ in what}):
        places = [i for i, (kind, p, _) in enumerate(what) if (kind, p) == (measure, percentile)]
        alike = [runs[i] for i in places]
        starts = [run["start"] for run in alike]
        kept = [ends[i] for i in places]
        measured.update({places[incident - 1]: rest for incident, *rest in store.rows(store.sql("incident_sli"), {
            **store.tier_params(spec), **judging_params(spec), "tier": objective.name, "quantile": percentile / 100,
            "measure": measure, "incident_thresholds_ms": [float(what[i][2]) for i in places],
            "services": [run["service"] for run in alike], "nodes": [run["node"] for run in alike],
            "every_node": EVERY_NODE, "starts": starts, "ends": kept, "start": min(starts), "end": max(kept)})})
    return [_incident_sli(objective.at(run["service"]), what[place], *measured.get(place, (0, 0, 0, 0, None)))
            for place, run in enumerate(runs)]


def _incident_sli(objective: TierObjective, what: tuple[str, float, float], requests: int, failures: int,
                  judged: int, slow: int, measured_ms) -> dict:
    kind, percentile, threshold_ms = what
    if kind == AVAILABILITY.kind:
        return {"kind": kind, "observed_error_ratio": round(failures / requests, 5) if requests else None,
                "objective_error_ratio": round(objective.error_budget, 5)}
    return {"kind": kind, "percentile": percentile, "observed_ms": _rounded(measured_ms), "objective_ms": threshold_ms,
            "observed_slow_ratio": round(slow / judged, 5) if judged else None,
            "objective_slow_ratio": round(1.0 - percentile / 100.0, 5)}


def _apart_from_nodes(runs: list[dict]) -> list[dict]:
    """The runs less those over EVERY_NODE that overlap a run of their service on one node."""
    own = [r for r in runs if r["node"] != EVERY_NODE]
    return [r for r in runs if r["node"] != EVERY_NODE or not any(
        o["service"] == r["service"] and o["start"] <= r["last"] and r["start"] <= o["last"] for o in own)]


def find_incidents(store: StoreReader, spec: SloSpec, since: datetime, until: datetime) -> list[Incident]:
    frames = sli_windows(store, spec, since, until)
    incidents = []
    step = timedelta(seconds=spec.resolution_s)
    for tier, windows in judge_fleet(frames, spec).items():
        runs = _apart_from_nodes(list(_runs(windows, spec.resolution_s).iter_rows(named=True)))
        ends = [run["last"] + step for run in runs]
        for run, end, sli in zip(runs, ends, _incident_slis(store, spec, spec.tiers[tier], runs, ends)):
            incidents.append(Incident(tier, run["service"], run["node"], run["start"], end, sli, run["windows"]))
    return sorted(incidents, key=lambda i: (i.start, i.tier, i.service, i.node))
