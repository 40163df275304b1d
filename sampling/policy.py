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
import threading
import time
from collections import Counter
from typing import Callable

from sloscope import json_answers
from sloscope.catalog import TIER_ATTRIBUTES

from sloscope.enrich.tiers import TierResolver

from sloscope.sampling.budget import Budget, cap_keys
from sloscope.sampling.config import SamplingConfig, validate
from sloscope.sampling.head_sampler import encode_th, probability_of, threshold_for
from sloscope.sampling.hot import HotSet, node_reasons, rfc3339, tier_reasons
from sloscope.sampling.observations import Observations, observe

log = logging.getLogger("sloscope.sampling")

SCHEMA = "sloscope.sampling/v1"


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
                    self._body = json_answers.dumps(doc, separators=(",", ":")).encode()
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

