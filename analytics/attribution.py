"""Ranking the physical causes of an incident from the catalog signals of its node.

For every signal series of every node: a robust baseline (median and IQR, as BARO does) from a quiet period
before the incident, and a robust z-score per step, counted only in the signal's harmful direction. A series
is evidence for a cause (taxonomy) when

- it moved: its median during the incident, and around the moment the SLI broke, are many robust deviations
  from baseline (magnitude);
- it moved first: its onset (first of two consecutive anomalous steps) is at or before the SLI broke; a
  signal that only moves afterwards is an effect of the incident, not its cause (precedence);
- it stayed moved: anomalous in most of the incident's steps (consistency);
- it moved here: the same signal did not move on the other nodes at the same time, which would make it a
  fleet-wide change (a rollout, the weather) rather than this node's problem (locality).

The cause score is the best of its series' scores, in [0, 1]. A cause whose signals sit downstream of other
causes' (taxonomy `explained_by`: a syscall that waits on the disk or for a CPU is slow because of them) keeps
only the part of its score that they leave unexplained: score x (1 - the best of theirs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from sloscope import catalog, taxonomy

from analytics.store import Store, sql

THRESHOLD = 3.0  # robust z above which a step counts as anomalous
BASELINE = timedelta(minutes=10)
LOOKBACK = timedelta(minutes=1)  # onsets are searched from this long before the incident started
MAX_OBSERVED = timedelta(minutes=5)  # only the incident's first minutes say what started it
GROWTH_WINDOW = timedelta(minutes=1)
GROWTH_SUFFIX = ":growth_per_min"
GROWTH_NOISE_FLOOR = 0.01
EFFECT_PENALTY = 0.25
MIN_SCORE = 0.05  # causes scoring below this are not worth a reader's attention
IQR_TO_SIGMA = 1.349


@dataclass(frozen=True)
class Window:
    baseline_start: datetime
    analysis_start: datetime
    incident_start: datetime
    incident_end: datetime
    resolution_s: float  # the SLO spec's SLI step

    @classmethod
    def around(cls, start: datetime, end: datetime, resolution_s: float, baseline: timedelta = BASELINE,
               lookback: timedelta = LOOKBACK) -> "Window":
        """The window for an episode of trouble that began at `start` (the first SLI break) and lasted to `end`:
        `baseline` long, ending `lookback` before `start` (onsets are searched from there)."""
        analysis_start = start - lookback
        return cls(analysis_start - baseline, analysis_start, start, min(end, start + MAX_OBSERVED), resolution_s)

    @property
    def step_s(self) -> float:
        """Signals are resampled twice as finely as the SLI, so an onset can be placed within a window."""
        return self.resolution_s / 2

    @property
    def precedence_tolerance(self) -> timedelta:
        # The incident starts at the start of its first violating SLI window, so the SLI may have broken up
        # to one window later; one more window allows for the signal's own sampling and ramp.
        return timedelta(seconds=2 * self.resolution_s)


def signal_steps(store: Store, window: Window) -> pl.DataFrame:
    steps = store.frame(sql("signal_steps"), {"since": window.baseline_start, "until": window.incident_end,
                                              "step_s": window.step_s})
    return pl.concat([steps, _growth_series(steps, window.step_s)])


def _growth_series(steps: pl.DataFrame, step_s: float) -> pl.DataFrame:
    """Relative growth per minute of GPU memory usage: the leak signature (Contract 5's seed rule)."""
    lag = max(1, round(GROWTH_WINDOW.total_seconds() / step_s))
    usage = steps.filter(pl.col("metric") == "hw.gpu.memory.usage").sort("node", "attributes", "step")
    previous = pl.col("value").shift(lag).over("node", "attributes")
    return usage.with_columns(
        metric=pl.lit("hw.gpu.memory.usage" + GROWTH_SUFFIX),
        value=(pl.col("value") - previous) / previous * (60.0 / (lag * step_s)),
    ).drop_nulls("value").select(steps.columns)


def _direction_and_floor(metric: str) -> tuple[float, float]:
    if metric.endswith(GROWTH_SUFFIX):
        return 1.0, GROWTH_NOISE_FLOOR
    sig = catalog.BY_NAME.get(metric)
    if sig is None:
        return 1.0, 0.0
    return (1.0 if sig.harmful is catalog.Direction.UP else -1.0), sig.noise_floor


def series_scores(steps: pl.DataFrame, window: Window, directional: bool = True) -> pl.DataFrame:
    """Per series (node, metric, attributes): baseline, observed, robust z of the observed level, onset and
    consistency. With directional=False the z-score is absolute (for the BARO-style baseline)."""
    metrics = steps["metric"].unique().to_list()
    dirs = {m: _direction_and_floor(m) for m in metrics}
    meta = pl.DataFrame({"metric": metrics, "direction": [dirs[m][0] for m in metrics],
                         "floor": [dirs[m][1] for m in metrics]}, schema={"metric": pl.String, "direction": pl.Float64, "floor": pl.Float64})
    key = ["node", "metric", "attributes"]
    baseline = (steps.filter(pl.col("step") < window.analysis_start).group_by(key)
                .agg(median=pl.col("value").median(), q1=pl.col("value").quantile(0.25),
                     q3=pl.col("value").quantile(0.75), baseline_steps=pl.len())
                .filter(pl.col("baseline_steps") >= 6)
                .join(meta, on="metric")
                .with_columns(scale=pl.max_horizontal((pl.col("q3") - pl.col("q1")) / IQR_TO_SIGMA,
                                                      pl.col("floor") / THRESHOLD, pl.lit(1e-12))))
    recent = steps.filter(pl.col("step") >= window.analysis_start).join(baseline, on=key)
    deviation = (pl.col("value") - pl.col("median")) / pl.col("scale")
    z = deviation * pl.col("direction") if directional else deviation.abs()
    recent = recent.sort(key + ["step"]).with_columns(z=z)
    recent = recent.with_columns(
        sustained=(pl.col("z") > THRESHOLD) & (pl.col("z").shift(-1).over(key) > THRESHOLD),
        in_incident=pl.col("step") >= window.incident_start,
        # From the start of the first violating SLI window, where the SLI broke, to the precedence tolerance:
        # steps before it would dilute a change that began within that window.
        at_break=pl.col("step").is_between(window.incident_start,
                                           window.incident_start + window.precedence_tolerance))
    per_series = recent.group_by(key).agg(
        baseline=pl.col("median").first(),
        observed=pl.col("value").filter(pl.col("in_incident")).median(),
        z_at_break=pl.col("z").filter(pl.col("at_break")).median(),
        onset=pl.col("step").filter(pl.col("sustained")).min(),
        consistency=(pl.col("z").filter(pl.col("in_incident")) > THRESHOLD).mean(),
        scale=pl.col("scale").first(), direction=pl.col("direction").first())
    observed_dev = (pl.col("observed") - pl.col("baseline")) / pl.col("scale")
    return per_series.with_columns(
        z_observed=(observed_dev * pl.col("direction") if directional else observed_dev.abs()).fill_null(0.0),
        z_at_break=pl.col("z_at_break").fill_null(0.0),
        consistency=pl.col("consistency").fill_null(0.0))


def _fleet_share(scores: pl.DataFrame, node: str) -> dict[str, float]:
    """Per metric: the share of other nodes on which it is anomalous during the incident."""
    others = scores.filter(pl.col("node") != node)
    if others.is_empty():
        return {}
    peers = others["node"].n_unique()
    moved = (others.filter(pl.col("z_observed") > THRESHOLD).group_by("metric")
             .agg(nodes=pl.col("node").n_unique()))
    return {m: n / peers for m, n in moved.iter_rows()}


def _magnitude(z: float) -> float:
    return z / (z + THRESHOLD) if z > 0 else 0.0


def _seed_exceeded(cause: taxonomy.Cause, signal: str, baseline: float, observed: float | None) -> bool:
    limit = cause.seed_threshold.get(signal)
    return limit is not None and observed is not None and observed >= limit > baseline


def _evidence_signal(ev: taxonomy.Evidence) -> str:
    return ev.signal + GROWTH_SUFFIX if ev.feature == "growth" else ev.signal


def rank_causes(scores: pl.DataFrame, node: str, window: Window, top: int = 5) -> list[dict]:
    fleet_share = _fleet_share(scores, node)
    local = scores.filter(pl.col("node") == node)
    ranked = []
    for cause in taxonomy.CAUSES:
        candidates = []
        for ev in cause.evidence:
            name = _evidence_signal(ev)
            for row in local.filter(pl.col("metric") == name).iter_rows(named=True):
                attributes = json.loads(row["attributes"])
                if ev.matches(attributes):
                    candidates.append(_score_series(cause, row, attributes, fleet_share.get(name, 0.0), window))
        candidates.sort(key=lambda c: -c["score"])
        if not candidates or candidates[0]["score"] < MIN_SCORE:
            continue
        # The best series, and the others that moved too.
        evidence = [candidates[0]] + [c for c in candidates[1:3] if c["evidence"]["z"] > THRESHOLD]
        ranked.append({
            "cause": cause.id, "layer": cause.layer, "score": round(candidates[0]["score"], 3),
            "evidence": [c["evidence"] for c in evidence],
            "remediation": cause.remediation.format(node=node),
        })
    ranked = [c for c in _explain_away(ranked) if c["score"] >= MIN_SCORE]
    ranked.sort(key=lambda c: -c["score"])
    return ranked[:top]


def _explain_away(ranked: list[dict]) -> list[dict]:
    raw = {c["cause"]: c["score"] for c in ranked}
    for c in ranked:
        explained = max((raw.get(other, 0.0) for other in taxonomy.BY_ID[c["cause"]].explained_by), default=0.0)
        c["score"] = round(c["score"] * (1.0 - explained), 3)
    return ranked


def _score_series(cause: taxonomy.Cause, row: dict, attributes: dict, fleet_share: float, window: Window) -> dict:
    signal = row["metric"].removesuffix(GROWTH_SUFFIX)
    # A cause has moved by the time the SLI breaks; an effect keeps growing after it. Counting only what both
    # the break and the whole incident show keeps a large late effect from outranking an early cause.
    magnitude = _magnitude(min(row["z_observed"], row["z_at_break"]))
    if _seed_exceeded(cause, signal, row["baseline"], row["observed"]):
        magnitude = max(magnitude, 0.9)
    onset = row["onset"]
    if onset is None:
        precedence = EFFECT_PENALTY if magnitude > 0 else 0.0
    elif onset <= window.incident_start + window.precedence_tolerance:
        precedence = 1.0
    else:
        precedence = EFFECT_PENALTY
    consistency = 0.5 + 0.5 * row["consistency"]
    score = magnitude * precedence * consistency * (1.0 - fleet_share)
    feature = "growth_per_min" if row["metric"].endswith(GROWTH_SUFFIX) else None
    evidence = {"signal": signal, "attributes": attributes,
                "baseline": _round(row["baseline"]), "observed": _round(row["observed"]),
                "onset": onset.strftime("%Y-%m-%dT%H:%M:%SZ") if onset else None,
                "z": round(row["z_observed"], 1), "fleet_share": round(fleet_share, 2)}
    if feature:
        evidence["feature"] = feature
    return {"score": score, "evidence": evidence}


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")
