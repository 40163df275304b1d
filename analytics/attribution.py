"""Ranking the physical causes of an incident from the catalog signals of its node.

For every signal series of every node: a robust baseline (median and IQR, as BARO does) from a quiet period
before the incident, and a robust z-score per step, counted only in the signal's harmful direction. A series
is evidence for a cause (taxonomy) when

- it moved: its median during the incident, and around the moment the SLI broke, are many robust deviations
  from baseline (magnitude);
- it moved first: its onset (first of two consecutive anomalous steps) is at or before the SLI broke; a
  signal that only moves afterwards is an effect of the incident, not its cause (precedence);

Each series is judged at its own resolution: a series whose points come further apart than the analysis' steps
(a Prometheus scrape or the Collector's receivers every 60 s) is judged by its points, never by steps it cannot
fill. Its break is its points up to two of its intervals after the SLI broke (a point covers the interval before
it: a change that began just after one shows wholly only in the one after next), its onset may come as late, and
its last point in the window counts alone where the next one is not in the window yet (a minute-old point is a
minute of data, not one noisy sample);
- it stayed moved: anomalous in most of the incident's steps (consistency);
- it moved here: the same signal did not move on the other nodes at the same time, which would make it a
  fleet-wide change (a rollout, the weather) rather than this node's problem (locality).

A series' score is the product of four parts, each in [0, 1], so that it reads the same for every signal:

- magnitude z / (z + 3) of its robust z (the smaller of the incident's and the break's): 0.5 at the anomaly
  threshold z = 3, 0.75 at z = 9, 0.9 at z = 27; at least 0.9 once a taxonomy seed threshold is crossed;
- precedence 1 when it moved at or before the SLI broke, EFFECT_PENALTY (0.25) when only afterwards;
- consistency 0.5 + 0.5 x the share of the incident's steps in which it is anomalous;
- locality 1 - the share of other nodes on which it moved too.

The cause score is the best of its series' scores. A cause whose signals sit downstream of other causes'
(taxonomy `explained_by`: a syscall that waits on the disk or for a CPU is slow because of them) keeps only the
part of its score that they leave unexplained: score x (1 - the best of theirs).

CLEAR_CAUSE_FLOOR (0.3) is the weakest evidence reported as a cause: a signal at the anomaly threshold that
moved first, on this node alone, and stayed anomalous in a fifth of the incident's steps. A signal that only
moved after the SLI broke never reaches it. Below it, the diagnosis is "no clear cause", with the strongest
candidates and the parts of their score that fall short.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from sloscope import catalog, taxonomy
from sloscope.taxonomy import BUILT_IN, Taxonomy
from sloscope.times import rfc3339

from sloscope.analytics.cumulative import SERIES
from sloscope.analytics.errors import StoreError
from sloscope.analytics.inference_load import load_steps
from sloscope.analytics.store_api import StoreReader

THRESHOLD = 3.0  # robust z above which a step counts as anomalous
POD_ATTRIBUTE = "k8s.pod.name"  # how a pod's own series (kubeletstats) name it
# A coarse series' point covers the interval before it: a change that began just after one point shows in part in
# the next and wholly only in the one after, so its onset may come this many of its intervals after the break.
COARSE_INTERVALS = 2
BASELINE = timedelta(minutes=10)
LOOKBACK = timedelta(minutes=1)  # onsets are searched from this long before the incident started
MAX_OBSERVED = timedelta(minutes=5)  # only the incident's first minutes say what started it
GROWTH_WINDOW = timedelta(minutes=1)
GROWTH_SUFFIX = ":growth_per_min"
GROWTH_NOISE_FLOOR = 0.01
EFFECT_PENALTY = 0.25
MIN_SCORE = 0.05  # causes scoring below this are not worth a reader's attention
CLEAR_CAUSE_FLOOR = 0.3
CANDIDATES = 3  # shown when no cause is clear
MIN_BASELINE_STEPS = 6  # fewer signal steps of history say nothing about a series' normal level
IQR_TO_SIGMA = 1.349
MIN_SCALE = 1e-12  # a series that never varied still has a scale to divide by
STEP_COLUMNS = ["series", *SERIES, "step", "value"]  # the frame of signal_steps
FINGERPRINT_SEEDS = 4  # two of a fleet's few thousand series share a 64-bit fingerprint about once in 10^12 windows
SERIES_KEY = ["series", "metric"]  # one series of that frame: a growth series shares its level's integer


@dataclass(frozen=True)
class Window:
    baseline_start: datetime
    analysis_start: datetime
    incident_start: datetime
    incident_end: datetime
    resolution_s: float  # the SLO spec's SLI step
    requested_baseline_s: float = BASELINE.total_seconds()

    @classmethod
    def around(cls, start: datetime, end: datetime, resolution_s: float, baseline: timedelta = BASELINE,
               lookback: timedelta = LOOKBACK) -> "Window":
        """The window for an episode of trouble that began at `start` (the first SLI break) and lasted to `end`:
        `baseline` long, ending `lookback` before `start` (onsets are searched from there)."""
        analysis_start = start - lookback
        return cls(analysis_start - baseline, analysis_start, start, min(end, start + MAX_OBSERVED), resolution_s,
                   baseline.total_seconds())

    def fitted(self, history_start: datetime | None) -> "Window":
        """This window, shortened to the history there is: when less precedes the incident than the baseline and
        lookback ask for, the lookback shrinks first (down to the precedence tolerance, so that a cause's
        onset still falls after the baseline), then the baseline (see min_baseline_s, below which there is no
        analysis)."""
        if history_start is None or history_start <= self.baseline_start:
            return self
        available = (self.incident_start - history_start).total_seconds()
        asked = (self.incident_start - self.analysis_start).total_seconds()
        lookback = min(asked, max(self.precedence_tolerance.total_seconds(), available - self.min_baseline_s))
        analysis_start = self.incident_start - timedelta(seconds=lookback)
        return Window(min(history_start, analysis_start), analysis_start, self.incident_start, self.incident_end,
                      self.resolution_s, self.requested_baseline_s)

    @property
    def baseline_s(self) -> float:
        return (self.analysis_start - self.baseline_start).total_seconds()

    @property
    def min_baseline_s(self) -> float:
        return MIN_BASELINE_STEPS * self.step_s

    def baseline_json(self) -> dict:
        return {"requested_s": self.requested_baseline_s, "used_s": round(self.baseline_s, 1),
                "minimum_s": self.min_baseline_s,
                "lookback_s": round((self.incident_start - self.analysis_start).total_seconds(), 1)}

    @property
    def step_s(self) -> float:
        return signal_step_s(self.resolution_s)

    @property
    def precedence_tolerance(self) -> timedelta:
        # The incident starts at the start of its first violating SLI window, so the SLI may have broken up
        # to one window later; one more window allows for the signal's own sampling and ramp.
        return timedelta(seconds=2 * self.resolution_s)


def signal_steps(store: StoreReader, window: Window, known: Taxonomy = BUILT_IN, evidence_only: bool = False,
                 node: str | None = None) -> pl.DataFrame:
    """Every signal series of every node in the window (or of `node` alone), one value per step; with
    evidence_only, only the metrics some cause of `known` reads (a quarter of the points of a fleet running
    sloscope's collector are not). Each series is `series` (an integer) with its node, metric and attributes as
    categoricals; a growth series (see _growth_series) shares the integer of the level it grows from, so (series,
    metric) is the key."""
    params = {**steps_params(window.baseline_start, window.incident_end, known), "node": node or ""}
    if not evidence_only:
        params["metrics"] = []
    params["seed"], names = _series_names(store, params)
    steps = store.computed("signal_steps", {**params, "step_s": window.step_s})
    steps = steps.join(names, on="series").select(STEP_COLUMNS)
    load = load_steps(store, {**params, "step_s": window.step_s}, steps.schema)
    return pl.concat([steps, _growth_series(steps, window.step_s, known.growth_signals), load])


def signal_step_s(resolution_s: float) -> float:
    """Signals are resampled twice as finely as the SLI, so an onset can be placed within a window."""
    return resolution_s / 2


def steps_params(since: datetime, until: datetime, known: Taxonomy = BUILT_IN) -> dict:
    """The parameters of signal_series.sql for the fleet's evidence signals in [since, until); signal_steps.sql
    takes `step_s` besides."""
    return {"since": since, "until": until, "unknown_node": catalog.UNKNOWN_NODE, "node": "",
            "metrics": list(known.evidence_signals), "seed": 0}


def _series_names(store: StoreReader, params: dict) -> tuple[int, pl.DataFrame]:
    """The seed of the first fingerprints (signal_series.sql) that name each series once, and the series' names:
    two series that share a fingerprint are told apart by the fingerprints of another seed."""
    for seed in range(FINGERPRINT_SEEDS):
        names = store.frame(store.sql("signal_series"), {**params, "seed": seed})
        if not names["series"].is_duplicated().any():
            return seed, names.with_columns(pl.col(SERIES).cast(pl.Categorical))
    raise StoreError(f"the series' fingerprints collide under {FINGERPRINT_SEEDS} seeds: the store's hash is broken")


def _growth_lag(step_s: float) -> int:
    """The steps over which growth is measured: GROWTH_WINDOW."""
    return max(1, round(GROWTH_WINDOW.total_seconds() / step_s))


def _growth_series(steps: pl.DataFrame, step_s: float, signals: tuple[str, ...]) -> pl.DataFrame:
    """Relative growth per minute of the signals read as growth (GPU memory in use: the leak signature,
    taxonomy.GPU_MEMORY_LEAK)."""
    lag = _growth_lag(step_s)
    levels = steps.filter(pl.col("metric").is_in(signals)).sort("series", "step")
    previous = pl.col("value").shift(lag).over("series")
    return levels.with_columns(
        metric=(pl.col("metric").cast(pl.String) + GROWTH_SUFFIX).cast(pl.Categorical),
        value=(pl.col("value") - previous) / previous * (60.0 / (lag * step_s)),
    ).filter(pl.col("value").is_finite()).select(STEP_COLUMNS)  # no growth from zero


def _direction_and_floor(metric: str, known: Taxonomy) -> tuple[float, float]:
    if metric.endswith(GROWTH_SUFFIX):
        return 1.0, GROWTH_NOISE_FLOOR
    reading = known.reading(metric)
    if reading is None:
        return 1.0, 0.0
    harmful, floor = reading
    return (1.0 if harmful is catalog.Direction.UP else -1.0), floor


def series_scores(steps: pl.DataFrame, window: Window, directional: bool = True,
                  known: Taxonomy = BUILT_IN) -> pl.DataFrame:
    """Per series (node, metric, attributes): baseline, observed, robust z of the observed level, onset and
    consistency. With directional=False the z-score is absolute (for the BARO-style baseline)."""
    metrics = steps["metric"].unique().to_list()
    dirs = {m: _direction_and_floor(m, known) for m in metrics}
    meta = pl.DataFrame({"metric": metrics, "direction": [dirs[m][0] for m in metrics],
                         "floor": [dirs[m][1] for m in metrics]},
                        schema={"metric": steps.schema["metric"], "direction": pl.Float64, "floor": pl.Float64})
    baseline = (steps.filter(pl.col("step") < window.analysis_start).group_by(SERIES_KEY)
                .agg(median=pl.col("value").median(), q1=pl.col("value").quantile(0.25),
                     q3=pl.col("value").quantile(0.75), baseline_steps=pl.len())
                .filter(pl.col("baseline_steps") >= MIN_BASELINE_STEPS)
                .join(meta, on="metric")
                .with_columns(scale=pl.max_horizontal((pl.col("q3") - pl.col("q1")) / IQR_TO_SIGMA,
                                                      pl.col("floor") / THRESHOLD, pl.lit(MIN_SCALE))))
    recent = steps.filter(pl.col("step") >= window.analysis_start).join(baseline, on=SERIES_KEY).join(
        _resolutions(steps, window.step_s), on=SERIES_KEY)
    deviation = (pl.col("value") - pl.col("median")) / pl.col("scale")
    z = deviation * pl.col("direction") if directional else deviation.abs()
    # In time order within each series, and so within each (series, metric): sorting on the integer alone is faster.
    recent = recent.sort("series", "step").with_columns(z=z)
    # The next point; a coarse series' last point in the window stands for itself.
    following = pl.col("z").shift(-1).over(SERIES_KEY)
    following = pl.when(following.is_null() & pl.col("coarse")).then(pl.col("z")).otherwise(following)
    tolerance = pl.max_horizontal(pl.lit(window.precedence_tolerance.total_seconds()),
                                  COARSE_INTERVALS * pl.col("resolution_s"))
    recent = recent.with_columns(
        sustained=(pl.col("z") > THRESHOLD) & (following > THRESHOLD),
        # The level held for two steps from here: what a change that began at this step shows, not one noisy step.
        held=pl.min_horizontal(pl.col("z"), following),
        in_incident=pl.col("step") >= window.incident_start,
        # From the start of the first violating SLI window, where the SLI broke, to the precedence tolerance (or
        # the series' own interval, so that a coarse series has a point there): steps before it would dilute a
        # change that began within that window.
        at_break=(pl.col("step") >= window.incident_start) & (
            pl.col("step") <= pl.lit(window.incident_start) + pl.duration(seconds=tolerance)))
    per_series = recent.group_by(SERIES_KEY).agg(
        pl.col("node", "attributes").first(),
        baseline=pl.col("median").first(),
        observed=pl.col("value").filter(pl.col("in_incident")).median(),
        # A change that began anywhere within the break counts (as precedence allows), at the level it held.
        z_at_break=pl.col("held").filter(pl.col("at_break")).max(),
        onset=pl.col("step").filter(pl.col("sustained")).min(),
        consistency=(pl.col("z").filter(pl.col("in_incident")) > THRESHOLD).mean(),
        scale=pl.col("scale").first(), direction=pl.col("direction").first(),
        resolution_s=pl.col("resolution_s").first(),
    ).select(*SERIES, pl.exclude("series", *SERIES))
    observed_dev = (pl.col("observed") - pl.col("baseline")) / pl.col("scale")
    return per_series.with_columns(
        z_observed=(observed_dev * pl.col("direction") if directional else observed_dev.abs()).fill_null(0.0),
        z_at_break=pl.col("z_at_break").fill_null(0.0),
        consistency=pl.col("consistency").fill_null(0.0))


def _resolutions(steps: pl.DataFrame, step_s: float) -> pl.DataFrame:
    """Per series: the median interval between its points (the analysis' step where it has fewer than two), and
    whether it is coarse, its points at least two steps apart."""
    gaps = steps.sort("series", "step").with_columns(
        gap=(pl.col("step") - pl.col("step").shift(1).over(SERIES_KEY)).dt.total_microseconds() / 1e6)
    return gaps.group_by(SERIES_KEY).agg(resolution_s=pl.col("gap").median().fill_null(step_s)).with_columns(
        pl.max_horizontal("resolution_s", pl.lit(step_s)).alias("resolution_s"),
        coarse=pl.col("resolution_s") >= 2 * step_s)


@dataclass(frozen=True)
class Fleet:
    """What locality needs from the other nodes: on how many nodes some series could be judged (it has a baseline
    and steps since analysis_start), and per metric on how many of them one moved (z_observed above THRESHOLD)."""

    nodes: int
    moved: dict[str, int]

    @classmethod
    def of(cls, scores: pl.DataFrame) -> "Fleet":
        """The fleet of series_scores over every node."""
        moved = (scores.filter(pl.col("z_observed") > THRESHOLD).group_by("metric")
                 .agg(nodes=pl.col("node").n_unique()))
        return cls(scores["node"].n_unique(), {str(m): n for m, n in moved.iter_rows()})

    def share(self, scores: pl.DataFrame, node: str) -> dict[str, float]:
        """Per metric: the share of the other nodes on which it moved during the incident; `scores` hold node's."""
        own = scores.filter(pl.col("node") == node)
        peers = self.nodes - (1 if own.height else 0)
        own_moved = {str(m) for m in own.filter(pl.col("z_observed") > THRESHOLD)["metric"]}
        others = {m: n - (m in own_moved) for m, n in self.moved.items()}
        return {m: n / peers for m, n in others.items() if n > 0} if peers > 0 else {}


def fleet_movement(store: StoreReader, window: Window, known: Taxonomy = BUILT_IN) -> Fleet:
    """The Fleet of every node's evidence signals in the window, judged in the store (fleet_movement.sql) as
    series_scores judges them: only this much of the fleet leaves the engine."""
    levels = list(known.evidence_signals)
    metrics = levels + [m + GROWTH_SUFFIX for m in known.growth_signals]
    readings = [_direction_and_floor(m, known) for m in metrics]
    lag = _growth_lag(window.step_s)
    params = {**steps_params(window.baseline_start, window.incident_end, known), "step_s": window.step_s,
              "readings": metrics, "directions": [d for d, _ in readings], "floors": [f for _, f in readings],
              "growth_metrics": list(known.growth_signals), "growth_suffix": GROWTH_SUFFIX, "growth_lag": lag,
              "growth_per_min": 60.0 / (lag * window.step_s), "analysis_start": window.analysis_start,
              "incident_start": window.incident_start, "min_baseline_steps": MIN_BASELINE_STEPS,
              "threshold": THRESHOLD, "iqr_to_sigma": IQR_TO_SIGMA, "min_scale": MIN_SCALE}
    movement = store.computed("fleet_movement", params)
    moved = movement.filter("moved").group_by("metric").agg(nodes=pl.col("node_key").n_unique())
    return Fleet(movement["node_key"].n_unique(), dict(moved.iter_rows()))


def _magnitude(z: float) -> float:
    return z / (z + THRESHOLD) if z > 0 else 0.0


def _seed_exceeded(cause: taxonomy.Cause, signal: str, direction: float, baseline: float,
                   observed: float | None) -> bool:
    """Whether the signal crossed its seed threshold in its harmful direction, from a baseline short of it."""
    limit = cause.seed_threshold.get(signal)
    return limit is not None and observed is not None and direction * observed >= direction * limit > \
        direction * baseline


def _in_harmful_range(cause: taxonomy.Cause, signal: str, direction: float, observed: float | None) -> bool:
    """Whether the signal's level reached the range where its movement is evidence for the cause at all."""
    level = cause.harmful_from.get(signal)
    return level is None or (observed is not None and direction * observed >= direction * level)


def _evidence_signal(ev: taxonomy.Evidence) -> str:
    return ev.signal + GROWTH_SUFFIX if ev.feature == "growth" else ev.signal


def _candidates(scores: pl.DataFrame, node: str, window: Window, known: Taxonomy, fleet: Fleet,
                pod: str | None = None) -> list[dict]:
    """Every cause with a series on `node`, scored by its best series and explained away, best first; with `pod`,
    the series of that pod count too, whatever their rank (see _strongest)."""
    fleet_share = fleet.share(scores, node)
    local: dict[str, list[tuple[dict, dict]]] = {}
    # In the order of their attributes, so that series of equal scores rank alike however the store returned them
    # (a rollup's rows and the raw tables' come in different orders).
    by_text = [pl.col(c).cast(pl.String) for c in ("metric", "attributes")]  # not a categorical's own order
    for row in scores.filter(pl.col("node") == node).sort(by_text).iter_rows(named=True):
        local.setdefault(row["metric"], []).append((row, json.loads(row["attributes"])))
    ranked = []
    for cause in known.causes:
        measures = [[_score_series(cause, ev, row, attributes, fleet_share.get(row["metric"], 0.0), window)
                     for ev, row, attributes in _strongest(evidence, local, pod)]
                    for evidence in taxonomy.by_measure(cause.evidence).values()]
        if cause.requires_all:  # each measure's best must have moved: the cause is as strong as the weakest
            if not all(measures):
                continue
            weakest = min(max(m, key=lambda c: c["score"])["score"] for m in measures)
            series = [{**c, "score": min(c["score"], weakest)} for m in measures for c in m]
        else:
            series = [c for m in measures for c in m]
        if not series:
            continue
        series.sort(key=lambda c: -c["score"])
        # The best series, and the others that moved too.
        evidence = [series[0]] + [c for c in series[1:3] if c["evidence"]["z"] > THRESHOLD]
        ranked.append({
            "cause": cause.id, "layer": cause.layer, "score": round(series[0]["score"], 3),
            "evidence": [c["evidence"] for c in evidence],
            "remediation": cause.remediation.format(node=node),
            "score_parts": series[0]["parts"],
        })
    ranked = _explain_away(ranked, known)
    ranked.sort(key=lambda c: -c["score"])
    return ranked


def _strongest(evidence: list[taxonomy.Evidence], local: dict, pod: str | None = None) -> list[tuple]:
    """(evidence, row, attributes) of one measure's strongest rank that has a series on the node: a weaker rank
    (another producer measuring the same thing less directly) neither adds to the cause nor replaces it. The
    series of `pod`, the culprit the trace graph found, are added whatever their rank: one pod's CPU can go from
    nothing to half a core on a node whose own usage hardly moves."""
    found = []
    for rank in sorted({ev.rank for ev in evidence}):
        found = [(ev, row, attributes) for ev in evidence if ev.rank == rank
                 for row, attributes in local.get(_evidence_signal(ev), ()) if ev.matches(attributes)]
        if found:
            break
    if pod:
        found += [(ev, row, attributes) for ev in evidence
                  for row, attributes in local.get(_evidence_signal(ev), ())
                  if attributes.get(POD_ATTRIBUTE) == pod and ev.matches(attributes)
                  and not any(row is r for _, r, _ in found)]
    return found


def rank_causes(scores: pl.DataFrame, node: str, window: Window, top: int = 5,
                known: Taxonomy = BUILT_IN) -> list[dict]:
    """The causes worth a reader's attention (score at least MIN_SCORE), best first; `scores` of every node."""
    if node == catalog.UNKNOWN_NODE:
        return []
    return [c for c in _candidates(scores, node, window, known, Fleet.of(scores)) if c["score"] >= MIN_SCORE][:top]


def diagnose(scores: pl.DataFrame, node: str, window: Window, top: int = 5, known: Taxonomy = BUILT_IN,
             fleet: Fleet | None = None, pod: str | None = None) -> tuple[list[dict], dict]:
    """(causes, diagnosis): the ranking when its best cause reaches CLEAR_CAUSE_FLOOR; otherwise no causes and
    a diagnosis that says why, with the strongest candidates and what each falls short on. `scores` hold node's
    series and `fleet` the others' movement; without it, `scores` hold every node's."""
    floor = {"floor": CLEAR_CAUSE_FLOOR, "baseline": window.baseline_json()}
    if node == catalog.UNKNOWN_NODE:  # requests that named no node: their SLI counts, but no node is to blame
        return [], {"verdict": "no_node", **floor,
                    "reason": "the requests name no node, so no node's signals can explain them"}
    if window.baseline_s < window.min_baseline_s:
        return [], {"verdict": "insufficient_baseline", **floor,
                    "reason": f"only {window.baseline_s:.0f} s of this node's signals precede the incident; "
                              f"at least {window.min_baseline_s:.0f} s are needed to know their normal level"}
    candidates = _candidates(scores, node, window, known, fleet or Fleet.of(scores), pod)
    if not candidates:
        return [], {"verdict": "no_evidence", **floor,
                    "reason": "no signal of this node that is evidence for a cause has a baseline in the window"}
    if candidates[0]["score"] >= CLEAR_CAUSE_FLOOR:
        return [c for c in candidates if c["score"] >= MIN_SCORE][:top], {"verdict": "ranked", **floor}
    strongest = [{**c, "falls_short": _shortfalls(c, known)} for c in candidates[:CANDIDATES]]
    return [], {"verdict": "no_clear_cause", **floor, "candidates": strongest,
                "reason": f"no cause's evidence reaches the floor of {CLEAR_CAUSE_FLOOR:g} (best: "
                          f"{candidates[0]['cause']} at {candidates[0]['score']:g})"}


def _shortfalls(candidate: dict, known: Taxonomy) -> list[str]:
    parts, ev = candidate["score_parts"], candidate["evidence"][0]
    out = []
    if parts["magnitude"] < 0.5:
        out.append(f"moved {ev['z']:g} robust deviations from its baseline; {THRESHOLD:g} make a step anomalous")
    if parts["precedence"] < 1.0:
        out.append("moved only after the SLI broke (an effect)" if ev["onset"] else
                   "never anomalous two steps in a row")
    if parts["consistency"] < 0.6:
        out.append(f"anomalous in {2 * parts['consistency'] - 1:.0%} of the incident's steps")
    if parts["locality"] < 0.8:
        out.append(f"moved on {1 - parts['locality']:.0%} of the other nodes too (fleet-wide)")
    if parts["unexplained"] < 1.0:
        out.append(f"a downstream effect of {', '.join(known.by_id[candidate['cause']].explained_by)} "
                   f"({1 - parts['unexplained']:.0%} explained)")
    return out or [f"score {candidate['score']:g} below the floor {CLEAR_CAUSE_FLOOR:g}"]


def _explain_away(ranked: list[dict], known: Taxonomy) -> list[dict]:
    raw = {c["cause"]: c["score"] for c in ranked}
    for c in ranked:
        explained = max((raw.get(other, 0.0) for other in known.by_id[c["cause"]].explained_by), default=0.0)
        c["score"] = round(c["score"] * (1.0 - explained), 3)
        c["score_parts"]["unexplained"] = round(1.0 - explained, 3)
    return ranked


def _score_series(cause: taxonomy.Cause, ev: taxonomy.Evidence, row: dict, attributes: dict, fleet_share: float,
                  window: Window) -> dict:
    signal = row["metric"].removesuffix(GROWTH_SUFFIX)
    # A cause has moved by the time the SLI breaks; an effect keeps growing after it. Counting only what both
    # the break and the whole incident show keeps a large late effect from outranking an early cause.
    magnitude = _magnitude(min(row["z_observed"], row["z_at_break"]))
    if _seed_exceeded(cause, signal, row["direction"], row["baseline"], row["observed"]):
        magnitude = max(magnitude, 0.9)
    if not _in_harmful_range(cause, signal, row["direction"], row["observed"]):
        magnitude = 0.0
    onset = row["onset"]
    tolerance = max(window.precedence_tolerance, timedelta(seconds=COARSE_INTERVALS * (row.get("resolution_s") or 0.0)))
    if onset is None:
        precedence = EFFECT_PENALTY if magnitude > 0 else 0.0
    elif onset <= window.incident_start + tolerance:
        precedence = 1.0
    else:
        precedence = EFFECT_PENALTY
    consistency = 0.5 + 0.5 * row["consistency"]
    score = magnitude * precedence * consistency * (1.0 - fleet_share)
    feature = "growth_per_min" if row["metric"].endswith(GROWTH_SUFFIX) else None
    evidence = {"signal": signal, "attributes": attributes, "source": ev.producer, "measure": ev.measure,
                "rank": ev.rank, "baseline": _round(row["baseline"]), "observed": _round(row["observed"]),
                "onset": rfc3339(onset) if onset else None,
                "z": round(row["z_observed"], 1), "fleet_share": round(fleet_share, 2)}
    if feature:
        evidence["feature"] = feature
    parts = {"magnitude": round(magnitude, 3), "precedence": precedence, "consistency": round(consistency, 3),
             "locality": round(1.0 - fleet_share, 3)}
    return {"score": score, "evidence": evidence, "parts": parts}


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")
