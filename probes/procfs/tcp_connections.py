"""/proc/net/tcp and /proc/net/tcp6 -> system.network.connection.count per state (gauge)."""

from __future__ import annotations

from collections import Counter

from ..sample import AnySample, Sample
from ..tcp_states import CONNECTION_STATES, STATE_NAMES
from .common import ProcfsProbe

SIGNAL = "system.network.connection.count"


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
        parts = line.split()
        if len(parts) <= col:
            continue
        state = int(parts[col], 16)
        counts[STATE_NAMES.get(state, f"state_{state}")] += 1
    return counts


class TcpConnectionsProbe(ProcfsProbe):
    name = "tcp_connections"
    signals = (SIGNAL,)
    description = "TCP connections per state (/proc/net/tcp, /proc/net/tcp6)"
    files = ("net/tcp",)

    def read_samples(self, start_ns: int, now: int) -> list[AnySample]:
        counts = parse_proc_net_tcp(self.read_text("net/tcp"))
        try:
            counts += parse_proc_net_tcp(self.read_text("net/tcp6"))
        except FileNotFoundError:
            pass  # no IPv6
        states = list(CONNECTION_STATES) + sorted(set(counts) - set(CONNECTION_STATES))
        return [Sample(SIGNAL, {"network.connection.state": s, "network.transport": "tcp"}, now,
                       float(counts.get(s, 0)), "gauge", start_ns) for s in states]
