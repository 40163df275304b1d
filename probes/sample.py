"""Protocol-neutral samples: what every probe's `collect()` returns.

Probes know nothing of OTLP; these types carry exactly what an OTLP data point needs, so the exporter maps
them one to one: `Sample` of kind "gauge" is a Gauge point, of kind "counter_delta" a point of a monotonic Sum
with delta temporality; `HistogramSample` is an ExponentialHistogram point with delta temporality.

Histograms from the kernel
--------------------------
The eBPF programs bucket durations the way bcc's tools do (`bpf_log2l`), but in a binary time unit: one
"unit" is 2^-UNIT_SHIFT seconds (about 0.93 ns; see probes/ebpf/hist.h). bcc's log2 slot k >= 1 holds values
v with 2^(k-1) <= v < 2^k units, i.e. 2^(k-1-UNIT_SHIFT) <= seconds < 2^(k-UNIT_SHIFT); slot 0 holds v == 0.
An OTLP exponential histogram at scale 0 has bucket index i covering (2^i, 2^(i+1)] seconds, so slot k maps
onto index i = k - 1 - UNIT_SHIFT and slot 0 onto the zero bucket.

The approximation, and the only one: the kernel's buckets are closed below and open above, OTLP's the other
way round, so a duration of exactly a power of two seconds (to within one unit) lands one bucket higher than
OTLP would put it. The conversion of nanoseconds to units rounds down by less than one unit. The sum is
accumulated in nanoseconds in a separate kernel map, so `sum / count` is the exact mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Union

# One kernel histogram unit is 2**-UNIT_SHIFT seconds (hist.h must agree).
UNIT_SHIFT = 30

Attributes = dict[str, Union[str, int]]
SampleKind = Literal["gauge", "counter_delta"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One number: a gauge reading, or a counter's increase over [start_time_unix_nano, time_unix_nano]."""

    name: str
    attributes: Attributes
    time_unix_nano: int
    value: float
    kind: SampleKind
    start_time_unix_nano: int

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "attributes": dict(self.attributes),
                "start_time_unix_nano": self.start_time_unix_nano, "time_unix_nano": self.time_unix_nano,
                "value": self.value}


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """Observations made over [start_time_unix_nano, time_unix_nano], as an OTLP exponential histogram
    (delta temporality). `positive_bucket_counts[j]` counts values in (2^(o+j), 2^(o+j+1)] at scale 0,
    o = positive_offset; `sum` is exact (see the module docstring)."""

    name: str
    attributes: Attributes
    time_unix_nano: int
    start_time_unix_nano: int
    count: int
    sum: float
    scale: int
    zero_count: int
    positive_offset: int
    positive_bucket_counts: list[int]
    min: float | None = None
    max: float | None = None

    @property
    def kind(self) -> str:
        return "histogram"

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def bucket_bounds(self, j: int) -> tuple[float, float]:
        """(lower, upper] of positive bucket j (0-based within positive_bucket_counts)."""
        base = 2.0 ** (2.0 ** -self.scale)
        i = self.positive_offset + j
        return base**i, base ** (i + 1)

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile: a conservative estimate, for people reading
        a table, not for analytics (which gets the buckets)."""
        if not self.count:
            return None
        rank = q * self.count
        seen = self.zero_count
        if seen >= rank and self.zero_count:
            return 0.0
        for j, c in enumerate(self.positive_bucket_counts):
            seen += c
            if seen >= rank:
                return self.bucket_bounds(j)[1]
        return self.bucket_bounds(len(self.positive_bucket_counts) - 1)[1]

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": "histogram", "attributes": dict(self.attributes),
                "start_time_unix_nano": self.start_time_unix_nano, "time_unix_nano": self.time_unix_nano,
                "count": self.count, "sum": self.sum, "scale": self.scale, "zero_count": self.zero_count,
                "positive_offset": self.positive_offset,
                "positive_bucket_counts": list(self.positive_bucket_counts), "min": self.min, "max": self.max}


AnySample = Union[Sample, HistogramSample]


def slot_to_index(slot: int) -> int:
    """OTLP scale-0 bucket index for bcc log2 slot `slot` >= 1 (kernel values in 2^-UNIT_SHIFT s units)."""
    return slot - 1 - UNIT_SHIFT


def log2_histogram(name: str, attributes: Attributes, slots: Mapping[int, int], sum_seconds: float,
                   start_time_unix_nano: int, time_unix_nano: int) -> HistogramSample:
    """Build a HistogramSample from bcc log2 slot counts (slot -> count, already deltas)."""
    zero = int(slots.get(0, 0))
    positive = {slot_to_index(k): int(c) for k, c in slots.items() if k > 0 and c}
    if positive:
        lo, hi = min(positive), max(positive)
        counts = [positive.get(i, 0) for i in range(lo, hi + 1)]
    else:
        lo, counts = 0, []
    return HistogramSample(name=name, attributes=attributes, time_unix_nano=time_unix_nano,
                           start_time_unix_nano=start_time_unix_nano, count=zero + sum(counts),
                           sum=float(sum_seconds), scale=0, zero_count=zero, positive_offset=lo,
                           positive_bucket_counts=counts)


def exponential_index(seconds: float) -> int | None:
    """Scale-0 bucket index an OTLP producer would give `seconds` (None for zero): ceil(log2(v)) - 1."""
    if seconds <= 0:
        return None
    m, e = math.frexp(seconds)  # seconds = m * 2**e, 0.5 <= m < 1
    return e - 1 if m != 0.5 else e - 2


def counter_delta(previous: float | None, current: float) -> float:
    """Increase of a monotonic counter; a counter that went backwards was reset, which counts as 0."""
    if previous is None or current < previous:
        return 0.0
    return float(current - previous)


def by_name(samples: Iterable[AnySample], name: str) -> list[AnySample]:
    return [s for s in samples if s.name == name]
