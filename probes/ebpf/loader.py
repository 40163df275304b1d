"""What the bcc loaders share: compile a .c file beside them, attach, read maps into deltas, detach.

Maps are cumulative in the kernel and never cleared from user space (clearing races with the programs);
each collect differences the current totals against the previous ones.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from typing import Any, ClassVar, Hashable, Iterable

from ..base import Availability, Probe, ProbeError, ProbeUnavailable, ebpf_missing, now_ns
from ..sample import AnySample

log = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))


def map_value(value: Any) -> int:
    """A map value as an int: plain ctypes scalars, or per-CPU arrays (summed over CPUs)."""
    if hasattr(value, "value"):
        return int(value.value)
    return int(sum(int(v) for v in value))


def read_map(table, key=lambda k: k.value) -> dict[Hashable, int]:
    """{key(map key): value} for every entry; `key` turns a ctypes key into something hashable."""
    out: dict[Hashable, int] = {}
    for k, value in table.items():
        out[key(k)] = out.get(key(k), 0) + map_value(value)
    return out


class HistogramDeltas:
    """Cumulative (key -> slot -> count, key -> sum_ns) in, deltas since the previous call out."""

    def __init__(self) -> None:
        self._slots: dict[Hashable, dict[int, int]] = {}
        self._sums: dict[Hashable, int] = {}

    def update(self, slots: dict[Hashable, dict[int, int]], sums: dict[Hashable, int]
               ) -> dict[Hashable, tuple[dict[int, int], int]]:
        out: dict[Hashable, tuple[dict[int, int], int]] = {}
        for key, cur in slots.items():
            prev = self._slots.get(key, {})
            delta = {s: c - prev.get(s, 0) for s, c in cur.items() if c > prev.get(s, 0)}
            sum_delta = max(0, sums.get(key, 0) - self._sums.get(key, 0))
            if delta:
                out[key] = (delta, sum_delta)
        self._slots = {k: dict(v) for k, v in slots.items()}
        self._sums = dict(sums)
        return out


def group_slots(counts: dict[tuple, int]) -> dict[Hashable, dict[int, int]]:
    """Turn {(group, slot): count} into {group: {slot: count}}."""
    grouped: dict[Hashable, dict[int, int]] = defaultdict(dict)
    for (group, slot), count in counts.items():
        grouped[group][slot] = grouped[group].get(slot, 0) + count
    return dict(grouped)


class BccProbe(Probe):
    """Base of the eBPF probes. Subclasses name their `c_file`, the tracepoints they need, and `read()`."""

    source = "ebpf"
    c_file: ClassVar[str]
    any_tracepoint: ClassVar[bool] = False  # True: runs if at least one of tracepoints() exists

    def __init__(self, host=None):
        super().__init__(host)
        self._bpf = None
        self._last_ns = 0
        self._notes: tuple[str, ...] = ()

    # -- what subclasses provide -------------------------------------------------------------------
    def tracepoints(self) -> list[str]:
        raise NotImplementedError

    def cflags(self) -> list[str]:
        return []

    def attach(self, bpf) -> None:
        """Attach what TRACEPOINT_PROBE did not attach already; fill filter maps."""

    def read(self, bpf, start_ns: int, now: int) -> list[AnySample]:
        raise NotImplementedError

    # -- the Probe interface -----------------------------------------------------------------------
    def check(self) -> Availability:
        try:
            missing, notes = ebpf_missing(self.host, self.tracepoints(), any_of=self.any_tracepoint)
        except Exception as exc:  # a check must never take the caller down
            missing, notes = [f"availability check failed: {type(exc).__name__}: {exc}"], []
        return Availability(self.name, tuple(missing), tuple(notes))

    @property
    def running(self) -> bool:
        return self._bpf is not None

    @property
    def notes(self) -> tuple[str, ...]:
        return self._notes

    def start(self) -> None:
        if self._bpf is not None:
            return
        availability = self.check()
        if not availability.ok:
            raise ProbeUnavailable(self.name, availability.missing)
        self._notes = availability.notes
        from bcc import BPF

        path = os.path.join(HERE, self.c_file)
        try:
            bpf = BPF(src_file=path.encode(), cflags=[f"-I{HERE}", *self.cflags()])
        except Exception as exc:
            raise ProbeUnavailable(self.name, [f"BPF program {self.c_file} failed to compile or load: {exc}"]) from exc
        try:
            self.attach(bpf)
        except BaseException as exc:
            bpf.cleanup()
            if isinstance(exc, Exception):
                raise ProbeUnavailable(self.name, [f"attaching {self.c_file} failed: {exc}"]) from exc
            raise
        self._bpf = bpf
        self._last_ns = now_ns()

    def collect(self) -> list[AnySample]:
        if self._bpf is None:
            raise ProbeError(f"probe {self.name!r} is not started")
        now = now_ns()
        samples = self.read(self._bpf, self._last_ns, now)
        self._last_ns = now
        return samples

    def stop(self) -> None:
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            bpf.cleanup()


def attach_tracepoints(bpf, pairs: Iterable[tuple[str, str]]) -> None:
    for tracepoint, fn in pairs:
        bpf.attach_tracepoint(tp=tracepoint.encode(), fn_name=fn.encode())
