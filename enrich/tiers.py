"""Tier resolution for request spans (docs/tiers.md).

The `x-slo-tier` header is set by clients, so it is untrusted: only tiers declared in the SLO spec are kept.
Anything else (unknown, empty, oversized, wrong type) becomes the spec's default tier and is counted, so no
client can create new series or buy itself a hotter tier's treatment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sloscope.records import SpanTable

MAX_HEADER_LENGTH = 64


@dataclass
class TierResolver:
    allowed: frozenset[str]
    default_tier: str
    counts: Counter = field(default_factory=Counter)

    @classmethod
    def from_spec(cls, spec) -> "TierResolver":
        return cls(frozenset(spec.tiers), spec.default_tier)

    def resolve(self, raw, times: int = 1) -> str:
        """Map the raw attribute value (string, list of strings, or None) to an allowed tier; `times` spans
        carried it (for the counters)."""
        if raw is None:
            self.counts["tier_missing"] += times
            return self.default_tier
        if isinstance(raw, (list, tuple)):
            # A repeated header arrives as several values; only a single unambiguous one is honoured.
            raw = raw[0] if len(raw) == 1 else None
        if not isinstance(raw, str) or not raw or len(raw) > MAX_HEADER_LENGTH:
            self.counts["tier_invalid"] += times
            return self.default_tier
        tier = raw.strip()
        if tier in self.allowed:
            return tier
        self.counts["tier_invalid"] += times
        return self.default_tier


def resolve_tiers(spans, resolver: TierResolver) -> None:
    """Fill the spans' tier from their untrusted tier_header, which is dropped once resolved."""
    if isinstance(spans, SpanTable):
        _resolve_table(spans, resolver)
        return
    spans.tier = [resolver.resolve(raw) for raw in spans.tier_header]
    spans.tier_header = [None] * len(spans.tier)


def _resolve_table(spans: SpanTable, resolver: TierResolver) -> None:
    """Each distinct header once."""
    spans.tiers = [resolver.resolve(raw, times=n) if n else resolver.default_tier
                   for raw, n in zip(spans.tier_headers, spans.tier_counts)]
