"""TCP retransmits (sloscope.tcp.retransmits, counted per retransmitted skb from tcp:tcp_retransmit_skb) and
state transitions per new state (sloscope.tcp.state_transitions, from sock:inet_sock_set_state)."""

from __future__ import annotations

from ..sample import AnySample, Sample, counter_delta
from ..tcp_states import STATE_NAMES
from .loader import BccProbe
from .maps import BpfMap, index_key

RETRANSMITS = "sloscope.tcp.retransmits"
TRANSITIONS = "sloscope.tcp.state_transitions"


class TcpProbe(BccProbe):
    name = "tcp"
    signals = (RETRANSMITS, TRANSITIONS)
    description = "TCP retransmits and state transitions (eBPF tcp:tcp_retransmit_skb, sock:inet_sock_set_state)"
    c_file = "tcp.c"
    maps = ("retransmits", "transitions")

    def __init__(self, host=None):
        super().__init__(host)
        self._prev: dict[str, int] = {}

    def tracepoints(self) -> list[str]:
        return ["tcp:tcp_retransmit_skb", "sock:inet_sock_set_state"]

    def read(self, maps: dict[str, BpfMap], start_ns: int, now: int) -> list[AnySample]:
        (retransmits,) = maps["retransmits"].u64s(index_key(0))
        current = {"retransmits": retransmits}
        for state, name in STATE_NAMES.items():
            (current[name],) = maps["transitions"].u64s(index_key(state))
        samples = [Sample(RETRANSMITS, {}, now, counter_delta(self._prev.get("retransmits", 0),
                                                              current["retransmits"]), "counter_delta", start_ns)]
        for state, name in STATE_NAMES.items():
            if current[name]:  # states never seen since start stay out of the stream
                samples.append(Sample(TRANSITIONS, {"network.connection.state": name}, now,
                                      counter_delta(self._prev.get(name, 0), current[name]), "counter_delta",
                                      start_ns))
        self._prev = current
        return samples
