"""Run-queue delay (sloscope.cpu.runqueue.delay): wake-up (or preemption) to running, one histogram."""

from __future__ import annotations

from ..sample import AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, read_histograms
from .maps import BpfMap, index_key

SIGNAL = "sloscope.cpu.runqueue.delay"


class RunqueueProbe(BccProbe):
    name = "runqueue"
    signals = (SIGNAL,)
    description = "run-queue delay histogram (eBPF sched:sched_wakeup{,_new} -> sched:sched_switch)"
    c_file = "runqueue.c"
    maps = ("hist",)

    def __init__(self, host=None):
        super().__init__(host)
        self._deltas = HistogramDeltas()

    def tracepoints(self) -> list[str]:
        return ["sched:sched_wakeup", "sched:sched_wakeup_new", "sched:sched_switch"]

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        deltas = self._deltas.update(*read_histograms(maps["hist"], [(index_key(0), None)]))
        if None not in deltas:
            return []
        delta, sum_delta = deltas[None]
        return [log2_histogram(SIGNAL, {}, delta, sum_delta / 1e9, start_ns, now)]
