"""TCP retransmits (sloscope.tcp.retransmits, counted per retransmitted skb from tcp:tcp_retransmit_skb) and
state transitions per new state (sloscope.tcp.state_transitions, from sock:inet_sock_set_state)."""

from __future__ import annotations

from ..sample import AnySample, Sample, counter_delta
from ..tcp_states import STATE_NAMES
from .loader import BccProbe, map_value

RETRANSMITS = "sloscope.tcp.retransmits"
TRANSITIONS = "sloscope.tcp.state_transitions"


class TcpProbe(BccProbe):
    name = "tcp"
    signals = (RETRANSMITS, TRANSITIONS)
    description = "TCP retransmits and state transitions (eBPF tcp:tcp_retransmit_skb, sock:inet_sock_set_state)"
    c_file = "tcp.c"

    def __init__(self, host=None):
        super().__init__(host)
        self._prev: dict[str, int] = {}

    def tracepoints(self) -> list[str]:
        return ["tcp:tcp_retransmit_skb", "sock:inet_sock_set_state"]

    def read(self, bpf, start_ns: int, now: int) -> list[AnySample]:
        current = {"retransmits": map_value(bpf[b"retransmits"][0])}
        transitions = bpf[b"transitions"]
        for state, name in STATE_NAMES.items():
            current[name] = map_value(transitions[state])
        samples = [Sample(RETRANSMITS, {}, now, counter_delta(self._prev.get("retransmits", 0),
                                                              current["retransmits"]), "counter_delta", start_ns)]
        for state, name in STATE_NAMES.items():
            if current[name]:  # states never seen since start stay out of the stream
                samples.append(Sample(TRANSITIONS, {"network.connection.state": name}, now,
                                      counter_delta(self._prev.get(name, 0), current[name]), "counter_delta",
                                      start_ns))
        self._prev = current
        return samples
