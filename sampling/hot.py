"""Hot tiers and nodes of the sampling policy: what makes one hot (its SLI breaks, an open incident, an override
at ratio 1), and the hysteresis that keeps it hot `dwell_s` after it was last seen so."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sloscope.catalog import EVERY_NODE

from sloscope.sampling.observations import Observations, Sli


def rfc3339(seconds: float) -> str:
    """The policy document's times, from its clock of epoch seconds, always to the centisecond as GET /sampling
    has written them: sloscope.times.rfc3339 writes whole seconds, or microseconds without trailing zeros."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def breaks(sli: Sli | None, objective, min_requests: int, error_ratio: float) -> list[str]:
    """Why an SLI breaks ("latency", "errors", or a token objective: "ttft", "tpot", "queue"), against a tier's
    `objective` (None: errors only); nothing on fewer than `min_requests` requests."""
    if sli is None or sli.requests < min_requests:
        return []
    reasons = []
    if objective is not None and sli.latency_ms is not None and sli.latency_ms > objective.threshold_ms:
        reasons.append("latency")
    if objective is not None:
        reasons += [t.sli for t in objective.tokens
                    if sli.token_ms.get(t.sli) is not None and sli.token_ms[t.sli] > t.threshold_ms]
    if sli.failures > error_ratio * sli.requests:
        reasons.append("errors")
    return reasons


def tier_reasons(spec, obs: Observations, overrides: dict[str, float], min_requests: int,
                 error_ratio: float) -> dict[str, list[str]]:
    """Per tier of the spec, why it is hot in this evaluation (empty: it is not)."""
    out: dict[str, list[str]] = {}
    for name, objective in spec.tiers.items():
        reasons = breaks(obs.tiers.get(name), objective, min_requests, error_ratio)
        if any(tier == name for tier, _, _ in obs.incidents):
            reasons.append("incident")
        if overrides.get(name, 0.0) >= 1.0:
            reasons.append("override")
        out[name] = reasons
    return out


def node_reasons(obs: Observations, min_requests: int, error_ratio: float) -> dict[str, list[str]]:
    """Per node observed or named by an open incident, why it is hot in this evaluation. An incident over every
    node of its service heats its tier, no node."""
    out = {n: breaks(sli, None, min_requests, error_ratio) for n, sli in obs.nodes.items()}
    for _, _, node in obs.incidents:
        if node != EVERY_NODE:
            out.setdefault(node, []).append("incident")
    return out


@dataclass
class _Hot:
    since: float
    last: float
    reasons: tuple[str, ...]


class HotSet:
    """Tiers or nodes that are hot: from the first evaluation that sees them so until `dwell_s` after the last."""

    def __init__(self, dwell_s: float):
        self.dwell_s = dwell_s
        self._hot: dict[str, _Hot] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._hot

    def update(self, seen: dict[str, list[str]], now: float) -> None:
        for name, reasons in seen.items():
            if reasons:
                hot = self._hot.get(name)
                if hot is None:
                    self._hot[name] = _Hot(now, now, tuple(reasons))
                else:
                    hot.last, hot.reasons = now, tuple(reasons)
        for name in list(self._hot):
            if not seen.get(name) and now - self._hot[name].last >= self.dwell_s:
                del self._hot[name]

    def state(self, name: str, now: float) -> dict:
        """The policy document's account of a hot name: why (or "dwell"), since when, held until when."""
        hot = self._hot[name]
        return {"reasons": list(hot.reasons) if hot.last == now else ["dwell"], "since": rfc3339(hot.since),
                "last_seen": rfc3339(hot.last), "hold_until": rfc3339(hot.last + self.dwell_s)}

    def states(self, now: float) -> dict[str, dict]:
        return {name: self.state(name, now) for name in sorted(self._hot)}
