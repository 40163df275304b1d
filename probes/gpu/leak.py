"""GPU memory-leak rule over (time, bytes) samples of `hw.gpu.memory.usage`.

The rule (DESIGN.md Contract 5, cause `gpu_memory_leak`, and the one the remediation side acts on): memory
usage growing by more than 5 % per minute in 3 samples in a row. "Growing in a sample" is measured against
the sample before it, as relative growth per minute, the same feature analytics computes:

    growth_i = (bytes_i - bytes_{i-1}) / bytes_{i-1} * 60 / (t_i - t_{i-1})      (t in seconds)

so the rule needs 4 readings (3 growth steps). Any step at or below the threshold (flat, or a caching
allocator giving memory back: the sawtooth) resets the run. A previous reading of 0 bytes has no relative
growth; it resets the run as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable

GROWTH_PER_MIN = 0.05
SAMPLES_IN_A_ROW = 3


def growth_per_min(t0: float, b0: float, t1: float, b1: float) -> float | None:
    """Relative growth per minute from (t0, b0) to (t1, b1); None when it is undefined (b0 <= 0)."""
    if t1 <= t0:
        raise ValueError(f"samples must be in increasing time order ({t0} then {t1})")
    if b0 <= 0:
        return None
    return (b1 - b0) / b0 * 60.0 / (t1 - t0)


@dataclass
class LeakState:
    """Streaming state of one series."""

    last: tuple[float, float] | None = None
    run: int = 0  # consecutive growth steps above the threshold
    run_started: float | None = None  # time of the reading the current run grows from
    growth: list[float] = field(default_factory=list)  # growth of the steps in the current run


@dataclass(frozen=True)
class LeakVerdict:
    leaking: bool
    run: int  # growth steps in a row above the threshold, at the last sample
    since: float | None  # when the run that flagged (or is building) started
    growth_per_min: tuple[float, ...]  # growth of the steps in that run


class LeakDetector:
    """Feed (time, bytes) per series (e.g. per hw.id); `add` says whether the series is leaking now."""

    def __init__(self, threshold: float = GROWTH_PER_MIN, in_a_row: int = SAMPLES_IN_A_ROW):
        if in_a_row < 1:
            raise ValueError("in_a_row must be at least 1")
        self.threshold = threshold
        self.in_a_row = in_a_row
        self._series: dict[Hashable, LeakState] = {}

    def add(self, t: float, used_bytes: float, key: Hashable = None) -> LeakVerdict:
        state = self._series.setdefault(key, LeakState())
        if state.last is not None:
            t0, b0 = state.last
            g = growth_per_min(t0, b0, t, used_bytes)
            if g is not None and g > self.threshold:
                if state.run == 0:
                    state.run_started = t0
                    state.growth = []
                state.run += 1
                state.growth.append(g)
            else:
                state.run, state.run_started, state.growth = 0, None, []
        state.last = (t, used_bytes)
        return self.verdict(key)

    def verdict(self, key: Hashable = None) -> LeakVerdict:
        state = self._series.get(key) or LeakState()
        return LeakVerdict(state.run >= self.in_a_row, state.run, state.run_started, tuple(state.growth))

    def forget(self, key: Hashable = None) -> None:
        self._series.pop(key, None)


def detect_leak(samples: Iterable[tuple[float, float]], threshold: float = GROWTH_PER_MIN,
                in_a_row: int = SAMPLES_IN_A_ROW) -> LeakVerdict:
    """Whether the series was flagged at any point; the verdict of the first flagging run, else of the end."""
    detector = LeakDetector(threshold, in_a_row)
    verdict = detector.verdict()
    for t, b in samples:
        verdict = detector.add(t, b)
        if verdict.leaking:
            return verdict
    return verdict
