"""Incidents and their ranked causes, as Contract 4's JSON document or a table for people."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sloscope.slo_spec import SpecError, parse_duration

from analytics.attribution import BASELINE, LOOKBACK, Window, rank_causes, series_scores, signal_steps
from analytics.slo import Incident, find_incidents
from analytics.store import Store, sql

EPISODE_GAP = timedelta(minutes=2)


def rfc3339(t: datetime) -> str:
    return t.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str, newest: datetime | None) -> datetime:
    """RFC 3339, or a duration back from the newest stored request (e.g. 1h)."""
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t
    except ValueError:
        pass
    try:
        seconds = parse_duration(text, "--since")
    except SpecError:
        raise ValueError(f"{text!r} is neither an RFC 3339 time nor a duration like 30m") from None
    if newest is None:
        raise ValueError("a relative time needs stored requests to count back from")
    return newest - timedelta(seconds=seconds)


def analyse(store: Store, spec, since: datetime | None = None, until: datetime | None = None, top: int = 5,
            baseline: timedelta = BASELINE, lookback: timedelta = LOOKBACK) -> dict:
    """Incidents in [since, until) with their ranked causes. Each cause's signals are judged against a
    `baseline` that ends `lookback` before its episode began (attribution.BASELINE and LOOKBACK by default)."""
    first, last = store.rows(sql("data_range"))[0]
    if first is None:
        return {"incidents": []}
    since = since or first
    until = until or last + timedelta(seconds=1)
    incidents = find_incidents(store, spec, since, until)
    scored: dict[Window, object] = {}
    out = []
    for incident, (start, end) in zip(incidents, episodes(incidents)):
        window = Window.around(start, end, spec.resolution_s, baseline, lookback)
        if window not in scored:
            scored[window] = series_scores(signal_steps(store, window), window)
        out.append(incident_json(incident, rank_causes(scored[window], incident.node, window, top)))
    return {"incidents": out}


def episodes(incidents: list[Incident]) -> list[tuple[datetime, datetime]]:
    """For each incident, the (start, end) of its node's episode of trouble: incidents on the same node that
    overlap or follow each other within EPISODE_GAP. An SLI that recovers briefly and breaks again during one
    fault is explained from the fault's start, not from a baseline that already contains the fault; and all
    incidents of an episode share one analysis."""
    ids, spans, open_episode = [], [], {}
    for incident in incidents:  # sorted by start
        current = open_episode.get(incident.node)
        if current is None or incident.start > spans[current][1] + EPISODE_GAP:
            current = len(spans)
            spans.append((incident.start, incident.end))
            open_episode[incident.node] = current
        spans[current] = (spans[current][0], max(spans[current][1], incident.end))
        ids.append(current)
    return [spans[i] for i in ids]


def incident_json(incident: Incident, causes: list[dict]) -> dict:
    return {"tier": incident.tier, "service": incident.service, "node": incident.node,
            "start": rfc3339(incident.start), "end": rfc3339(incident.end), "sli": incident.sli, "causes": causes}


def format_table(result: dict) -> str:
    incidents = result["incidents"]
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
        lines.append(f"#{n} {inc['tier']} / {inc['service']} on {inc['node']}  {inc['start']} .. {inc['end']}  ({what})")
        if not inc["causes"]:
            lines.append("   no physical cause stands out on this node")
        for rank, cause in enumerate(inc["causes"], 1):
            lines.append(f"   {rank}. {cause['cause']:<22} {cause['layer']:<8} score {cause['score']:.2f}  -> {cause['remediation']}")
            for ev in cause["evidence"]:
                attrs = ",".join(f"{k}={v}" for k, v in ev["attributes"].items())
                lines.append(f"        {ev['signal']}{'{' + attrs + '}' if attrs else ''}: "
                             f"{ev['baseline']} -> {ev['observed']} (z {ev['z']}, onset {ev['onset'] or '-'})")
    return "\n".join(lines)
