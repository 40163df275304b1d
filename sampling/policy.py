"""Adaptive trace sampling: per (tier, service, route) a sampling probability from the SLI state.

Policy, evaluated every `interval_s` (default: the spec's resolution):

- A tier is **hot** while it breaks its SLO over the last `sli_window_s` (60 s): its latency percentile above the
  objective or its error ratio above `error_ratio` (5 %), with at least `min_requests` requests; or while an
  incident of the tier is open (analytics.slo.find_incidents, last violating step within `incident_open_s`); or
  while a raise_sampling override of the tier is active (ratio 1). A node is hot while an open incident names it or
  it fails more than `error_ratio` of its requests. Hot tiers and nodes are sampled at 100 %, from the first
  evaluation that sees them; they go back to the budget only `dwell_s` after the last evaluation that saw them
  hot (hysteresis: a recovering tier does not flap).
- Every other (tier, service, route) key shares the budget of kept request spans per second, in the manner of
  Jaeger's adaptive sampling: observed rates over `window_s`, the budget split max-min fairly across keys (a key
  slower than its fair share keeps everything, the rest is divided equally among the busier ones), probability =
  share / rate, bounded below by `min_probability` (and by an override's ratio below 1). Changes within
  `tolerance` are not made, and a probability rises at most `max_increase` times per evaluation.
  Rates from the past minute lag behind bursts (a burst is sampled at the probability of the quiet minute before
  it), which biases the kept rate upwards; a slow feedback removes the bias: each evaluation compares the kept
  rate that the last interval's probabilities gave on its actual traffic with the budget they were computed for,
  averages that ratio (EWMA, weight `correction_gain`), and divides the budget the shares are computed from by
  it (within [1/2, 2] of the budget).
- Hot traffic is outside the budget: an incident's traces are all kept, whatever they cost.
- Only tiers of the SLO spec exist: observations of any other tier value count as the default tier
  (enrich.tiers.TierResolver), and overrides of unknown tiers are ignored.

`SamplingPolicy` is the pure core (observations and a clock in, a policy document out); `observe` reads the
observations from a store; `SamplingService` serves the document at GET /sampling of `sloscope serve`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from enrich.tiers import HEADER_ATTRIBUTE, ISTIO_TAG, TierResolver

from sampling.head_sampler import encode_th, probability_of, threshold_for

log = logging.getLogger("sloscope.sampling")

SCHEMA = "sloscope.sampling/v1"
TIER_ATTRIBUTES = (ISTIO_TAG, HEADER_ATTRIBUTE)  # what the tail config matches on; the head sampler reads both
NODE_ATTRIBUTES = ("k8s.node.name", "host.name")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SamplingConfig:
    budget_spans_per_s: float = 100.0  # kept request spans per second outside hot tiers and nodes
    min_probability: float = 0.001
    dwell_s: float = 120.0  # a hot tier or node stays at 100 % this long after it was last seen hot
    interval_s: float | None = None  # evaluation interval; None: the SLO spec's resolution
    window_s: float = 60.0  # observed rates
    sli_window_s: float = 60.0  # hot detection: percentile and error ratio over this window
    error_ratio: float = 0.05
    min_requests: int = 10  # in sli_window_s, for a percentile or an error ratio to count
    tolerance: float = 0.05  # relative change of a probability below which it is left alone
    max_increase: float = 2.0  # a probability at most doubles per evaluation
    correction_gain: float = 0.05  # weight of the last interval in the kept-rate bias estimate (0: off)
    incident_lookback_s: float = 600.0
    incident_open_s: float | None = None  # None: two evaluation intervals
    max_routes: int = 50  # per (tier, service); busier routes first, the rest share the service's entry
    max_services: int = 200  # per tier, in the policy document and the tail config

    def interval_for(self, spec) -> float:
        return self.interval_s if self.interval_s is not None else spec.resolution_s

    def open_for(self, spec) -> float:
        return self.incident_open_s if self.incident_open_s is not None else 2 * self.interval_for(spec)


_DURATION_KEYS = {"dwell": "dwell_s", "interval": "interval_s", "window": "window_s", "sli_window": "sli_window_s",
                  "incident_lookback": "incident_lookback_s", "incident_open": "incident_open_s"}


def parse_config(text: str, source: str = "<string>") -> SamplingConfig:
    """The sampling config YAML: budget_spans_per_s, min_probability, error_ratio, min_requests, tolerance,
    max_increase, max_routes, max_services, and durations (10s, 2m) dwell, interval, window, sli_window,
    incident_lookback, incident_open."""
    import yaml

    from sloscope.slo_spec import SpecError, parse_duration

    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping")
    numbers = {f.name for f in fields(SamplingConfig)} - set(_DURATION_KEYS.values())
    values = {}
    for key, value in doc.items():
        if key in _DURATION_KEYS:
            try:
                values[_DURATION_KEYS[key]] = parse_duration(value, f"{source}: {key}")
            except SpecError as exc:
                raise ConfigError(str(exc)) from None
        elif key in numbers:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{source}: {key}: expected a number; got {value!r}")
            values[key] = value
        else:
            known = sorted(numbers | set(_DURATION_KEYS))
            raise ConfigError(f"{source}: unknown key {key!r} (expected one of {', '.join(known)})")
    return validate(SamplingConfig(**values), source)


def validate(config: SamplingConfig, source: str = "<config>") -> SamplingConfig:
    checks = [
        ("budget_spans_per_s", config.budget_spans_per_s > 0, "a positive number"),
        ("min_probability", 2 ** -56 <= config.min_probability <= 1, "a number in [2^-56, 1]"),
        ("error_ratio", 0 < config.error_ratio < 1, "a number in (0, 1)"),
        ("min_requests", config.min_requests >= 1, "at least 1"),
        ("tolerance", 0 <= config.tolerance < 1, "a number in [0, 1)"),
        ("max_increase", config.max_increase > 1, "a number above 1"),
        ("correction_gain", 0 <= config.correction_gain <= 1, "a number in [0, 1]"),
        ("max_routes", config.max_routes >= 0, "0 or more"),
        ("max_services", config.max_services >= 0, "0 or more"),
    ]
    for key, ok, expected in checks:
        if not ok:
            raise ConfigError(f"{source}: {key}: expected {expected}; got {getattr(config, key)!r}")
    return config


def load_config(path: str | Path | None) -> SamplingConfig:
    if path is None:
        return SamplingConfig()
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the sampling config: {exc.strerror}") from None
    return parse_config(text, str(path))


# --- observations ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sli:
    requests: int
    failures: int
    latency_ms: float | None = None  # the tier's percentile over the SLI window (tiers only)


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


# --- the core ------------------------------------------------------------------------------------------------

@dataclass
class _Hot:
    since: float
    last: float
    reasons: tuple[str, ...]


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def fair_shares(rates: Mapping, budget: float, floors: Mapping | None = None) -> dict:
    """Probabilities p[k] for keys with rates r[k] > 0 such that sum(p * r) == budget when the traffic exceeds it
    (else every p is 1), max-min fair in kept rate; p[k] >= floors[k], where a floor costs its keys' share."""
    floors = floors or {}
    probability, fixed_cost, free = {}, 0.0, {k: r for k, r in rates.items() if r > 0}
    while True:
        remaining, level = max(budget - fixed_cost, 0.0), {}
        order = sorted(free, key=free.get)
        for i, key in enumerate(order):
            share = remaining / (len(order) - i)
            rate = free[key]
            level[key] = 1.0 if rate <= share else share / rate
            remaining -= min(rate, share)
        below = [k for k, p in level.items() if p < floors.get(k, 0.0)]
        if not below:
            probability.update(level)
            return probability
        for key in below:
            probability[key] = floors[key]
            fixed_cost += floors[key] * free.pop(key)


class SamplingPolicy:
    """The pure policy: `evaluate(observations)` -> the GET /sampling document (a dict). Keeps the state the
    hysteresis needs between evaluations; one instance per evaluation loop."""

    def __init__(self, spec, config: SamplingConfig | None = None):
        self.spec = spec
        self.config = validate(config or SamplingConfig())
        self.resolver = TierResolver.from_spec(spec)
        self._hot_tiers: dict[str, _Hot] = {}
        self._hot_nodes: dict[str, _Hot] = {}
        self._probability: dict[tuple[str, str, str], float] = {}
        self._binding = False  # the previous evaluation's budget was binding (some probability below 1)
        self.correction = 1.0
        self._bias = 1.0
        self.counts: Counter = Counter()

    # --- hot tiers and nodes -------------------------------------------------------------------------------

    def _breaks(self, sli: Sli | None, threshold_ms: float | None) -> list[str]:
        c = self.config
        if sli is None or sli.requests < c.min_requests:
            return []
        reasons = []
        if threshold_ms is not None and sli.latency_ms is not None and sli.latency_ms > threshold_ms:
            reasons.append("latency")
        if sli.failures > c.error_ratio * sli.requests:
            reasons.append("errors")
        return reasons

    def _update_hot(self, state: dict[str, _Hot], seen: dict[str, list[str]], now: float) -> None:
        for name, reasons in seen.items():
            if reasons:
                hot = state.get(name)
                if hot is None:
                    state[name] = _Hot(now, now, tuple(reasons))
                else:
                    hot.last, hot.reasons = now, tuple(reasons)
        for name in list(state):
            if not seen.get(name) and now - state[name].last >= self.config.dwell_s:
                del state[name]

    def _hot_doc(self, hot: _Hot, now: float) -> dict:
        return {"reasons": list(hot.reasons) if hot.last == now else ["dwell"], "since": rfc3339(hot.since),
                "last_seen": rfc3339(hot.last), "hold_until": rfc3339(hot.last + self.config.dwell_s)}

    # --- evaluation --------------------------------------------------------------------------------------------

    def evaluate(self, obs: Observations) -> dict:
        c, spec, now = self.config, self.spec, obs.now
        overrides = {t: float(r) for t, r in obs.overrides.items() if t in spec.tiers}
        self.counts["overrides_unknown_tier"] += len(obs.overrides) - len(overrides)
        tier_reasons: dict[str, list[str]] = {}
        for name, objective in spec.tiers.items():
            reasons = self._breaks(obs.tiers.get(name), objective.threshold_ms)
            if any(tier == name for tier, _, _ in obs.incidents):
                reasons.append("incident")
            if overrides.get(name, 0.0) >= 1.0:
                reasons.append("override")
            tier_reasons[name] = reasons
        node_reasons: dict[str, list[str]] = {n: self._breaks(sli, None) for n, sli in obs.nodes.items()}
        for _, _, node in obs.incidents:
            node_reasons.setdefault(node, []).append("incident")
        self._update_hot(self._hot_tiers, tier_reasons, now)
        self._update_hot(self._hot_nodes, node_reasons, now)

        # traffic per key, tiers resolved against the spec
        rates: dict[tuple[str, str, str], float] = {}
        for (tier, service, route), count in obs.traffic.items():
            key = (self.resolver.resolve(tier), str(service), str(route or ""))
            rates[key] = rates.get(key, 0.0) + count / obs.window_s
        self.counts.update(self.resolver.counts)
        self.resolver.counts.clear()
        rates = self._cap(rates)

        cold = {k: r for k, r in rates.items() if k[0] not in self._hot_tiers}
        self._correct(obs)
        floors = {k: max(c.min_probability, overrides.get(k[0], 0.0)) for k in cold}
        target = fair_shares(cold, c.budget_spans_per_s * self.correction, floors)
        self._binding = any(p < 1.0 for p in target.values())
        probability = {}
        for key, p in target.items():
            probability[key] = self._damped(key, p)
        for key in rates:
            if key not in probability:
                probability[key] = 1.0
        self._probability = {k: p for k, p in probability.items() if k[0] not in self._hot_tiers}
        return self._document(obs, rates, probability)

    def _correct(self, obs: Observations) -> None:
        """Bias feedback: the kept rate the last interval's probabilities gave on its actual traffic, against the
        budget they were computed for, averaged (EWMA, weight correction_gain); the budget is divided by it."""
        c = self.config
        if not (c.correction_gain and obs.recent_s > 0 and self._binding and self._probability):
            return
        kept = 0.0
        for (tier, service, route), count in obs.recent.items():
            tier = tier if tier in self.spec.tiers else self.spec.default_tier
            if tier in self._hot_tiers:
                continue
            p = self._probability.get((tier, str(service), str(route or "")),
                                      self._probability.get((tier, str(service), "")))
            if p is not None:
                kept += p * count
        if kept <= 0:
            return
        ratio = kept / obs.recent_s / (c.budget_spans_per_s * self.correction)
        self._bias = (1 - c.correction_gain) * self._bias + c.correction_gain * ratio
        self.correction = min(max(1.0 / self._bias, 0.5), 2.0)

    def _cap(self, rates: dict) -> dict:
        """At most max_routes routes per (tier, service) and max_services services per tier; the quieter rest
        merges into the service's ("" route) or the tier's ("" service) entry."""
        c = self.config
        by_service: dict[tuple[str, str], list] = {}
        for (tier, service, route), rate in rates.items():
            by_service.setdefault((tier, service), []).append((rate, route))
        capped: dict[tuple[str, str, str], float] = {}
        for (tier, service), routes in by_service.items():
            routes.sort(key=lambda x: (-x[0], x[1]))
            named = set([route for _, route in routes if route][:c.max_routes])
            for rate, route in routes:
                key = (tier, service, route if route in named else "")
                capped[key] = capped.get(key, 0.0) + rate
        totals: dict[str, dict[str, float]] = {}
        for (tier, service, _), rate in capped.items():
            totals.setdefault(tier, {}).setdefault(service, 0.0)
            totals[tier][service] += rate
        keep = {t: {s for s, _ in sorted(svcs.items(), key=lambda x: (-x[1], x[0]))[:c.max_services] if s}
                for t, svcs in totals.items()}
        out: dict[tuple[str, str, str], float] = {}
        for (tier, service, route), rate in capped.items():
            key = (tier, service, route) if service in keep[tier] else (tier, "", "")
            out[key] = out.get(key, 0.0) + rate
        return out

    def _damped(self, key, target: float) -> float:
        c = self.config
        previous = self._probability.get(key)
        if previous is None:
            return target
        if abs(target - previous) <= c.tolerance * previous:
            return previous
        if target > previous:
            return min(target, previous * c.max_increase)
        return target

    def _document(self, obs: Observations, rates: dict, probability: dict) -> dict:
        c, spec, now = self.config, self.spec, obs.now
        tiers = {}
        budgeted = hot_rate = 0.0
        for name, objective in spec.tiers.items():
            hot = self._hot_tiers.get(name)
            keys = {k: r for k, r in rates.items() if k[0] == name}
            tier_rate = sum(keys.values())
            kept = sum(probability[k] * r for k, r in keys.items())
            if hot:
                hot_rate += tier_rate
            else:
                budgeted += kept
            services: dict[str, dict] = {}
            for (_, service, route), rate in sorted(keys.items()):
                if not service:
                    continue
                s = services.setdefault(service, {"rate": 0.0, "kept": 0.0, "routes": {}})
                s["rate"] += rate
                s["kept"] += probability[(name, service, route)] * rate
                if route:
                    s["routes"][route] = _entry(probability[(name, service, route)], rate)
            if hot:
                tier_p = 1.0
            elif tier_rate > 0:
                tier_p = kept / tier_rate
            else:  # no traffic seen: the least probability of the cold keys, else 1 (the whole budget is free)
                tier_p = min((p for k, p in probability.items() if k[0] not in self._hot_tiers), default=1.0)
            doc = {"hot": hot is not None, **_entry(tier_p, tier_rate),
                   "latency_threshold_ms": objective.threshold_ms, "percentile": objective.percentile}
            if hot:
                doc["hot_state"] = self._hot_doc(hot, now)
            if name in obs.overrides:
                doc["override_ratio"] = float(obs.overrides[name])
            doc["services"] = {
                svc: {**_entry(1.0 if hot else (s["kept"] / s["rate"] if s["rate"] else tier_p), s["rate"]),
                      "routes": s["routes"]}
                for svc, s in services.items()}
            tiers[name] = doc
        observed = sum(rates.values())
        return {
            "schema": SCHEMA,
            "generated_at": rfc3339(now),
            "interval_s": c.interval_for(spec),
            "refresh_s": c.interval_for(spec),
            "budget_spans_per_s": c.budget_spans_per_s,
            "budget_correction": round(self.correction, 4),
            "observed_spans_per_s": round(observed, 3),
            "expected_spans_per_s": round(budgeted, 3),  # kept outside hot tiers (the budgeted part)
            "hot_spans_per_s": round(hot_rate, 3),  # kept in hot tiers, outside the budget
            "min_probability": c.min_probability,
            "dwell_s": c.dwell_s,
            "default_tier": spec.default_tier,
            "tier_attributes": [HEADER_ATTRIBUTE, ISTIO_TAG],
            "tiers": tiers,
            "hot_nodes": {n: self._hot_doc(h, now) for n, h in sorted(self._hot_nodes.items())},
        }


def _entry(probability: float, rate: float) -> dict:
    threshold = threshold_for(probability)
    return {"probability": round(probability_of(threshold), 9), "th": encode_th(threshold),
            "observed_spans_per_s": round(rate, 3)}


# --- reading the store ---------------------------------------------------------------------------------------

def _naive_utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def observe(reader, spec, config: SamplingConfig, now: float) -> Observations:
    """Observations at `now` (seconds since the epoch) from a store or reader (analytics.store.Reader)."""
    from analytics.slo import find_incidents
    from alerts.remediation import active_sampling_overrides

    until = _naive_utc(now)
    tiers = list(spec.tiers)
    resolved = "CASE WHEN list_contains($tiers, tier) THEN tier ELSE $default END"
    recent_s = config.interval_for(spec)
    traffic, recent = {}, {}
    for tier, service, route, count, last in reader.rows(
            f"SELECT {resolved} AS t, service, coalesce(route, '') AS route, count(*), "
            "count(*) FILTER (WHERE start_time >= $recent) FROM requests "
            "WHERE start_time >= $since AND start_time < $until GROUP BY ALL",
            {"tiers": tiers, "default": spec.default_tier, "since": until - timedelta(seconds=config.window_s),
             "recent": until - timedelta(seconds=recent_s), "until": until}):
        traffic[(tier, service, route)] = count
        if last:
            recent[(tier, service, route)] = last
    quantiles = sorted({o.percentile / 100.0 for o in spec.tiers.values()})
    sli_since = until - timedelta(seconds=config.sli_window_s)
    tier_sli = {}
    for tier, n, failed, values in reader.rows(
            f"SELECT {resolved} AS t, count(*), count(*) FILTER (WHERE failed), "
            f"quantile_cont(duration_ms, {quantiles!r}) FROM requests "
            "WHERE start_time >= $since AND start_time < $until GROUP BY ALL",
            {"tiers": tiers, "default": spec.default_tier, "since": sli_since, "until": until}):
        q = spec.tiers[tier].percentile / 100.0
        tier_sli[tier] = Sli(n, failed, values[quantiles.index(q)] if values else None)
    node_sli = {node: Sli(n, failed) for node, n, failed in reader.rows(
        "SELECT node, count(*), count(*) FILTER (WHERE failed) FROM requests "
        "WHERE start_time >= $since AND start_time < $until GROUP BY ALL", {"since": sli_since, "until": until})}
    open_after = until - timedelta(seconds=config.open_for(spec))
    incidents = [(i.tier, i.service, i.node) for i in find_incidents(
        reader, spec, until - timedelta(seconds=config.incident_lookback_s), until) if i.end >= open_after]
    overrides = active_sampling_overrides(reader.con, until)
    return Observations(now, config.window_s, traffic, tier_sli, node_sli, incidents, overrides, recent,
                        recent_s if recent_s <= config.window_s else 0.0)


class SamplingService:
    """GET /sampling of `sloscope serve`: the policy document, recomputed at most once per evaluation interval
    on its own reader cursor; when an evaluation fails, the last good document is served (and the failure
    logged)."""

    content_type = "application/json"

    def __init__(self, reader, spec, config: SamplingConfig | None = None, clock: Callable[[], float] = time.time):
        self.reader, self.spec = reader, spec
        self.policy = SamplingPolicy(spec, config)
        self.config = self.policy.config
        self.clock = clock
        self._lock = threading.Lock()
        self._body: bytes | None = None
        self._at: float | None = None
        self.errors = 0

    def document(self) -> dict:
        return json.loads(self.page()[0])

    def page(self) -> tuple[bytes, str]:
        with self._lock:
            now = self.clock()
            if self._at is None or now - self._at >= self.config.interval_for(self.spec) or now < self._at:
                try:
                    doc = self.policy.evaluate(observe(self.reader, self.spec, self.config, now))
                    self._body = json.dumps(doc, separators=(",", ":")).encode()
                except Exception:
                    self.errors += 1
                    log.exception("sampling policy evaluation failed; serving the last policy")
                    if self._body is None:
                        raise
                self._at = now
            return self._body, self.content_type


def evaluate_once(reader, spec, config: SamplingConfig | None = None, now: float | None = None) -> dict:
    """One evaluation without history (no hysteresis): for the CLI."""
    policy = SamplingPolicy(spec, config)
    return policy.evaluate(observe(reader, spec, policy.config, time.time() if now is None else now))

