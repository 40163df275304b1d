"""Incidents and their ranked causes, as the JSON document of docs/cli-json.md or a table for people."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from time import perf_counter
from typing import Callable

import polars as pl

from sloscope.catalog import EVERY_NODE
from sloscope.durations import parse_duration
from sloscope.times import parse_time, rfc3339

from sloscope.analytics.attribution import (BASELINE, CANDIDATES, CLEAR_CAUSE_FLOOR, LOOKBACK, THRESHOLD, Fleet,
                                            Window, diagnose, fleet_movement, series_scores, signal_step_s,
                                            signal_steps, steps_params)
from sloscope.analytics.graph import Entry, Windows, culprits, described, service_graph
from sloscope.analytics.localize import culprit_causes
from sloscope.analytics.slo import Incident, find_incidents, sli_params
from sloscope.analytics.store_api import StoreReader

NO_REQUESTS = "holds no requests in the analysed range"
EPISODE_GAP = timedelta(minutes=2)
CLOCK_SKEW = timedelta(minutes=5)  # how far ahead of this host's clock a request may start and still be "newest"
MOMENT_SPAN = timedelta(minutes=1)  # a moment is explained by what its signals did in the minute from it
GRAPH_SPAN = timedelta(minutes=5)  # the service graph's range when none is asked: up to the newest request
# The longest range the service graph reads (its end kept): every span of it is read, and a dashboard's "last 7
# days" must not make serve read a week of traces.
GRAPH_MAX_SPAN = timedelta(hours=1)


def newest_request(store, now: datetime | None = None) -> datetime | None:
    """The start of the newest stored request that is not in the future (by `now`, this host's UTC clock, and
    CLOCK_SKEW): what a relative time counts back from."""
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    return store.rows(store.sql("newest_request"), {"not_after": now + CLOCK_SKEW})[0][0]


def flag(name: str) -> str:
    """How the command line names a value of a Query: --since."""
    return f"--{name}"


def query_parameter(name: str) -> str:
    """How GET /rca names a value of a Query: query parameter since."""
    return f"query parameter {name}"


def analysed_range(since: str, until: str, newest: datetime | None, named: Callable[[str], str] = flag
                   ) -> tuple[datetime | None, datetime | None]:
    """since and until as times (None where not given); ValueError where the range ends before it starts. `named`
    says how the user wrote them, for the errors."""
    start = parse_time(since, newest, named("since")) if since else None
    end = parse_time(until, newest, named("until")) if until else None
    if start is not None and end is not None and end <= start:
        raise ValueError(f"{named('until')} {until} is not after {named('since')} {since}: give a range that ends "
                         "after it starts")
    return start, end


def holds_requests(store, since: datetime | None, until: datetime | None) -> bool:
    """Whether the store holds requests in [since, until), as far as the span of its requests tells (a range
    inside a gap between them is not seen)."""
    first, last = store.rows(store.sql("data_range"))[0]
    return first is not None and (since is None or since <= last) and (until is None or until > first)


@dataclass(frozen=True)
class Query:
    """What `sloscope rca` and `GET /rca` ask, as the user wrote it: times are RFC 3339 or a duration back from
    the newest stored request, baseline and lookback durations. `at` asks for a moment instead of incidents."""

    since: str = ""
    until: str = ""
    at: str = ""
    node: str = ""
    top: int = 5
    baseline: str = "10m"
    lookback: str = "1m"
    named: Callable[[str], str] = flag  # how the user wrote a value: --since on the command line

    def answer(self, store: StoreReader, spec) -> dict:
        """The JSON document; ValueError (a ConfigError among them) names what the query got wrong."""
        try:
            return self._answer(store, spec)
        except OverflowError:  # times and durations are parsed first: only they can leave datetime's range
            raise ValueError("a time or duration of the query reaches outside the years 1 to 9999") from None

    def _answer(self, store: StoreReader, spec) -> dict:
        named = self.named
        if self.top < 1:
            raise ValueError(f"{named('top')}: expected 1 or more causes per incident, got {self.top}")
        if self.node and not self.at:
            raise ValueError(f"{named('node')} goes with {named('at')}")
        newest = newest_request(store)
        baseline = timedelta(seconds=parse_duration(self.baseline, named("baseline")))
        lookback = timedelta(seconds=parse_duration(self.lookback, named("lookback")))
        if self.at:
            return explain_moment(store, spec, parse_time(self.at, newest, named("at")), self.node or None,
                                  self.top, baseline, lookback)
        return analyse(store, spec, *analysed_range(self.since, self.until, newest, named), self.top, baseline,
                       lookback)

    def holds_requests(self, store: StoreReader) -> bool:
        """Whether the store holds requests in the range this query analyses."""
        return holds_requests(store, *analysed_range(self.since, self.until, newest_request(store), self.named))


def graph_answer(store: StoreReader, since: str = "", until: str = "", at: str = "",
                 named: Callable[[str], str] = flag) -> dict:
    """The service graph (analytics/graph.py) of the minute from `at`, or of [since, until): by default the
    GRAPH_SPAN up to the newest stored request. ValueError names what the query got wrong."""
    newest = newest_request(store)
    if at and (since or until):
        raise ValueError(f"{named('at')} asks for a minute: give it, or {named('since')} and {named('until')}")
    if at:
        start = parse_time(at, newest, named("at"))
        end = start + MOMENT_SPAN
    else:
        start, end = analysed_range(since, until, newest, named)
        end = end or (newest + timedelta(seconds=1) if newest else None)
        start = start or (end - GRAPH_SPAN if end else None)
    if start is None or end is None:
        return {"since": None, "until": None, "nodes": [], "edges": [], "kinds": {}, "clipped": False}
    clipped = end - start > GRAPH_MAX_SPAN
    start = max(start, end - GRAPH_MAX_SPAN)
    shown = service_graph(store, start, end)
    return {**shown, "since": rfc3339(start), "until": rfc3339(end), "clipped": clipped}


class StageTimer:
    """Seconds spent per stage of an analysis, added to `into` (nothing is timed without it). A stage's time
    leaves out the stages timed inside it, so the figures add up to the whole."""

    def __init__(self, into: dict[str, float] | None = None):
        self.into, self._open = into, []  # the open stages: [name, when its current stretch began]

    @contextmanager
    def __call__(self, stage: str):
        if self.into is None:
            yield
            return
        self._pause(perf_counter())
        self._open.append([stage, perf_counter()])
        try:
            yield
        finally:
            now = perf_counter()
            self._pause(now)
            self._open.pop()
            if self._open:
                self._open[-1][1] = now

    def _pause(self, now: float) -> None:
        if self._open:
            stage, began = self._open[-1]
            self.into[stage] = self.into.get(stage, 0.0) + now - began
            self._open[-1][1] = now


def analyse(store: StoreReader, spec, since: datetime | None = None, until: datetime | None = None, top: int = 5,
            baseline: timedelta = BASELINE, lookback: timedelta = LOOKBACK,
            timings: dict[str, float] | None = None) -> dict:
    """Incidents in [since, until) with their ranked causes. Each cause's signals are judged against a
    `baseline` that ends `lookback` before its episode began (attribution.BASELINE and LOOKBACK by default),
    shortened to the history there is. With `timings`, the seconds of each stage are added to it: sli_windows
    (the SLI windows and their incidents), incident_merge (incidents into episodes), signal_steps (the signal
    queries), attribution (scores and causes) and trace_graph (the culprits along the incidents' traces)."""
    timed = StageTimer(timings)
    with timed("sli_windows"):
        first, last = store.rows(store.sql("data_range"))[0]
        if first is None:
            return {"incidents": []}
        since = since or first
        until = until or last + timedelta(seconds=1)
        incidents = find_incidents(store, spec, since, until)
    analysis = _Analysis(store, spec, baseline, lookback, timed)
    with timed("incident_merge"):
        spans = episodes(incidents, analysis.continues)
    out = []
    for incident, (start, end) in zip(incidents, spans):
        if incident.node == EVERY_NODE:
            window = Window.around(start, end, spec.resolution_s, baseline, lookback)
            causes, diagnosis = [], _every_node_diagnosis(incident, window)
        else:
            window = analysis.window(incident.node, start, end)
            fleet = analysis.fleet(window)  # first: a store with rollups fills the window's for the whole fleet
            scores = analysis.scores(window, incident.node)
            with timed("attribution"):
                causes, diagnosis = diagnose(scores, incident.node, window, top, spec.taxonomy, fleet)
        with timed("trace_graph"):
            found, _ = culprits(store, Windows(window.baseline_start, window.analysis_start, start, end),
                                Entry(incident.service, incident.node, incident.tier), store.tier_params(spec))
            causes, diagnosis = _led_by_culprits(analysis, incident, (start, end), found, causes, diagnosis, top)
        out.append(incident_json(incident, causes, diagnosis, found))
    return {"incidents": out}


def _every_node_diagnosis(incident: Incident, window: Window) -> dict:
    """Why an incident judged over every node of its service has no cause of its own: no one node's signals
    explain it, only the culprits its traces lead to could."""
    return {"verdict": "no_clear_cause", "floor": CLEAR_CAUSE_FLOOR, "baseline": window.baseline_json(),
            "candidates": [], "reason": f"{incident.service} was judged over all its nodes together, and no culprit "
                                        "stands out in its traces"}


def _led_by_culprits(analysis: "_Analysis", incident: Incident, episode: tuple[datetime, datetime],
                     found: list[dict], causes: list[dict], diagnosis: dict, top: int) -> tuple[list[dict], dict]:
    """An incident's causes with the trace graph's culprits first (each cause names the service and pod it was
    found for; the incident node's own, its service). Where no culprit stands out, or the first is the
    incident's own service and node and its signals name a cause, the node's own ranking stands."""
    _onsets_as_text(found)  # an incident's causes are judged from its episode, not from a culprit's onset
    own = [{"service": incident.service, "pod": None, "node": incident.node, **c} for c in causes]
    if not found or ((found[0]["service"], found[0]["node"]) == (incident.service, incident.node) and own):
        return own, diagnosis
    led = culprit_causes(found, lambda node, pod: analysis.causes(node, pod, *episode, top), top)
    verdict = {"verdict": "ranked", "floor": diagnosis["floor"], "baseline": diagnosis["baseline"]}
    return _after(led, own)[:top], verdict


def roll_up(store: StoreReader, spec) -> None:
    """The store's rollups (analytics/rollups.py) made for everything it holds: the SLI windows, and the steps of
    the fleet's evidence signals, that analyses read."""
    first, last = store.rows(store.sql("data_range"))[0]
    if first is not None:
        until = last + timedelta(seconds=1)
        store.roll_up("sli_windows", sli_params(store, spec, first, until))
        store.roll_up("signal_steps", {**steps_params(first - BASELINE - LOOKBACK, until, spec.taxonomy),
                                       "step_s": signal_step_s(spec.resolution_s)})


def explain_moment(store: StoreReader, spec, at: datetime, node: str | None = None, top: int = 5,
                   baseline: timedelta = BASELINE, lookback: timedelta = LOOKBACK) -> dict:
    """(service, node, cause) ranked for the minute from `at`, with no SLI breach required: what changed then.
    The trace graph's culprits lead (analytics/graph.py): each one's causes on its node, or network_latency or
    application (analytics/localize.py); then the other nodes' physical causes, with the same scores and floor
    as an incident's. Each cause names its node, and the service and pod it was found for (None where no
    culprit led to it)."""
    analysis = _Analysis(store, spec, baseline, lookback)
    fleet = Window.around(at, at + MOMENT_SPAN, spec.resolution_s, baseline, lookback)
    nodes = [node] if node else sorted(set(analysis.scores(fleet)["node"].to_list()))
    ranked, candidates, baselines = [], [], {}
    for name in nodes:
        window = analysis.window(name, at, at + MOMENT_SPAN)
        causes, diagnosis = diagnose(analysis.scores(window), name, window, top, spec.taxonomy)
        ranked += [{"service": None, "pod": None, "node": name, **c} for c in causes]
        candidates += [{"node": name, **c} for c in diagnosis.get("candidates", [])]
        baselines[name] = diagnosis.pop("baseline")
    ranked.sort(key=lambda c: -c["score"])
    candidates.sort(key=lambda c: -c["score"])
    found, entry = culprits(store, Windows(at - lookback - baseline, at - lookback, at, at + MOMENT_SPAN),
                            tiers=store.tier_params(spec))
    found = [c for c in found if node is None or c["node"] == node]
    onsets = {(c["node"], c["pod"]): c["onset"] for c in reversed(found)}  # the first culprit's, where two share
    led = culprit_causes(found, lambda name, pod: _node_causes(analysis, spec, name, pod, onsets[name, pod],
                                                                at + MOMENT_SPAN, top), top)
    _onsets_as_text(found)
    ranked = _after(led, ranked)
    if ranked:
        diagnosis = {"verdict": "ranked", "floor": CLEAR_CAUSE_FLOOR}
    elif not node or diagnosis["verdict"] == "no_clear_cause":  # else the one node asked for says why it has none
        diagnosis = {"verdict": "no_clear_cause", "floor": CLEAR_CAUSE_FLOOR, "candidates": candidates[:CANDIDATES],
                     "reason": f"no (node, cause) pair's evidence reaches the floor of {CLEAR_CAUSE_FLOOR:g}"
                               if nodes else "no node has signals around that moment"}
    moment = {"at": rfc3339(at), "until": rfc3339(at + MOMENT_SPAN), "node": node, "causes": ranked[:top],
              "culprits": found, "entry": entry, "diagnosis": {**diagnosis, "baselines": baselines}}
    return {"incidents": [], "moment": moment}


def _node_causes(analysis: "_Analysis", spec, node: str, pod: str | None, onset: datetime, end: datetime,
                 top: int) -> list[dict]:
    """The physical causes of a culprit's node from the culprit's onset (its baseline ends before the culprit
    changed, and a cause must have moved by then), its pod's own series among the evidence, judged against the
    fleet's movement (a change seen everywhere is no node's cause)."""
    window = analysis.window(node, onset, max(end, onset + MOMENT_SPAN))
    return diagnose(analysis.scores(window, node), node, window, top, spec.taxonomy, analysis.fleet(window), pod)[0]


def _after(led: list[dict], others: list[dict]) -> list[dict]:
    """The culprits' causes, then the other causes of nodes and causes they did not name."""
    named = {(c["node"], c["cause"]) for c in led}
    return led + [c for c in others if (c["node"], c["cause"]) not in named]


def _onsets_as_text(found: list[dict]) -> None:
    for culprit in found:
        culprit["onset"] = rfc3339(culprit["onset"])


class _Analysis:
    """Signal scores per analysis window and node, and the fleet's movement per window, each computed once however
    many incidents share them. An incident's own node is scored here; the rest of the fleet only as Fleet."""

    def __init__(self, store: StoreReader, spec, baseline: timedelta, lookback: timedelta,
                 timed: StageTimer | None = None):
        self.store, self.resolution_s, self.baseline, self.lookback = store, spec.resolution_s, baseline, lookback
        self.timed = timed or StageTimer()
        self.known = spec.taxonomy  # the causes to rank: the built-in ones and the spec's
        self._scores: dict[tuple[Window, str | None], pl.DataFrame] = {}
        self._fleets: dict[Window, Fleet] = {}
        self._history: dict[tuple[str, datetime], datetime | None] = {}

    def window(self, node: str, start: datetime, end: datetime) -> Window:
        window = Window.around(start, end, self.resolution_s, self.baseline, self.lookback)
        asked = (node, window.baseline_start)
        if asked not in self._history:
            with self.timed("signal_steps"):
                self._history[asked] = self.store.rows(self.store.sql("signal_history"),
                                                       {"node": node, "since": window.baseline_start})[0][0]
        return window.fitted(self._history[asked])

    def scores(self, window: Window, node: str | None = None) -> pl.DataFrame:
        """The series scores of `node`, or of every node."""
        if (window, node) not in self._scores:
            with self.timed("signal_steps"):
                steps = signal_steps(self.store, window, self.known, evidence_only=True, node=node)
            with self.timed("attribution"):
                self._scores[window, node] = series_scores(steps, window, known=self.known)
        return self._scores[window, node]

    def fleet(self, window: Window) -> Fleet:
        if window not in self._fleets:
            with self.timed("signal_steps"):
                self._fleets[window] = fleet_movement(self.store, window, self.known)
        return self._fleets[window]

    def causes(self, node: str, pod: str | None, start: datetime, end: datetime, top: int) -> list[dict]:
        """A node's ranked causes for an episode, `pod`'s own series among the evidence (none where none reaches
        the floor)."""
        window = self.window(node, start, end)
        fleet = self.fleet(window)
        scores = self.scores(window, node)
        with self.timed("attribution"):
            return diagnose(scores, node, window, top, self.known, fleet, pod)[0]

    def top_cause(self, node: str, start: datetime, end: datetime) -> dict | None:
        window = self.window(node, start, end)
        fleet = self.fleet(window)
        scores = self.scores(window, node)
        with self.timed("attribution"):
            causes, _ = diagnose(scores, node, window, known=self.known, fleet=fleet)
        return causes[0] if causes else None

    def continues(self, node: str, episode: tuple[datetime, datetime], incident: Incident) -> bool:
        """Whether `incident` is more of the episode's trouble: the evidence is the same. Its own analysis names
        the episode's top cause; or it names none (its baseline already holds the fault, as when an SLI recovers
        briefly and breaks again) while the episode's top-cause evidence is still away from its baseline just
        before it. An episode with no clear cause has no evidence to follow, so nothing continues it."""
        ongoing = self.top_cause(node, *episode)
        if ongoing is None:
            return False
        own = self.top_cause(node, incident.start, incident.end)
        if own is not None:
            return own["cause"] == ongoing["cause"]
        just_before = incident.start - timedelta(seconds=2 * self.resolution_s)
        recent = Window(just_before, just_before, just_before, incident.start, self.resolution_s)
        scores = self.scores(self.window(node, *episode), node)
        with self.timed("signal_steps"):
            recent_steps = signal_steps(self.store, recent, node=node)
        with self.timed("attribution"):
            return evidence_still_moved(scores, recent_steps, node, ongoing, recent)


def episodes(incidents: list[Incident], continues=None) -> list[tuple[datetime, datetime]]:
    """For each incident, the (start, end) of its node's episode of trouble: incidents on the same node that
    overlap, or follow each other within EPISODE_GAP while their evidence is the same (`continues(node,
    episode, incident)`; without it, time alone decides). An SLI that recovers briefly and breaks again during
    one fault is explained from the fault's start, not from a baseline that already contains the fault; a new
    fault, with evidence of its own, is a new episode with its own onset and baseline, even while the last
    fault's signals are still settling."""
    ids, spans, open_episode = [], [], {}
    for incident in incidents:  # sorted by start
        # An incident over every node is its service's trouble, with no node's evidence to follow.
        every_node = incident.node == EVERY_NODE
        place = (incident.node, incident.service if every_node else "")
        current = open_episode.get(place)
        if current is None or incident.start > spans[current][1] + EPISODE_GAP or (
                continues is not None and not every_node and incident.start > spans[current][1] and
                not continues(incident.node, spans[current], incident)):
            current = len(spans)
            spans.append((incident.start, incident.end))
            open_episode[place] = current
        spans[current] = (spans[current][0], max(spans[current][1], incident.end))
        ids.append(current)
    return [spans[i] for i in ids]


def incident_json(incident: Incident, causes: list[dict], diagnosis: dict, found: list[dict]) -> dict:
    return {"tier": incident.tier, "service": incident.service, "node": incident.node,
            "start": rfc3339(incident.start), "end": rfc3339(incident.end), "sli": incident.sli, "causes": causes,
            "culprits": found, "diagnosis": diagnosis}


def format_table(result: dict, no_requests: bool = False) -> str:
    """The result for people; `no_requests`: the analysed range held no requests, so no incident says nothing
    about the objectives."""
    if "moment" in result:
        return _moment_table(result["moment"])
    incidents = result["incidents"]
    if no_requests:
        return f"Nothing to judge: the store {NO_REQUESTS}."
    if not incidents:
        return "No SLO violations: every tier met its objectives in the analysed range."
    lines = [f"{len(incidents)} incident(s)"]
    for n, inc in enumerate(incidents, 1):
        sli = inc["sli"]
        if sli["kind"] == "latency":
            what = f"p{sli['percentile']:g} {sli['observed_ms']:.0f} ms > {sli['objective_ms']:.0f} ms"
        else:
            what = f"error ratio {sli['observed_error_ratio']:.2%} > {sli['objective_error_ratio']:.2%}"
        lines.append("")
        lines.append(f"#{n} {inc['tier']} / {inc['service']} on {on_nodes(inc['node'])}  "
                     f"{inc['start']} .. {inc['end']}  ({what})")
        lines.extend(_culprit_lines(inc.get("culprits", [])))
        if not inc["causes"]:
            lines.extend(_no_cause_lines(inc.get("diagnosis", {})))
        for rank, cause in enumerate(inc["causes"], 1):
            lines.append(f"   {rank}. {_where(cause)}{cause['cause']:<22} {cause['layer']:<8} score "
                         f"{cause['score']:.2f}  -> {cause['remediation']}")
            lines.extend(_evidence_lines(cause))
    return "\n".join(lines)


def on_nodes(node: str) -> str:
    """Where an incident was judged, for people."""
    return "every node" if node == EVERY_NODE else node


def _where(cause: dict) -> str:
    """The service, pod and node a cause was found for, where a culprit led to it."""
    if not cause.get("service") or not cause.get("pod"):
        return ""
    return f"{cause['service']} ({cause['pod']} on {cause['node']}): "


def _culprit_lines(found: list[dict]) -> list[str]:
    """Each culprit with its path from the entry."""
    return [f"   culprit {' -> '.join(c['path'])} ({c['pod'] or '-'} on {c['node']}): {described(c)}" for c in found]


def _evidence_lines(cause: dict) -> list[str]:
    lines = []
    for ev in cause["evidence"]:
        attrs = ",".join(f"{k}={v}" for k, v in ev["attributes"].items())
        lines.append(f"        {ev['signal']}{'{' + attrs + '}' if attrs else ''}: "
                     f"{ev['baseline']} -> {ev['observed']} (z {ev['z']}, onset {ev['onset'] or '-'})")
    return lines


def _moment_table(moment: dict) -> str:
    where = f" on {moment['node']}" if moment["node"] else ""
    lines = [f"What changed{where} in {moment['at']} .. {moment['until']}"]
    lines.extend(_culprit_lines(moment.get("culprits", [])))
    if not moment["causes"]:
        lines.extend(_no_cause_lines(moment["diagnosis"]))
    for rank, cause in enumerate(moment["causes"], 1):
        lines.append(f"   {rank}. {cause.get('service') or '-':<16} {cause['node']:<16} {cause['cause']:<22} score "
                     f"{cause['score']:.2f}  -> {cause['remediation']}")
        lines.extend(_evidence_lines(cause))
    return "\n".join(lines)


def _no_cause_lines(diagnosis: dict) -> list[str]:
    lines = [f"   no clear cause: {diagnosis.get('reason', 'no physical cause stands out on this node')}"]
    for c in diagnosis.get("candidates", []):
        where = f"{c['node']}: " if "node" in c else ""
        lines.append(f"      {where}{c['cause']:<22} score {c['score']:.2f}: {'; '.join(c['falls_short'])}")
    return lines


def evidence_still_moved(scores: pl.DataFrame, recent_steps: pl.DataFrame, node: str, cause: dict,
                         recent: Window) -> bool:
    """Whether a series of `cause`'s evidence on `node` is still anomalous in `recent_steps` (the median of its
    robust z above THRESHOLD), against the baseline in `scores`. A growth feature is followed on its level: a
    leak's memory stays up."""
    for ev in cause["evidence"]:
        attributes = json.dumps(ev["attributes"], sort_keys=True)
        base = [r for r in scores.filter((pl.col("node") == node) & (pl.col("metric") == ev["signal"]))
                .iter_rows(named=True) if json.loads(r["attributes"]) == ev["attributes"]]
        if not base:
            continue
        values = [v for a, v in recent_steps.filter(
            (pl.col("node") == node) & (pl.col("metric") == ev["signal"]) & (pl.col("step") >= recent.incident_start))
            .select("attributes", "value").iter_rows() if json.dumps(json.loads(a), sort_keys=True) == attributes]
        if values:
            z = [(v - base[0]["baseline"]) * base[0]["direction"] / base[0]["scale"] for v in values]
            if sorted(z)[len(z) // 2] > THRESHOLD:
                return True
    return False
