"""The latency bucket bounds of the request families on /metrics: the defaults plus every tier's latency
threshold, so that each tier's "slower than the objective" count is one exact bucket, not an interpolation. The
store keeps what retention deletes counted by the same bounds (analytics/retention.py)."""

from __future__ import annotations

DEFAULT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def le_seconds(threshold_ms: float) -> float:
    return threshold_ms / 1000.0


def buckets_for(spec) -> tuple[float, ...]:
    """Latency bucket bounds (seconds) for an SLO spec."""
    bounds = set(DEFAULT_BUCKETS_S)
    bounds.update(le_seconds(t.threshold_ms) for t in spec.tiers.values())
    return tuple(sorted(bounds))


def bounds_ms(spec) -> list[float]:
    """The bounds in milliseconds, as the store's queries compare them with durations."""
    return [round(b * 1000, 6) for b in buckets_for(spec)]
