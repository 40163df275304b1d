"""`sloscope report`: one self-contained HTML file for a set of incidents (no network needed to view it).

For the incidents `analytics.rca.analyse` finds in the analysed range, grouped into episodes (incidents on the
same node that overlap or follow each other within two minutes share one analysis):

- a summary: the spec's objectives, the analysed range, and every incident with its top cause;
- per episode: the SLI of each incident (the tier's latency percentile or error ratio per SLI step, for the
  incident's service on its node, with the median of the other nodes for comparison) against the objective, the
  incident shaded; every top cause's evidence signals on the same time axis, with the baseline and the onset
  marked, and the same signal's median on the other nodes; the evidence tables; the remediation sloscope suggests
  and the remediation taken (from the remediation_audit table of the alerts stage when the database has one),
  also marked on the SLI charts.

Charts are inline SVG drawn here (dashboards/svg.py); styles are inline; there is no script.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from html import escape
from urllib.parse import quote

import polars as pl

from sloscope import catalog, json_answers
from sloscope.slo_spec import TOKEN_NAMES, TOKEN_SLIS, SloSpec
from sloscope.times import parse_rfc3339, rfc3339

from sloscope.analytics.attribution import BASELINE, GROWTH_SUFFIX, LOOKBACK, Window, signal_steps
from sloscope.analytics.graph import described
from sloscope.analytics.rca import EPISODE_GAP, NO_REQUESTS, analyse, holds_requests, on_nodes
from sloscope.analytics.slo import MIN_REQUESTS, sli_windows, window_latencies
from sloscope.analytics.store_api import StoreReader

from sloscope.dashboards import grafana
from sloscope.dashboards.svg import Chart, Marker, Series, Shade, format_value, path_diagram, time_chart

AFTER = timedelta(minutes=2)  # shown after an episode ends
REMEDIATION_BEFORE = timedelta(minutes=10)
REMEDIATION_AFTER = timedelta(minutes=30)
OTHER_NODES = "other nodes (median)"
CULPRITS_SHOWN = 3


@dataclass
class Episode:
    node: str
    start: datetime
    end: datetime
    incidents: list[dict] = field(default_factory=list)

    @property
    def causes(self) -> list[dict]:
        """The ranked causes; incidents of one episode share one analysis, so the best-scored list is all."""
        best = max(self.incidents, key=lambda i: i["causes"][0]["score"] if i["causes"] else -1.0)
        return best["causes"]

    @property
    def anchor(self) -> str:
        """An id for the episode's section: the node's name is untrusted (any OTLP client sends it), so only its
        letters, digits and dashes stand in the id, and a hash of the whole name keeps two nodes apart (and two
        services' episodes over every node)."""
        readable = re.sub(r"[^A-Za-z0-9-]+", "-", self.node)[:64]
        whose = self.node + ("\0" + self.incidents[0]["service"] if self.node == catalog.EVERY_NODE else "")
        digest = hashlib.blake2b(whose.encode(), digest_size=4).hexdigest()
        return f"episode-{readable}-{digest}-{self.start:%Y%m%dT%H%M%S}"


def episodes(incidents: list[dict]) -> list[Episode]:
    """The incidents by their node's episodes, as the analysis merged them: an incident over every node is its
    service's trouble alone."""
    out: list[Episode] = []
    open_by_place: dict[tuple[str, str], Episode] = {}
    for inc in sorted(incidents, key=lambda i: (i["start"], i["node"])):
        start, end = parse_rfc3339(inc["start"]), parse_rfc3339(inc["end"])
        place = (inc["node"], inc["service"] if inc["node"] == catalog.EVERY_NODE else "")
        ep = open_by_place.get(place)
        if ep is None or start > ep.end + EPISODE_GAP:
            ep = Episode(inc["node"], start, end)
            open_by_place[place] = ep
            out.append(ep)
        ep.end = max(ep.end, end)
        ep.incidents.append(inc)
    return out


# --- units ---------------------------------------------------------------------------------------------------------

def signal_unit(signal: str, feature: str | None = None) -> str:
    """The unit of a signal as signal_steps gives it: gauges as measured, counters per second, histograms' mean."""
    if feature:
        return "ratio"
    sig = catalog.BY_NAME.get(signal)
    if sig is None:
        return ""
    unit = sig.unit
    if sig.instrument is catalog.Instrument.COUNTER:
        return {"s": "ratio", "By": "bytes/s"}.get(unit, unit.strip("{}") + "/s")
    return {"s": "s", "1": "ratio", "By": "bytes", "Cel": "celsius"}.get(unit, unit.strip("{}"))


def _attrs(attributes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(attributes.items()))


def _t(text: str | None) -> datetime | None:
    return parse_rfc3339(text) if text else None


# --- data ----------------------------------------------------------------------------------------------------------

def remediation_rows(store: StoreReader, node: str, tiers: set[str], since: datetime,
                     until: datetime) -> list[dict] | None:
    """Remediation decisions about the node (or the incidents' tiers) around the episode; None when the database
    has no remediation_audit table (the alerts stage creates it)."""
    exists = store.scalar("SELECT count(*) FROM information_schema.tables WHERE table_name = 'remediation_audit'")
    if not exists:
        return None
    targets = [f"backend:{node}", f"workload:{node}", *(f"tier:{t}" for t in sorted(tiers))]
    placeholders = ", ".join("?" for _ in targets)
    rows = store.rows(
        f"SELECT ts, alert, action, target, decision, reason FROM remediation_audit "
        f"WHERE ts >= ? AND ts <= ? AND (target IN ({placeholders}) OR target LIKE ? "
        f"OR json_extract_string(params, '$.node') = ?) ORDER BY ts",
        [since, until, *targets, f"bdev:{node}/%", node])
    return [dict(zip(("ts", "alert", "action", "target", "decision", "reason"), r)) for r in rows]


def _sli_series(frame: pl.DataFrame, inc: dict, step: timedelta) -> tuple[list, list]:
    """(this node's points, the other nodes' median points) of the incident's SLI, per SLI step (mid-step). An
    incident over every node has its service's points over all of them, and the nodes' own median beside."""
    kind = inc["sli"]["kind"]
    judged = f"{kind}_requests" if kind in TOKEN_SLIS else "requests"
    rows = frame.filter(pl.col("service") == inc["service"]).filter(pl.col(judged) >= MIN_REQUESTS)
    value = (pl.col("failures") / pl.col("requests") if kind == "availability" else pl.col("latency_ms")).alias("v")
    rows = rows.select("node", "window_start", value)
    half = step / 2
    mine = [(t + half, v) for t, v in rows.filter(pl.col("node") == inc["node"]).select("window_start", "v").rows()]
    others = (rows.filter(~pl.col("node").is_in([inc["node"], catalog.EVERY_NODE])).group_by("window_start")
              .agg(pl.col("v").median())
              .sort("window_start"))
    return mine, [(t + half, v) for t, v in others.rows()]


def _signal_points(steps: pl.DataFrame, node: str, metric: str, attributes: dict) -> tuple[list, list]:
    """(the evidence series on the node, the median of the same metric on the other nodes), per step."""
    rows = steps.filter(pl.col("metric") == metric)
    mine = [(t, v) for a, t, v in rows.filter(pl.col("node") == node).select("attributes", "step", "value").rows()
            if json.loads(a) == attributes]
    others = (rows.filter(pl.col("node") != node).group_by("step").agg(pl.col("value").median()).sort("step"))
    return sorted(mine), others.rows()


# --- HTML ----------------------------------------------------------------------------------------------------------

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1140px;color:#222;
background:#fff;line-height:1.4}
h1{font-size:24px;margin:0 0 4px} h2{font-size:19px;margin:34px 0 6px;padding-top:10px;border-top:2px solid #ddd}
h3{font-size:15.5px;margin:22px 0 4px} .muted{color:#666} .small{font-size:12.5px}
table{border-collapse:collapse;margin:8px 0 12px;font-size:13px} th,td{border:1px solid #d5d5d5;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.cause{border-left:4px solid #d62728;padding-left:12px;margin:14px 0} .rem{background:#fff7e6;border:1px solid #f0d9a8;
padding:6px 10px;margin:8px 0} .ok{color:#2a7d2a} .bad{color:#b22} svg.chart{display:block;margin:6px 0 2px}
code{font-size:12.5px;background:#f5f5f5;padding:0 3px} details pre{font-size:11.5px;overflow:auto;max-height:400px;
background:#f7f7f7;padding:8px}
"""


def _culprit_paths(ep: Episode) -> list[str]:
    """The path from the entry to each culprit of the episode's best-explained incident (docs/traces.md)."""
    best = max(ep.incidents, key=lambda i: i["causes"][0]["score"] if i["causes"] else -1.0)
    out = []
    for culprit in best.get("culprits", [])[:CULPRITS_SHOWN]:
        where = f"{culprit['pod'] or '-'} on {culprit['node']}"
        out.append(f"<div class=path><p class=small>Culprit, from the entry:</p>"
                   f"{path_diagram(culprit['path'], where, described(culprit))}</div>")
    return out


def _table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sli_text(sli: dict) -> str:
    if sli["kind"] != "availability":
        what = "" if sli["kind"] == "latency" else f"{TOKEN_NAMES[sli['kind']]} "
        observed = "–" if sli["observed_ms"] is None else f"{sli['observed_ms']:.0f}"
        return f"{what}p{sli['percentile']:g} {observed} ms &gt; objective {sli['objective_ms']:g} ms"
    observed = sli.get("observed_error_ratio")
    observed_text = f"{observed:.2%}" if observed is not None else "–"
    return f"error ratio {observed_text} &gt; budget {sli['objective_error_ratio']:.2%}"


def _span(start: str, end: str) -> str:
    """'2026-11-29 18:20:10 – 18:25:30' (the date once when both ends are on the same day)."""
    a, b = _t(start), _t(end)
    tail = f"{b:%H:%M:%S}" if a.date() == b.date() else f"{b:%Y-%m-%d %H:%M:%S}"
    return f"<span style='white-space:nowrap'>{a:%Y-%m-%d %H:%M:%S} – {tail}</span>"


def _grafana_link(grafana_url: str | None, ep: Episode, t0: datetime, t1: datetime) -> str:
    if not grafana_url or ep.node == catalog.EVERY_NODE:  # no one node's dashboard shows it
        return ""
    ms = lambda t: int(t.replace(tzinfo=timezone.utc).timestamp() * 1000)  # noqa: E731
    url = (f"{grafana_url.rstrip('/')}/d/{grafana.NODE_UID}/sloscope-node?var-node={quote(ep.node, safe='')}"
           f"&from={ms(t0)}&to={ms(t1)}")
    return f' · <a href="{escape(url)}">node dashboard in Grafana</a>'


class Report:
    def __init__(self, store: StoreReader, spec: SloSpec, *, top: int = 3, grafana_url: str | None = None):
        self.store, self.spec, self.top, self.grafana_url = store, spec, top, grafana_url
        first, last = store.rows(store.sql("data_range"))[0]
        self.first, self.last = first, last

    def render(self, since: datetime | None = None, until: datetime | None = None, *, db_label: str = "",
               generated: datetime | None = None) -> str:
        result = analyse(self.store, self.spec, since=since, until=until, top=self.top)
        eps = episodes(result["incidents"])
        generated = generated or datetime.now(timezone.utc).replace(tzinfo=None)
        lo = since or self.first
        hi = until or self.last
        parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>sloscope incident report"
                 f"</title><meta name=viewport content='width=device-width, initial-scale=1'><style>{CSS}</style>"
                 f"</head><body>",
                 "<h1>sloscope incident report</h1>",
                 f"<p class='muted small'>generated {rfc3339(generated)} from {escape(db_label or str(self.store.path))}"
                 f"; SLO spec {escape(self.spec.source)}; analysed "
                 f"{rfc3339(lo) if lo else '–'} .. {rfc3339(hi) if hi else '–'} (UTC)</p>",
                 self._objectives()]
        if not eps and not holds_requests(self.store, since, until):
            parts.append(f"<p class=muted><b>Nothing to judge</b>: the store {NO_REQUESTS}.</p>")
        elif not eps:
            parts.append("<p class=ok><b>No SLO violations</b>: every tier met its objectives in the analysed "
                         "range.</p>")
        else:
            parts.append(self._summary(eps))
            for n, ep in enumerate(eps, 1):
                parts.append(self._episode(n, ep))
        parts.append("<details><summary class='small muted'>the analysis as JSON (sloscope rca's)</summary><pre>"
                     f"{escape(json_answers.dumps(result, indent=1))}</pre></details></body></html>")
        return "\n".join(parts)

    def _objectives(self) -> str:
        rows = [[escape(t.name) + (" (default)" if t.name == self.spec.default_tier else ""),
                 f"p{t.percentile:g} ≤ {t.threshold_ms:g} ms", f"{t.availability:g}%", f"{t.error_budget:.2%}"]
                + ([", ".join(f"{k.sli} p{k.percentile:g} ≤ {k.threshold_ms:g} ms" for k in t.tokens) or "–"]
                   if self._tokens else [])
                for t in self.spec.tiers.values()]
        return _table(["tier", "latency objective", "availability", "error budget"]
                      + (["token objectives"] if self._tokens else []), rows)

    @property
    def _tokens(self) -> bool:
        """Whether any tier gives a token objective: a spec without them shows the table it always has."""
        return any(t.tokens for t in self.spec.tiers.values())

    def _summary(self, eps: list[Episode]) -> str:
        rows = []
        for n, ep in enumerate(eps, 1):
            for inc in ep.incidents:
                top = inc["causes"][0] if inc["causes"] else None
                rows.append([f"<a href='#{ep.anchor}'>#{n}</a>", escape(inc["tier"]), escape(inc["service"]),
                             escape(on_nodes(inc["node"])), _span(inc["start"], inc["end"]), _sli_text(inc["sli"]),
                             f"<b>{escape(top['cause'])}</b> ({top['score']:.2f})" if top else "none stands out"])
        count = sum(len(ep.incidents) for ep in eps)
        return (f"<p><b class=bad>{count} incident(s)</b> in {len(eps)} episode(s).</p>"
                + _table(["episode", "tier", "service", "node", "time (UTC)", "SLI", "top cause"], rows))

    def _episode(self, n: int, ep: Episode) -> str:
        spec = self.spec
        t0 = ep.start - BASELINE - LOOKBACK
        t1 = ep.end + AFTER
        if self.first is not None:
            t0 = max(t0, self.first)
        if self.last is not None:
            t1 = min(t1, self.last + timedelta(seconds=spec.resolution_s))
        tiers = {inc["tier"] for inc in ep.incidents}
        remediation = remediation_rows(self.store, ep.node, tiers, ep.start - REMEDIATION_BEFORE,
                                       ep.end + REMEDIATION_AFTER)
        rem_markers = [Marker(f"{r['action'] or r['alert']}: {r['decision']}", at=r["ts"], color="#7b3fb3",
                              dashed=False) for r in (remediation or []) if t0 <= r["ts"] <= t1]
        causes = ep.causes
        top = causes[0] if causes else None
        head = (f"<h2 id='{ep.anchor}'>#{n} {escape(on_nodes(ep.node))}: {rfc3339(ep.start)} .. {rfc3339(ep.end)}"
                f"{' — ' + escape(top['cause']) if top else ''}</h2>"
                f"<p class='small muted'>{len(ep.incidents)} incident(s); charts from {rfc3339(t0)} (the baseline "
                f"the analysis compares with) to {rfc3339(t1)}; the incident is shaded"
                f"{_grafana_link(self.grafana_url, ep, t0, t1)}</p>")
        parts = [head]
        if top:
            parts.append(f"<div class=rem><b>Suggested remediation:</b> {escape(top['remediation'])}</div>")
        parts.extend(_culprit_paths(ep))

        # SLI of every incident, against its objective.
        step = timedelta(seconds=spec.resolution_s)
        windows = sli_windows(self.store, spec, t0, t1)
        frames: dict[tuple[str, float], pl.DataFrame] = {}
        for inc in ep.incidents:
            objective = spec.tiers.get(inc["tier"])
            if objective is None:
                continue
            objective = objective.at(inc["service"])  # the service's own, where the spec gives one
            kind = inc["sli"]["kind"]
            measure = kind if kind in TOKEN_SLIS else "latency"
            judged = (inc["tier"], measure, objective.percentile)
            if judged not in frames:
                frames[judged] = windows[inc["tier"]].join(
                    window_latencies(self.store, spec, objective, t0, t1, measure),
                    on=["service", "node", "window_start"])
            mine, others = _sli_series(frames[judged], inc, step)
            start, end = _t(inc["start"]), _t(inc["end"])
            if kind != "availability":
                percentile, threshold_ms = inc["sli"]["percentile"], inc["sli"]["objective_ms"]
                what = TOKEN_NAMES.get(kind, "latency")
                title = (f"SLI {inc['tier']} / {inc['service']} on {on_nodes(inc['node'])}: "
                         f"p{percentile:g} {what} per {spec.resolution_s:g} s")
                unit, line = "ms", Marker(f"objective {threshold_ms:g} ms", value=threshold_ms)
                name = f"p{percentile:g} on {on_nodes(inc['node'])}"
            else:
                title = (f"SLI {inc['tier']} / {inc['service']} on {on_nodes(inc['node'])}: error ratio per "
                         f"{spec.resolution_s:g} s")
                unit, line = "ratio", Marker(f"budget {objective.error_budget:.2%}", value=objective.error_budget)
                name = f"error ratio on {on_nodes(inc['node'])}"
            chart = Chart(title, unit, t0, t1,
                          series=[Series(OTHER_NODES, others, color="#9a9a9a", width=1.2), Series(name, mine)],
                          markers=[line, *rem_markers], shades=[Shade(start, end, "incident")])
            parts.append(f"<div class=sli>{time_chart(chart)}</div>")

        # Causes: evidence signals on the same axis, and their tables.
        if not causes:
            parts.append("<p>No physical cause stands out on this node.</p>")
        else:
            window = Window(t0, t0, ep.start, t1, spec.resolution_s)
            steps = signal_steps(self.store, window)
            for rank, cause in enumerate(causes[: self.top], 1):
                parts.append(self._cause(rank, cause, ep, steps, t0, t1))
        parts.append(self._remediation(remediation))
        return "\n".join(parts)

    def _cause(self, rank: int, cause: dict, ep: Episode, steps: pl.DataFrame, t0: datetime, t1: datetime) -> str:
        parts = [f"<div class=cause><h3>{rank}. {escape(cause['cause'])} <span class=muted>({escape(cause['layer'])}"
                 f", score {cause['score']:.2f})</span></h3>",
                 f"<p class=small>Remediation: {escape(cause['remediation'])}</p>"]
        rows = []
        node = cause.get("node") or ep.node  # a culprit's causes are its node's, not the incident's
        for ev in cause["evidence"]:
            feature = ev.get("feature")
            metric = ev["signal"] + (GROWTH_SUFFIX if feature else "")
            unit = signal_unit(ev["signal"], feature)
            mine, others = _signal_points(steps, node, metric, ev["attributes"])
            onset = _t(ev.get("onset"))
            markers = [Marker(f"baseline {format_value(ev['baseline'], unit)}", value=ev["baseline"],
                              color="#2a7d2a")] if ev.get("baseline") is not None else []
            if onset:
                markers.append(Marker(f"onset {onset:%H:%M:%S}", at=onset, color="#d62728"))
            what = ev["signal"] + (" growth per minute" if feature else "")
            attrs = _attrs(ev["attributes"])
            chart = Chart(f"{what}" + (f" {{{attrs}}}" if attrs else "") + f" on {node}", unit, t0, t1,
                          series=[Series(OTHER_NODES, others, color="#9a9a9a", width=1.2),
                                  Series(node, mine, color="#d62728")],
                          markers=markers, shades=[Shade(ep.start, ep.end, "incident")], height=180)
            parts.append(time_chart(chart))
            rows.append([f"<code>{escape(what)}</code>", escape(attrs) or "–",
                         escape(format_value(ev.get("baseline"), unit)), escape(format_value(ev.get("observed"), unit)),
                         f"{ev.get('z', 0):g}", f"{ev.get('fleet_share', 0):.0%}", escape(ev.get("onset") or "–")])
        parts.append(_table(["signal", "attributes", "baseline", "during the incident", "robust z",
                             "other nodes that moved", "onset"], rows, numeric={2, 3, 4, 5}))
        parts.append("</div>")
        return "\n".join(parts)

    @staticmethod
    def _remediation(rows: list[dict] | None) -> str:
        if rows is None:
            return ("<h3>Remediation taken</h3><p class='small muted'>This database has no remediation audit (the "
                    "alerts stage records one when <code>sloscope webhook</code> runs with it).</p>")
        if not rows:
            return ("<h3>Remediation taken</h3><p class='small muted'>None recorded for this node or its tiers "
                    "around the episode.</p>")
        table = _table(["time (UTC)", "alert", "action", "target", "decision", "reason"],
                       [[rfc3339(r["ts"]), escape(r["alert"] or ""), escape(r["action"] or "–"),
                         escape(r["target"] or "–"), escape(r["decision"]), escape(r["reason"] or "")] for r in rows])
        return "<h3>Remediation taken</h3>" + table


def render(store: StoreReader, spec: SloSpec, *, since: datetime | None = None, until: datetime | None = None,
           top: int = 3, grafana_url: str | None = None, db_label: str = "") -> str:
    return Report(store, spec, top=top, grafana_url=grafana_url).render(since, until, db_label=db_label)

