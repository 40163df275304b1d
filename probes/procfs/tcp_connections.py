"""TCP connections per state -> system.network.connection.count (gauge): counted through netlink sock_diag
where the kernel allows it and the /proc root is this process's own network namespace, else parsed from
/proc/net/tcp and /proc/net/tcp6. Both give the same counts; `notes` says which one runs and why."""

from __future__ import annotations

import os
from collections import Counter

from ..base import Availability, ProbeUnavailable
from ..sample import AnySample, Sample
from ..tcp_states import CONNECTION_STATES, STATE_NAMES
from .common import ProcfsProbe
from .sock_diag import SockDiag

SIGNAL = "system.network.connection.count"
TCP_SYN_RECV, TCP_NEW_SYN_RECV = 3, 12
OWN_NETNS = "/proc/self/ns/net"


def parse_proc_net_tcp(text: str) -> Counter:
    """Connection count per state name. The state column is found by its header 'st'; the columns before it
    ('sl', 'local_address', 'rem_address') are one token each in every row."""
    lines = text.splitlines()
    if not lines:
        return Counter()
    header = lines[0].split()
    if "st" not in header:
        raise ValueError(f"/proc/net/tcp header has no 'st' column: {lines[0]!r}")
    col = header.index("st")
    counts: Counter = Counter()
    for line in lines[1:]:
        parts = line.split(maxsplit=col + 1)
        if len(parts) <= col:
            continue
        state = int(parts[col], 16)
        counts[STATE_NAMES.get(state, f"state_{state}")] += 1
    return counts


def count_by_name(states: list[int]) -> Counter:
    """sock_diag counts by state number -> by state name, request sockets as syn_received like /proc/net/tcp."""
    states[TCP_SYN_RECV] += states[TCP_NEW_SYN_RECV]
    states[TCP_NEW_SYN_RECV] = 0
    return Counter({STATE_NAMES.get(state, f"state_{state}"): n for state, n in enumerate(states) if n})


def netns_mismatch(proc: str) -> str | None:
    """Why netlink would not see the sockets of `proc`/net: a netlink socket sees its creator's namespace."""
    if proc == "/proc":
        return None
    try:
        theirs, ours = os.stat(os.path.join(proc, "ns/net")), os.stat(OWN_NETNS)
    except OSError as exc:
        return f"the network namespace of {proc} cannot be compared with this process's ({exc.strerror})"
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return f"{proc} is in another network namespace than this process"
    return None


def open_sock_diag(proc: str) -> tuple[SockDiag | None, str]:
    """(the netlink counter, "") or (None, why /proc/net/tcp is read instead)."""
    mismatch = netns_mismatch(proc)
    if mismatch:
        return None, mismatch
    try:
        return SockDiag(), ""
    except OSError as exc:
        return None, f"netlink sock_diag refused: {exc}"


class TcpConnectionsProbe(ProcfsProbe):
    name = "tcp_connections"
    signals = (SIGNAL,)
    description = "TCP connections per state (netlink sock_diag, else /proc/net/tcp, /proc/net/tcp6)"
    files = ("net/tcp",)
    # Either source walks the kernel's whole connection hash table (its size follows the memory, not the number
    # of sockets): about 3 ms of kernel time per read with 24 GiB, a quarter of the collector's CPU at a 1 s
    # interval. Connection counts move slowly, and analysis averages them per 10 s step anyway.
    period_s = 10.0

    def __init__(self, proc: str = "/proc", host=None):
        super().__init__(proc, host)
        self._diag: SockDiag | None = None
        self._fallback_reason = ""

    def check(self) -> Availability:
        diag, why = open_sock_diag(self.proc)
        if diag is not None:
            diag.close()
            return Availability(self.name, notes=(f"counting through {diag.method}",))
        return Availability(self.name, super().check().missing, (self._fallback_note(why),))

    @property
    def notes(self) -> tuple[str, ...]:
        if not self._running:
            return ()
        return (f"counting through {self._diag.method}",) if self._diag else (self._fallback_note(self._fallback_reason),)

    def _fallback_note(self, why: str) -> str:
        return f"reading {self.path('net/tcp')}{{,6}}: {why}"

    def _start(self) -> None:
        self._diag, self._fallback_reason = open_sock_diag(self.proc)
        if self._diag is None:
            missing = super().check().missing
            if missing:
                raise ProbeUnavailable(self.name, missing + (self._fallback_note(self._fallback_reason),))

    def _stop(self) -> None:
        if self._diag is not None:
            self._diag.close()
            self._diag = None

    def read_counts(self) -> Counter:
        if self._diag is not None:
            return count_by_name(self._diag.tcp_states())
        counts = parse_proc_net_tcp(self.read_text("net/tcp"))
        try:
            counts += parse_proc_net_tcp(self.read_text("net/tcp6"))
        except FileNotFoundError:
            pass  # no IPv6
        return counts

    def read_samples(self, start_ns: int, now: int) -> list[AnySample]:
        counts = self.read_counts()
        states = list(CONNECTION_STATES) + sorted(set(counts) - set(CONNECTION_STATES))
        return [Sample(SIGNAL, {"network.connection.state": s, "network.transport": "tcp"}, now,
                       float(counts.get(s, 0)), "gauge", start_ns) for s in states]
