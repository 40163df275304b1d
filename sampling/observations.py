"""What one evaluation of the sampling policy sees: request spans per (tier, service, route), the SLIs of tiers
and nodes, open incidents and raise_sampling overrides; and reading them from a store."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Mapping, Sequence

from sloscope.slo_spec import TOKEN_SLIS

from sloscope.analytics.slo import find_incidents

from sloscope.alerts.remediation import active_sampling_overrides

if TYPE_CHECKING:
    from sloscope.sampling.config import SamplingConfig


@dataclass(frozen=True)
class Sli:
    requests: int
    failures: int
    latency_ms: float | None = None  # the tier's percentile over the SLI window (tiers only)
    token_ms: Mapping[str, float | None] = field(default_factory=dict)  # each token objective's percentile (tiers)


@dataclass(frozen=True)
class Observations:
    """What one evaluation sees. `traffic`: request spans per (tier, service, route) over `window_s` (route ""
    when unknown); `tiers`, `nodes`: the last `sli_window_s`; `incidents`: open ones as (tier, service, node);
    `overrides`: tier -> ratio of active raise_sampling overrides; `recent`: request spans per key over the
    last `recent_s` (one interval: what the previous evaluation's probabilities were applied to)."""

    now: float  # seconds since the epoch
    window_s: float
    traffic: Mapping[tuple[str, str, str], float]
    tiers: Mapping[str, Sli] = field(default_factory=dict)
    nodes: Mapping[str, Sli] = field(default_factory=dict)
    incidents: Sequence[tuple[str, str, str]] = ()
    overrides: Mapping[str, float] = field(default_factory=dict)
    recent: Mapping[tuple[str, str, str], float] = field(default_factory=dict)  # spans in the last recent_s
    recent_s: float = 0.0


def _naive_utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def observe(reader, spec, config: SamplingConfig, now: float) -> Observations:
    """Observations at `now` (seconds since the epoch) from a store or its reader (analytics/store_api.py)."""
    until = _naive_utc(now)
    tiers = {"allowed_tiers": sorted(spec.tiers), "default_tier": spec.default_tier}
    recent_s = config.interval_for(spec)
    traffic, recent = {}, {}
    for tier, service, route, count, last in reader.rows(reader.sql("requests_by_route"), {
            **tiers, "since": until - timedelta(seconds=config.window_s),
            "recent": until - timedelta(seconds=recent_s), "until": until}):
        traffic[(tier, service, route)] = count
        if last:
            recent[(tier, service, route)] = last
    sli = {"since": until - timedelta(seconds=config.sli_window_s), "until": until}
    tier_sli = _tier_slis(reader, spec, {**tiers, **sli})
    node_sli = {node: Sli(n, failed) for node, n, failed in reader.rows(
        reader.sql("node_health"), {**reader.tier_params(spec), **sli})}
    open_after = until - timedelta(seconds=config.open_for(spec))
    incidents = [(i.tier, i.service, i.node) for i in find_incidents(
        reader, spec, until - timedelta(seconds=config.incident_lookback_s), until) if i.end >= open_after]
    overrides = active_sampling_overrides(reader, until)
    return Observations(now, config.window_s, traffic, tier_sli, node_sli, incidents, overrides, recent,
                        recent_s if recent_s <= config.window_s else 0.0)


def _tier_slis(reader, spec, params: dict) -> dict[str, Sli]:
    """Per tier that served anything over the window: its latency and each token time at the percentile of its
    objective, from one query per percentile in use."""
    wanted = {name: {"latency": o.percentile, **{t.sli: t.percentile for t in o.tokens}}
              for name, o in spec.tiers.items()}
    counts, measured = {}, {}
    for percentile in sorted({p for kinds in wanted.values() for p in kinds.values()}):
        for tier, n, failed, *values in reader.rows(reader.sql("tier_health"),
                                                    {**params, "quantile": percentile / 100.0}):
            counts[tier] = (n, failed)
            for kind, value in zip(("latency", *TOKEN_SLIS), values):
                if wanted[tier].get(kind) == percentile:
                    measured.setdefault(tier, {})[kind] = value
    return {tier: Sli(*counts[tier], measured[tier].pop("latency", None), measured[tier]) for tier in counts}
