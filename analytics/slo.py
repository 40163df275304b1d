"""SLI windows per tier and their merge into incidents per (tier, service, node).

A window violates its tier's SLO when the latency percentile exceeds the objective, or when its error ratio
exceeds the budget. Error ratios of small windows are mostly noise (one failure in 30 requests is 3 %), so
"exceeds the budget" is tested, not eyeballed: the window's failures must be improbable (p < ERROR_ALPHA)
for a Poisson process running exactly at the budget. Violating windows a short gap apart merge into one
incident; an incident needs MIN_WINDOWS violating windows, so a single-window blip is not an incident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

import polars as pl

from sloscope.slo_spec import SloSpec, TierObjective

from analytics.store import Store, sql

ERROR_ALPHA = 1e-3
MIN_REQUESTS = 5  # below this a window's percentile says nothing
MIN_WINDOWS = 2
MAX_GAP_WINDOWS = 3


@dataclass(frozen=True)
class Incident:
    tier: str
    service: str
    node: str
    start: datetime
    end: datetime
    sli: dict
    windows: int


@lru_cache(maxsize=65536)
def failures_needed(requests: int, budget: float) -> int:
    """Smallest failure count that a window of `requests` running at exactly the budget would reach with
    probability below ERROR_ALPHA (upper tail of Poisson(requests * budget))."""
    lam = requests * budget
    term = cdf = math.exp(-lam)
    k = 0
    while 1.0 - cdf >= ERROR_ALPHA and k <= requests:
        k += 1
        term *= lam / k
        cdf += term
    return k + 1


def sli_windows(store: Store, spec: SloSpec, objective: TierObjective, since: datetime, until: datetime) -> pl.DataFrame:
    frame = store.frame(sql("sli_windows"), {
        "tier": objective.name, "quantile": objective.percentile / 100.0, "step_s": spec.resolution_s,
        "since": since, "until": until})
    needed = [failures_needed(int(n), objective.error_budget) for n in frame["requests"].to_list()]
    return frame.with_columns(
        latency_violation=(pl.col("latency_ms") > objective.threshold_ms) & (pl.col("requests") >= MIN_REQUESTS),
        error_violation=pl.col("failures") >= pl.Series(needed, dtype=pl.Int64),
    ).with_columns(violating=pl.col("latency_violation") | pl.col("error_violation"))


def _runs(windows: pl.DataFrame, step_s: float) -> pl.DataFrame:
    """Group violating windows into runs per (service, node), allowing MAX_GAP_WINDOWS missing windows."""
    max_gap = timedelta(seconds=step_s * (MAX_GAP_WINDOWS + 1))
    return (windows.filter(pl.col("violating")).sort("service", "node", "window_start")
            .with_columns(new_run=(pl.col("window_start").diff().over("service", "node").fill_null(max_gap * 2)
                                   > max_gap))
            .with_columns(run=pl.col("new_run").cum_sum())
            .group_by("service", "node", "run")
            .agg(start=pl.col("window_start").min(), last=pl.col("window_start").max(), windows=pl.len(),
                 latency_windows=pl.col("latency_violation").sum(), error_windows=pl.col("error_violation").sum())
            .filter(pl.col("windows") >= MIN_WINDOWS).sort("start", "service", "node"))


def _incident_sli(store: Store, objective: TierObjective, run: dict, end: datetime) -> dict:
    requests, failures, latency_ms = store.rows(sql("incident_sli"), {
        "tier": objective.name, "service": run["service"], "node": run["node"], "quantile": objective.percentile / 100,
        "start": run["start"], "end": end})[0]
    if run["latency_windows"] >= run["error_windows"]:
        return {"kind": "latency", "percentile": objective.percentile, "observed_ms": round(float(latency_ms), 1),
                "objective_ms": objective.threshold_ms}
    return {"kind": "availability", "observed_error_ratio": round(failures / requests, 5) if requests else None,
            "objective_error_ratio": round(objective.error_budget, 5)}


def find_incidents(store: Store, spec: SloSpec, since: datetime, until: datetime) -> list[Incident]:
    incidents = []
    step = timedelta(seconds=spec.resolution_s)
    for objective in spec.tiers.values():
        windows = sli_windows(store, spec, objective, since, until)
        for run in _runs(windows, spec.resolution_s).iter_rows(named=True):
            end = run["last"] + step
            incidents.append(Incident(objective.name, run["service"], run["node"], run["start"], end,
                                      _incident_sli(store, objective, run, end), run["windows"]))
    return sorted(incidents, key=lambda i: (i.start, i.tier, i.service, i.node))
