"""From the trace graph's culprits to causes: each culprit's physical causes on its own node, where its node's
signals show one; `network_latency` for a culprit whose calls slowed on the wire; `application`, with the culprit
named, where its own time or failures grew and no physical signal explains it (never a physical cause on no
evidence). The order is the culprits': the first culprit's best cause leads (docs/analysis.md)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

from sloscope import taxonomy
from sloscope.times import parse_rfc3339

from sloscope.analytics.attribution import CLEAR_CAUSE_FLOOR, POD_ATTRIBUTE, THRESHOLD
from sloscope.analytics.graph import CUT, ERRORS, NETWORK, SELF

# What the graph's evidence is called where a cause lists its evidence, beside the catalog's signals.
GRAPH_SIGNALS = {SELF: "trace.own_time", NETWORK: "trace.network_gap", ERRORS: "trace.failures_began",
                 CUT: "trace.calls_made"}
# What changed, in the words of an `application` verdict's remediation.
GROWN = {SELF: "own time grew", ERRORS: "failures grew",
         CUT: "callers' requests now end at it, without the calls they made"}
GRAPH_SOURCE = "traces"
NETWORK_LAYER = "network"
ONSET_MARGIN = timedelta(seconds=20)  # two SLI steps of the default spec: closer onsets are the signals' sampling


def culprit_causes(culprits: list[dict], node_causes: Callable[[str, str | None], list[dict]], top: int
                   ) -> list[dict]:
    """Each culprit's causes in culprit order, at most `top` per culprit; `node_causes(node, pod)` gives a node's
    ranked physical causes, the pod's own series among its evidence (those reaching CLEAR_CAUSE_FLOOR, best first;
    none where its signals show none)."""
    out, seen = [], set()
    for culprit in culprits:
        physical = node_causes(culprit["node"], culprit["pod"])
        if culprit["kind"] == NETWORK:  # the wire's causes, or the pod's own (a starved pod answers late)
            physical = [c for c in physical if c["layer"] == NETWORK_LAYER or _names_pod(c, culprit["pod"])]
        causes = _first_moved_first(physical) or [_graph_cause(culprit)]
        for cause in causes[:top]:
            key = (culprit["service"], culprit["node"], cause["cause"])
            if key not in seen:
                seen.add(key)
                out.append({"service": culprit["service"], "pod": culprit["pod"], "node": culprit["node"], **cause,
                            "culprit": culprit["kind"]})
    return out


def _first_moved_first(causes: list[dict]) -> list[dict]:
    """A culprit's physical causes by score, except that the one whose evidence moved first leads where it moved
    more than ONSET_MARGIN before the best-scored one: a cause precedes its effects, and a signal that moved
    clearly after another did is more likely its effect, however strongly it moved. Onsets closer than that are
    within the signals' own sampling, and the scores decide."""
    onsets = [(_onset(c), n) for n, c in enumerate(causes) if _onset(c) is not None]
    if not onsets or _onset(causes[0]) is None:
        return causes
    earliest, n = min(onsets)
    if earliest < _onset(causes[0]) - ONSET_MARGIN:
        return [causes[n]] + causes[:n] + causes[n + 1:]
    return causes


def _onset(cause: dict) -> datetime | None:
    onset = cause["evidence"][0]["onset"]
    return None if onset is None else parse_rfc3339(onset)


def _names_pod(cause: dict, pod: str | None) -> bool:
    return pod is not None and any(ev["attributes"].get(POD_ATTRIBUTE) == pod for ev in cause["evidence"])


def _graph_cause(culprit: dict) -> dict:
    """network_latency or application, from the trace graph's evidence alone."""
    z = culprit["z"]
    score = round(culprit["share"] * z / (z + THRESHOLD), 3)
    evidence = {"signal": GRAPH_SIGNALS[culprit["kind"]],
                "attributes": {"service": culprit["service"], "pod": culprit["pod"]}, "source": GRAPH_SOURCE,
                "measure": GRAPH_SIGNALS[culprit["kind"]], "rank": 1, "baseline": culprit["baseline"],
                "observed": culprit["observed"], "onset": None, "z": z, "fleet_share": 0.0}
    where = culprit["pod"] or culprit["service"]
    if culprit["kind"] == NETWORK:
        cause = taxonomy.BY_ID["network_latency"]
        return {"cause": cause.id, "layer": cause.layer, "score": max(score, CLEAR_CAUSE_FLOOR),
                "evidence": [evidence], "remediation": cause.remediation.format(node=culprit["node"])}
    return {"cause": taxonomy.APPLICATION, "layer": "application", "score": max(score, CLEAR_CAUSE_FLOOR),
            "evidence": [evidence],
            "remediation": f"look at {culprit['service']}'s own code, configuration or recent rollout ({where}): its "
                           f"{GROWN[culprit['kind']]} while no physical signal on {culprit['node']} moved"}
