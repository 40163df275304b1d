"""TCP round-trip time (sloscope.tcp.rtt): the smoothed RTT of established connections, one sample per received
segment (tcp:tcp_probe, which tcp_rcv_established fires), one histogram for the node.

Sampled per segment, busy connections weigh in proportion to their traffic: the histogram is the RTT that
received data saw, not the mean over connections (the netlink fallback, probes/procfs/tcp_info.py, gives that)."""

from __future__ import annotations

from ..sample import AnySample, log2_histogram
from .loader import BccProbe, HistogramDeltas, read_histograms
from .maps import BpfMap, index_key

SIGNAL = "sloscope.tcp.rtt"


class TcpRttProbe(BccProbe):
    name = "tcp_rtt"
    signals = (SIGNAL,)
    description = "TCP smoothed RTT per received segment (eBPF tcp:tcp_probe, fired by tcp_rcv_established)"
    c_file = "tcp_rtt.c"
    maps = ("hist",)

    def __init__(self, host=None):
        super().__init__(host)
        self._deltas = HistogramDeltas()

    def tracepoints(self) -> list[str]:
        return ["tcp:tcp_probe"]

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        deltas = self._deltas.update(*read_histograms(maps["hist"], [(index_key(0), None)]))
        if None not in deltas:
            return []
        delta, sum_delta = deltas[None]
        return [log2_histogram(SIGNAL, {}, delta, sum_delta / 1e9, start_ns, now)]
