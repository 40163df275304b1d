"""The significance tests behind every SLI verdict: is a window's count of bad requests (slow or failed)
improbable for a service running exactly at its objective, and which windows of a whole fleet are, with the
false discoveries controlled across all of them (Benjamini-Hochberg)."""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np


@lru_cache(maxsize=1 << 16)
def poisson_tail(k: int, expected: float) -> float:
    """P(X >= k) for X ~ Poisson(expected): the chance of at least k bad requests in a window whose service
    runs exactly at its objective. At or below the expected count the tail is about a half or more, never
    significant at any level used here, so it is reported as 1 (and the sums stay clear of underflow)."""
    if k <= 0 or k <= expected:
        return 1.0
    if expected <= 0:
        return 0.0
    log_first = -expected + k * math.log(expected) - math.lgamma(k + 1)
    # The terms after the k-th fall geometrically (k > expected), so the sum of their ratios converges fast.
    ratio_sum, ratio, j = 1.0, 1.0, k
    while ratio > ratio_sum * 1e-15:
        j += 1
        ratio *= expected / j
        ratio_sum += ratio
    return min(1.0, math.exp(log_first + math.log(ratio_sum)))


def fleet_discoveries(p_values: np.ndarray, fdr: float) -> np.ndarray:
    """Benjamini-Hochberg: which of the p-values are discoveries with the false-discovery rate held at `fdr`
    across all of them. When nothing is wrong anywhere this bounds the chance of any false discovery at `fdr`;
    when a fault makes many windows bad, the bar for the others falls in proportion."""
    m = len(p_values)
    if m == 0:
        return np.zeros(0, dtype=bool)
    ordered = np.sort(p_values)
    passing = np.flatnonzero(ordered <= fdr * np.arange(1, m + 1) / m)
    if len(passing) == 0:
        return np.zeros(m, dtype=bool)
    return p_values <= ordered[passing[-1]]


def z_for(alpha: float) -> float:
    """The standard normal quantile above which a fraction `alpha` lies."""
    return NormalDist().inv_cdf(1.0 - alpha)


def poisson_critical_approx(expected: float, alpha: float) -> float:
    """A closed form of the smallest count that Poisson(expected) reaches with probability below `alpha`
    (normal approximation with a skew correction), as PromQL can compute it: within one request of the exact
    count from an expected 0.4 up, and never below it."""
    z = z_for(alpha)
    return expected + z * math.sqrt(expected) + (z * z + 2.0) / 6.0
