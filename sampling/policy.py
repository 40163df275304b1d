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

`SamplingPolicy` is the pure core (observations and a clock in, a policy document out), on hot.py (hot tiers and
nodes, their hysteresis) and budget.py (the budget's fair shares, bias feedback and damping); `observe`
(observations.py) reads the observations from a store; `SamplingService` serves the document at GET /sampling of
`sloscope serve`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from sloscope import yaml_config
from sloscope.catalog import TIER_ATTRIBUTES
from sloscope.durations import parse_duration
from sloscope.errors import ConfigError, read_config_text
from sloscope.yaml_config import key_at, refuse_unknown_keys

from sloscope.enrich.tiers import TierResolver

from sloscope.sampling.budget import Budget, cap_keys
from sloscope.sampling.head_sampler import encode_th, probability_of, threshold_for
from sloscope.sampling.hot import HotSet, node_reasons, rfc3339, tier_reasons
from sloscope.sampling.observations import Observations, observe

log = logging.getLogger("sloscope.sampling")

SCHEMA = "sloscope.sampling/v1"


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


_NUMBER_KEYS = tuple(f.name for f in fields(SamplingConfig) if f.name not in _DURATION_KEYS.values())
CONFIG_KEYS = tuple(sorted((*_NUMBER_KEYS, *_DURATION_KEYS)))


def parse_config(text: str, source: str = "<string>") -> SamplingConfig:
    """The sampling config YAML: budget_spans_per_s, min_probability, error_ratio, min_requests, tolerance,
    max_increase, max_routes, max_services, and durations (10s, 2m) dwell, interval, window, sli_window,
    incident_lookback, incident_open. ConfigError names the file, the line and the key of what is wrong."""
    doc = yaml_config.parse(text, source)
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping")
    refuse_unknown_keys(source, doc, CONFIG_KEYS)
    values = {}
    for key, value in doc.items():
        if key in _DURATION_KEYS:
            values[_DURATION_KEYS[key]] = parse_duration(value, key_at(source, doc, key))
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{key_at(source, doc, key)}: expected a number; got {value!r}")
            values[key] = value
    return validate(SamplingConfig(**values), source, doc)


def validate(config: SamplingConfig, source: str = "<config>", doc=None) -> SamplingConfig:
    """`config`, or ConfigError naming the value out of range, with its line when `doc` is the YAML it came from."""
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
            raise ConfigError(f"{key_at(source, doc, key)}: expected {expected}; got {getattr(config, key)!r}")
    return config


def load_config(path: str | Path | None) -> SamplingConfig:
    if path is None:
        return SamplingConfig()
    return parse_config(read_config_text(path, "sampling config"), str(path))


# --- the core ------------------------------------------------------------------------------------------------

class SamplingPolicy:
    """The pure policy: `evaluate(observations)` -> the GET /sampling document (a dict). Keeps the state the
    hysteresis and the budget's feedback need between evaluations; one instance per evaluation loop."""

    def __init__(self, spec, config: SamplingConfig | None = None):
        self.spec = spec
        self.config = validate(config or SamplingConfig())
        self.resolver = TierResolver.from_spec(spec)
        self._hot_tiers = HotSet(self.config.dwell_s)
        self._hot_nodes = HotSet(self.config.dwell_s)
        self.budget = Budget(self.config)
        self.counts: Counter = Counter()

    def evaluate(self, obs: Observations) -> dict:
        c, spec = self.config, self.spec
        overrides = {t: float(r) for t, r in obs.overrides.items() if t in spec.tiers}
        self.counts["overrides_unknown_tier"] += len(obs.overrides) - len(overrides)
        self._hot_tiers.update(tier_reasons(spec, obs, overrides, c.min_requests, c.error_ratio), obs.now)
        self._hot_nodes.update(node_reasons(obs, c.min_requests, c.error_ratio), obs.now)
        rates = self._rates(obs)
        cold = {k: r for k, r in rates.items() if k[0] not in self._hot_tiers}
        self.budget.correct(obs, spec, self._hot_tiers)
        floors = {k: max(c.min_probability, overrides.get(k[0], 0.0)) for k in cold}
        probability = self.budget.allocate(cold, floors)
        probability.update({key: 1.0 for key in rates if key not in probability})  # hot, or no traffic
        self.budget.remember({k: p for k, p in probability.items() if k[0] not in self._hot_tiers})
        return self._document(obs, rates, probability)

    def _rates(self, obs: Observations) -> dict[tuple[str, str, str], float]:
        """Request spans per second per key, tiers resolved against the spec, keys capped in number."""
        rates: dict[tuple[str, str, str], float] = {}
        for (tier, service, route), count in obs.traffic.items():
            key = (self.resolver.resolve(tier), str(service), str(route or ""))
            rates[key] = rates.get(key, 0.0) + count / obs.window_s
        self.counts.update(self.resolver.counts)
        self.resolver.counts.clear()
        return cap_keys(rates, self.config.max_routes, self.config.max_services)

    def _document(self, obs: Observations, rates: dict, probability: dict) -> dict:
        c, spec, now = self.config, self.spec, obs.now
        tiers = {}
        budgeted = hot_rate = 0.0
        for name, objective in spec.tiers.items():
            hot = name in self._hot_tiers
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
            doc = {"hot": hot, **_entry(tier_p, tier_rate),
                   "latency_threshold_ms": objective.threshold_ms, "percentile": objective.percentile}
            if hot:
                doc["hot_state"] = self._hot_tiers.state(name, now)
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
            "budget_correction": round(self.budget.correction, 4),
            "observed_spans_per_s": round(observed, 3),
            "expected_spans_per_s": round(budgeted, 3),  # kept outside hot tiers (the budgeted part)
            "hot_spans_per_s": round(hot_rate, 3),  # kept in hot tiers, outside the budget
            "min_probability": c.min_probability,
            "dwell_s": c.dwell_s,
            "default_tier": spec.default_tier,
            "tier_attributes": list(TIER_ATTRIBUTES),
            "tiers": tiers,
            "hot_nodes": self._hot_nodes.states(now),
        }


def _entry(probability: float, rate: float) -> dict:
    threshold = threshold_for(probability)
    return {"probability": round(probability_of(threshold), 9), "th": encode_th(threshold),
            "observed_spans_per_s": round(rate, 3)}


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

