"""Block I/O latency per device (sloscope.block.io.duration), request issue to completion."""

from __future__ import annotations

import os
import struct

from ..sample import AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, read_histograms
from .maps import BpfMap

SIGNAL = "sloscope.block.io.duration"


def device_name(dev: int, sysfs: str = "/sys") -> str:
    """Name of a kernel-internal dev_t (major << 20 | minor, as block tracepoints record it)."""
    major, minor = dev >> 20, dev & ((1 << 20) - 1)
    try:
        with open(os.path.join(sysfs, "dev/block", f"{major}:{minor}", "uevent")) as f:
            for line in f:
                if line.startswith("DEVNAME="):
                    return line.strip().split("=", 1)[1]
    except OSError:
        pass
    return f"{major}:{minor}"


class BlockIoProbe(BccProbe):
    name = "block"
    signals = (SIGNAL,)
    description = "block I/O latency per device (eBPF block:block_rq_issue -> block:block_rq_complete)"
    c_file = "block_io.c"
    maps = ("hist",)

    def __init__(self, host=None):
        super().__init__(host)
        self._deltas = HistogramDeltas()
        self._names: dict[int, str] = {}

    def tracepoints(self) -> list[str]:
        return ["block:block_rq_issue", "block:block_rq_complete"]

    def _name(self, dev: int) -> str:
        if dev not in self._names:
            self._names[dev] = device_name(dev)
        return self._names[dev]

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        hist = maps["hist"]
        slots, sums = read_histograms(hist, [(raw, struct.unpack("=I", raw)[0]) for raw in hist.keys()])
        return [log2_histogram(SIGNAL, {"system.device": self._name(dev)}, delta, sum_ns / 1e9, start_ns, now)
                for dev, (delta, sum_ns) in sorted(self._deltas.update(slots, sums).items())]
