"""TCP round-trip time from the kernel's tcp_info (sloscope.tcp.rtt), through netlink sock_diag: what stands in
for the eBPF tcp_rtt probe where it cannot run.

Each read dumps the established TCP sockets of both families with their struct tcp_info (INET_DIAG_INFO, as
`ss -ti` asks) and puts each connection's tcpi_rtt, the smoothed RTT in whole microseconds, into one histogram,
bucketed exactly as the kernel programs bucket (probes/ebpf/hist.h): the same log2 buckets of a second, the
same exact sum. What a sample is differs: one per connection per read here, one per received segment there, so
here an idle connection counts as much as a busy one.

Cost. A dump walks the kernel's whole established hash table (see sock_diag.py) and fills a tcp_info of some
250 bytes per socket, so the probe reads once per 10 s whatever the interval, as tcp_connections does, and
reads at most `max_connections` connections per read (MAX_CONNECTIONS by default): past that the dump is
dropped, the kernel stops filling it, and a note says that the histogram holds the first connections of the
hash table's order, not all of them.

netlink sees the sockets of the network namespace it is opened in, this process's: a `proc` root of another
namespace makes the probe unavailable (no file in /proc gives the RTT)."""

from __future__ import annotations

from collections import Counter

from ..base import Availability, ProbeUnavailable
from ..sample import AnySample, log2_histogram
from .common import ProcfsProbe
from .sock_diag import SockDiag
from .tcp_connections import netns_mismatch

SIGNAL = "sloscope.tcp.rtt"
# At the cap, about 1 MiB of tcp_info for the kernel to fill and some 10 ms of Python per read (once per 10 s); a
# node with more connections still gets a histogram of thousands of them.
MAX_CONNECTIONS = 4096


def kernel_slot(ns: int) -> int:
    """The log2 slot hist.h's sloscope_slot gives a duration of `ns` nanoseconds: its units of 2^-30 s by the
    same integer arithmetic, then bpf_log2l (floor(log2) + 1, 0 for 0)."""
    units = ns * 2097152 // 1953125 if ns < (1 << 43) else ns // 1953125 * 2097152
    return units.bit_length()


class TcpInfoProbe(ProcfsProbe):
    name = "tcp_info"
    signals = (SIGNAL,)
    description = "TCP smoothed RTT per established connection (netlink sock_diag, tcp_info tcpi_rtt)"
    files = ()
    period_s = 10.0  # a dump walks the whole connection hash table, as tcp_connections' does

    def __init__(self, proc: str = "/proc", *, max_connections: int = MAX_CONNECTIONS, host=None):
        super().__init__(proc, host)
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.max_connections = int(max_connections)
        self._diag: SockDiag | None = None

    def _limit_note(self, method: str) -> str:
        return f"reading through {method}, at most {self.max_connections} connections per read"

    def _open(self) -> tuple[SockDiag | None, str]:
        """(the netlink reader, "") or (None, why there is none)."""
        mismatch = netns_mismatch(self.proc)
        if mismatch:
            return None, f"{mismatch} (netlink sock_diag sees only its own)"
        try:
            return SockDiag(), ""
        except OSError as exc:
            return None, f"netlink sock_diag refused: {exc}"

    def check(self) -> Availability:
        diag, why = self._open()
        if diag is None:
            return Availability(self.name, (why,))
        diag.close()
        return Availability(self.name, notes=(self._limit_note(diag.method),))

    def _start(self) -> None:
        self._diag, why = self._open()
        if self._diag is None:
            raise ProbeUnavailable(self.name, [why])
        self._notes = [self._limit_note(self._diag.method)]

    def _stop(self) -> None:
        diag, self._diag = self._diag, None
        if diag is not None:
            diag.close()

    def read_samples(self, start_ns: int, now: int) -> list[AnySample]:
        if self._diag is None:  # dropped after a failed read
            self._diag = SockDiag()
        try:
            rtts, more = self._diag.established_rtts(self.max_connections)
        except (OSError, ValueError):
            # a dump that failed half-way may leave the socket mid-dump: the next read opens a fresh one
            self._stop()
            raise
        if more:
            self._note(f"more than {self.max_connections} established connections: each read takes the first "
                       f"{self.max_connections} in the kernel's hash-table order")
        measured = [us for us in rtts if us]  # 0: no RTT sample yet on that connection
        if not measured:
            return []
        slots = Counter(kernel_slot(us * 1000) for us in measured)
        return [log2_histogram(SIGNAL, {}, slots, sum(measured) / 1e6, start_ns, now)]
