"""The bucket bounds of the request families on /metrics: the defaults plus every tier's threshold for what the
family times (the request's duration, or one of its token timings), so that each tier's "slower than the
objective" count is one exact bucket, not an interpolation. The store keeps what retention deletes counted by the
same bounds (analytics/retention.py)."""

from __future__ import annotations

DEFAULT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def le_seconds(threshold_ms: float) -> float:
    return threshold_ms / 1000.0


def _thresholds_ms(spec, sli: str | None) -> list[float]:
    if sli is None:
        return [t.threshold_ms for t in spec.tiers.values()]
    return [token.threshold_ms for t in spec.tiers.values() if (token := t.token(sli)) is not None]


def buckets_for(spec, sli: str | None = None) -> tuple[float, ...]:
    """Bucket bounds (seconds) for an SLO spec: of the request durations, or with `sli` (one of
    slo_spec.TOKEN_SLIS) of that token timing."""
    bounds = set(DEFAULT_BUCKETS_S)
    bounds.update(le_seconds(ms) for ms in _thresholds_ms(spec, sli))
    return tuple(sorted(bounds))


def bounds_ms(spec, sli: str | None = None) -> list[float]:
    """The bounds in milliseconds, as the store's queries compare them with durations."""
    return [round(b * 1000, 6) for b in buckets_for(spec, sli)]
