"""The budget of kept request spans outside hot tiers: rates per (tier, service, route) capped in number, split
max-min fairly, corrected for the bias of rates that lag behind bursts, and damped between evaluations."""

from __future__ import annotations

from typing import Mapping

from sloscope.sampling.observations import Observations

Key = tuple[str, str, str]  # (tier, service, route)


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


def cap_keys(rates: dict[Key, float], max_routes: int, max_services: int) -> dict[Key, float]:
    """At most max_routes routes per (tier, service) and max_services services per tier; the quieter rest
    merges into the service's ("" route) or the tier's ("" service) entry."""
    by_service: dict[tuple[str, str], list] = {}
    for (tier, service, route), rate in rates.items():
        by_service.setdefault((tier, service), []).append((rate, route))
    capped: dict[Key, float] = {}
    for (tier, service), routes in by_service.items():
        routes.sort(key=lambda x: (-x[0], x[1]))
        named = set([route for _, route in routes if route][:max_routes])
        for rate, route in routes:
            key = (tier, service, route if route in named else "")
            capped[key] = capped.get(key, 0.0) + rate
    totals: dict[str, dict[str, float]] = {}
    for (tier, service, _), rate in capped.items():
        totals.setdefault(tier, {}).setdefault(service, 0.0)
        totals[tier][service] += rate
    keep = {t: {s for s, _ in sorted(svcs.items(), key=lambda x: (-x[1], x[0]))[:max_services] if s}
            for t, svcs in totals.items()}
    out: dict[Key, float] = {}
    for (tier, service, route), rate in capped.items():
        key = (tier, service, route) if service in keep[tier] else (tier, "", "")
        out[key] = out.get(key, 0.0) + rate
    return out


class Budget:
    """The budgeted keys' probabilities from one evaluation to the next (the bias estimate and the damping need
    the previous ones)."""

    def __init__(self, config):
        self.config = config
        self.correction = 1.0
        self._bias = 1.0
        self._probability: dict[Key, float] = {}
        self._binding = False  # the previous evaluation's budget was binding (some probability below 1)

    def correct(self, obs: Observations, spec, hot_tiers) -> None:
        """Bias feedback: the kept rate the last interval's probabilities gave on its actual traffic, against the
        budget they were computed for, averaged (EWMA, weight correction_gain); the budget is divided by it."""
        c = self.config
        if not (c.correction_gain and obs.recent_s > 0 and self._binding and self._probability):
            return
        kept = 0.0
        for (tier, service, route), count in obs.recent.items():
            tier = tier if tier in spec.tiers else spec.default_tier
            if tier in hot_tiers:
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

    def allocate(self, cold: dict[Key, float], floors: dict[Key, float]) -> dict[Key, float]:
        """The damped fair share of each key with traffic, of the corrected budget."""
        target = fair_shares(cold, self.config.budget_spans_per_s * self.correction, floors)
        self._binding = any(p < 1.0 for p in target.values())
        return {key: self._damped(key, p) for key, p in target.items()}

    def remember(self, probability: dict[Key, float]) -> None:
        """The probabilities the next evaluation damps from and measures the bias of."""
        self._probability = probability

    def _damped(self, key: Key, target: float) -> float:
        c = self.config
        previous = self._probability.get(key)
        if previous is None:
            return target
        if abs(target - previous) <= c.tolerance * previous:
            return previous
        if target > previous:
            return min(target, previous * c.max_increase)
        return target
