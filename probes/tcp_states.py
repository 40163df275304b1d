"""Kernel TCP state numbers (include/net/tcp_states.h) -> `network.connection.state` values
(OpenTelemetry semantic conventions; lower case)."""

STATE_NAMES: dict[int, str] = {
    1: "established",
    2: "syn_sent",
    3: "syn_received",
    4: "fin_wait_1",
    5: "fin_wait_2",
    6: "time_wait",
    7: "closed",
    8: "close_wait",
    9: "last_ack",
    10: "listen",
    11: "closing",
    12: "new_syn_recv",  # request sockets; not a semantic-convention value, rarely seen
}

# The states /proc/net/tcp reports (request sockets show as syn_received).
CONNECTION_STATES = tuple(v for k, v in STATE_NAMES.items() if k != 12)
