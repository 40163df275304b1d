"""Scoring the live demo: what serve's GET /rca says about each injected fault (found? on the node? the injected
cause first? how soon?), what a dashboard polling /rca would have seen and when, and the p99 before and during
each fault from the stored requests.

rca's baseline here is 60 s ending 20 s before each incident (attribution's default is 10 minutes ending 1
minute before): each recovery is long enough that the next fault's baseline is clean of the previous fault.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy

from sloscope.analytics.store import Store
from sloscope.times import parse_rfc3339, rfc3339

from .config import LiveConfig, utcnow
from .pipeline import Pipeline

log = logging.getLogger("sloscope.live")

RESOLUTION = timedelta(seconds=5)  # the demo spec's SLI step
POLL_SPAN = timedelta(seconds=90)  # what each poll asks /rca about, back from now
SETTLE_AFTER = timedelta(seconds=10)  # spans and samples of the fault's last seconds still arriving
INCIDENT_START = "GET /rca: incidents[].start"
STEADY_BEFORE = timedelta(seconds=60)  # the p99 a fault is compared with: the minute before it
TIERS = ("p99-latency-critical", "standard")


@dataclass
class FaultResult:
    fault: str
    cause: str
    action: str
    start: str
    end: str
    found: bool = False
    tier: str | None = None
    node: str | None = None
    top_cause: str | None = None
    true_rank: int | None = None  # 1-based rank of the injected cause, None when not ranked
    detection_s: float | None = None  # incident start - fault start
    reported_s: float | None = None  # first /rca poll that showed it - fault start
    p99_before_ms: float | None = None
    p99_during_ms: float | None = None
    p99_by_tier: dict = field(default_factory=dict)  # tier -> [before, during] (ms)
    requests_during: int = 0
    failed_during: int = 0
    causes: list = field(default_factory=list)  # ranked (cause, score) of the incident
    evidence: list = field(default_factory=list)  # the top cause's evidence
    error: str | None = None

    @property
    def right(self) -> bool:
        return self.found and self.top_cause == self.cause


class Judge:
    """Asks serve's /rca, in a polling thread while the demo runs and once after each fault."""

    def __init__(self, cfg: LiveConfig, pipeline: Pipeline):
        self.cfg = cfg
        self.pipeline = pipeline
        self.sightings: list[tuple[datetime, dict]] = []  # (when a poll first showed it, incident)
        self._seen: set[tuple] = set()
        self._stop_poll = threading.Event()

    def rca(self, since: datetime, until: datetime | None = None) -> dict:
        query = {"since": rfc3339(since, fraction=True), "baseline": f"{self.cfg.baseline_s:g}s",
                 "lookback": f"{self.cfg.lookback_s:g}s", "top": "13"}
        if until:
            query["until"] = rfc3339(until, fraction=True)
        url = f"http://127.0.0.1:{self.pipeline.http_port}/rca?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.load(response)

    def start_polling(self) -> None:
        threading.Thread(target=self._poll, name="rca-poll", daemon=True).start()

    def stop_polling(self) -> None:
        self._stop_poll.set()

    def _poll(self) -> None:
        """What a dashboard polling serve would have seen, and when."""
        while not self._stop_poll.wait(self.cfg.poll_s):
            try:
                now = utcnow()
                for incident in self.rca(now - POLL_SPAN)["incidents"]:
                    key = (incident["tier"], incident["node"], incident["start"])
                    if key not in self._seen:
                        self._seen.add(key)
                        self.sightings.append((now, incident))
            except Exception as exc:
                log.debug("rca poll failed: %s", exc)

    def judge(self, result: FaultResult, start: datetime, end: datetime) -> None:
        """The first incident on the node that began by the fault's end, against what was injected."""
        incidents = [i for i in self.rca(start - RESOLUTION, end + SETTLE_AFTER)["incidents"]
                     if i["node"] == self.cfg.node and parse_rfc3339(i["start"], INCIDENT_START) <= end]
        if not incidents:
            return
        first = min(incidents, key=lambda i: i["start"])
        ranked = [c["cause"] for c in first["causes"]]
        result.found = True
        result.tier, result.node = first["tier"], first["node"]
        result.top_cause = ranked[0] if ranked else None
        result.true_rank = ranked.index(result.cause) + 1 if result.cause in ranked else None
        result.detection_s = round((parse_rfc3339(first["start"], INCIDENT_START) - start).total_seconds(), 1)
        result.causes = [(c["cause"], c["score"]) for c in first["causes"][:5]]
        result.evidence = first["causes"][0]["evidence"] if first["causes"] else []
        seen = [t for t, i in self.sightings if i["node"] == self.cfg.node
                and start - RESOLUTION <= parse_rfc3339(i["start"], INCIDENT_START) <= end]
        if seen:
            result.reported_s = round((min(seen) - start).total_seconds(), 1)

    def measure(self, results: list[FaultResult]) -> None:
        """p99 before and during each fault, from the requests table (serve has stopped: the file is free)."""
        with Store(self.cfg.dir / "sloscope.duckdb", read_only=True) as store:
            for r in results:
                start, end = parse_rfc3339(r.start), parse_rfc3339(r.end)
                before = start - STEADY_BEFORE
                r.p99_before_ms = self._p99(store, before, start)[0]
                r.p99_during_ms, r.requests_during, r.failed_during = self._p99(store, start, end)
                for tier in TIERS:
                    r.p99_by_tier[tier] = [self._p99(store, before, start, tier)[0],
                                           self._p99(store, start, end, tier)[0]]

    def _p99(self, store, since: datetime, until: datetime, tier: str | None = None) -> tuple[float | None, int, int]:
        """p99 (ms), requests and failures of the node's requests in [since, until), bursts left out: "before"
        is the steady state the fault is compared with."""
        rows = store.rows("SELECT start_time, duration_ms, failed FROM requests WHERE node = ? AND start_time >= ? "
                          "AND start_time < ? AND (? IS NULL OR tier = ?)", [self.cfg.node, since, until, tier, tier])
        burst = timedelta(seconds=self.cfg.burst_s + 2)
        kept = [(d, f) for t, d, f in rows if not any(b <= t < b + burst for b in self.pipeline.bursts)]
        if not kept:
            return None, 0, 0
        p99 = float(numpy.quantile([d for d, _ in kept], 0.99))
        return round(p99, 1), len(kept), sum(f for _, f in kept)


def verdict_line(r: FaultResult) -> str:
    if r.error:
        return f"{r.fault}: analysis failed: {r.error}"
    if not r.found:
        return f"{r.fault}: MISSED (no incident on the node during the fault)"
    rank = f"#{r.true_rank}" if r.true_rank else "not ranked"
    verdict = "right" if r.right else "WRONG"
    reported = f", reported by /rca {r.reported_s:.0f}s after it began" if r.reported_s is not None else ""
    return (f"{r.fault}: incident on {r.node}, tier {r.tier}, its first SLI window began "
            f"{r.detection_s:+.0f}s from the fault's start{reported}; top cause {r.top_cause} ({verdict}); "
            f"{r.cause} ranks {rank}; causes: {', '.join(f'{c} {s:.2f}' for c, s in r.causes[:3])}")


def summary_table(report: dict) -> str:
    rows = [("fault", "found", "tier", "top cause", "true rank", "first window", "reported", "p99 before",
             "p99 during")]
    for r in report["faults"]:
        ms = lambda v: f"{v:.0f} ms" if v is not None else "-"  # noqa: E731
        rows.append((r["fault"], "yes" if r["found"] else "NO", r["tier"] or "-",
                     (r["top_cause"] or "-") + ("" if r["right"] else " (wrong)" if r["found"] else ""),
                     str(r["true_rank"] or "-"),
                     f"{r['detection_s']:+.0f} s" if r["detection_s"] is not None else "-",
                     f"{r['reported_s']:.0f} s" if r["reported_s"] is not None else "-",
                     ms(r["p99_before_ms"]), ms(r["p99_during_ms"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    share = report["collector_cpu_share"]
    if share:
        lines.append(f"probes' CPU share (sloscope collect CPU time / wall time): "
                     f"{share.get('after_start', share.get('whole_run', 0)):.1%} after start-up, "
                     f"{share.get('whole_run', 0):.1%} including the eBPF compile")
    return "\n".join(lines)
