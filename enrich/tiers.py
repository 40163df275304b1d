"""Tier resolution for request spans (DESIGN.md, Contract 2).

The `x-slo-tier` header is set by clients, so it is untrusted: only tiers declared in the SLO spec are kept.
Anything else (unknown, empty, oversized, wrong type) becomes the spec's default tier and is counted, so no
client can create new series or buy itself a hotter tier's treatment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

HEADER_ATTRIBUTE = "http.request.header.x-slo-tier"
ISTIO_TAG = "slo.tier"
MAX_HEADER_LENGTH = 64


@dataclass
class TierResolver:
    allowed: frozenset[str]
    default_tier: str
    counts: Counter = field(default_factory=Counter)

    @classmethod
    def from_spec(cls, spec) -> "TierResolver":
        return cls(frozenset(spec.tiers), spec.default_tier)

    def resolve(self, raw) -> str:
        """Map the raw attribute value (string, list of strings, or None) to an allowed tier."""
        if raw is None:
            self.counts["tier_missing"] += 1
            return self.default_tier
        if isinstance(raw, (list, tuple)):
            # A repeated header arrives as several values; only a single unambiguous one is honoured.
            raw = raw[0] if len(raw) == 1 else None
        if not isinstance(raw, str) or not raw or len(raw) > MAX_HEADER_LENGTH:
            self.counts["tier_invalid"] += 1
            return self.default_tier
        tier = raw.strip()
        if tier in self.allowed:
            return tier
        self.counts["tier_invalid"] += 1
        return self.default_tier


def resolve_tiers(spans, resolver: TierResolver) -> None:
    """Fill `spans.tier` from the untrusted `spans.tier_header`, which is dropped once resolved."""
    spans.tier = [resolver.resolve(raw) for raw in spans.tier_header]
    spans.tier_header = [None] * len(spans.tier)
