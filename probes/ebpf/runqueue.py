"""Run-queue delay (sloscope.cpu.runqueue.delay): wake-up (or preemption) to running, one histogram."""

from __future__ import annotations

from ..sample import AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, map_value

SIGNAL = "sloscope.cpu.runqueue.delay"
SLOTS = 64


class RunqueueProbe(BccProbe):
    name = "runqueue"
    signals = (SIGNAL,)
    description = "run-queue delay histogram (eBPF sched:sched_wakeup{,_new} -> sched:sched_switch)"
    c_file = "runqueue.c"

    def __init__(self, host=None):
        super().__init__(host)
        self._deltas = HistogramDeltas()

    def tracepoints(self) -> list[str]:
        return ["sched:sched_wakeup", "sched:sched_wakeup_new", "sched:sched_switch"]

    def read(self, bpf, start_ns: int, now: int) -> list[AnySample]:
        hist = bpf[b"hist"]
        slots = {}
        for slot in range(SLOTS):
            count = map_value(hist[slot])
            if count:
                slots[slot] = count
        sum_ns = map_value(bpf[b"sums"][0])
        deltas = self._deltas.update({None: slots}, {None: sum_ns})
        if None not in deltas:
            return []
        delta, sum_delta = deltas[None]
        return [log2_histogram(SIGNAL, {}, delta, sum_delta / 1e9, start_ns, now)]
