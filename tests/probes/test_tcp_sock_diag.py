"""TCP connection counts through netlink sock_diag against /proc/net/tcp{,6}: the reply parser on crafted
netlink messages, and both on known sockets in a network namespace of their own (nothing else opens or closes
sockets there, so the two readings are of the same sockets)."""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sloscope.probes.procfs.sock_diag import (NLMSGHDR, SOCK_DIAG_BY_FAMILY, NLMSG_DONE, NLMSG_ERROR, SockDiag,
                                              tally_states)
from sloscope.probes.procfs.tcp_connections import TcpConnectionsProbe, count_by_name, parse_proc_net_tcp
from tests.conftest import need

REPO = Path(__file__).resolve().parents[2]
# What the helper below opens, per state, over IPv4 and IPv6 together.
EXPECTED = {"listen": 4, "established": 10, "time_wait": 3, "close_wait": 2, "fin_wait_2": 2}


def message(kind: int, seq: int, payload: bytes) -> bytes:
    body = NLMSGHDR.pack(NLMSGHDR.size + len(payload), kind, 2, seq, 0) + payload
    return body + b"\0" * (-len(body) % 4)


def diag_msg(state: int, extra: int = 0) -> bytes:
    """An inet_diag_msg of `state` (72 bytes) with `extra` bytes of attributes after it."""
    return message(SOCK_DIAG_BY_FAMILY, 7, bytes([socket.AF_INET, state]) + bytes(70 + extra))


def test_tally_counts_state_bytes_until_done():
    counts = [0] * 256
    part = diag_msg(1) + diag_msg(10, extra=9) + diag_msg(1) + message(SOCK_DIAG_BY_FAMILY, 6, bytes([2, 6]) + bytes(70))
    assert tally_states(part, len(part), 7, SOCK_DIAG_BY_FAMILY, counts) is False
    assert (counts[1], counts[10], counts[6]) == (2, 1, 0)  # the message of sequence 6 is an older dump's
    done = message(NLMSG_DONE, 7, struct.pack("=i", 0))
    assert tally_states(done, len(done), 7, SOCK_DIAG_BY_FAMILY, counts) is True


def test_tally_refuses_errors_and_malformed_lengths():
    error = message(NLMSG_ERROR, 7, struct.pack("=i", -1) + bytes(16))
    with pytest.raises(OSError) as exc:
        tally_states(error, len(error), 7, SOCK_DIAG_BY_FAMILY, [0] * 256)
    assert exc.value.errno == 1
    for bad in (NLMSGHDR.pack(8, SOCK_DIAG_BY_FAMILY, 2, 7, 0), NLMSGHDR.pack(400, SOCK_DIAG_BY_FAMILY, 2, 7, 0)):
        with pytest.raises(ValueError, match="malformed"):
            tally_states(bad, len(bad), 7, SOCK_DIAG_BY_FAMILY, [0] * 256)


def test_request_sockets_count_as_syn_received():
    states = [0] * 256
    states[3], states[12], states[1] = 1, 2, 4
    assert count_by_name(states) == {"syn_received": 3, "established": 4}


def test_live_probe_says_it_counts_through_netlink():
    with TcpConnectionsProbe() as probe:
        assert probe.notes[0].startswith("counting through netlink sock_diag")
        assert {s.attributes["network.connection.state"] for s in probe.collect()} >= {"listen", "time_wait"}
    assert probe.notes == ()


def test_another_proc_root_falls_back_to_proc_net_tcp(tmp_path):
    (tmp_path / "net").mkdir()
    shutil.copy(REPO / "tests/data/procfs/net_tcp", tmp_path / "net/tcp")
    probe = TcpConnectionsProbe(proc=str(tmp_path))
    assert "cannot be compared" in probe.check().notes[0]
    with probe:
        assert probe.notes[0].startswith(f"reading {tmp_path}/net/tcp{{,6}}: the network namespace of {tmp_path}")
        counts = {s.attributes["network.connection.state"]: s.value for s in probe.collect()}
    assert counts["established"] == 6 and counts["listen"] == 2 and counts["syn_sent"] == 0


# -- known sockets in a network namespace of their own -------------------------------------------------------

def pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    return client, accepted


def open_known_sockets() -> list[socket.socket]:
    """The sockets of EXPECTED; the caller keeps them open."""
    keep, listeners = [], []
    for family, host, pairs in ((socket.AF_INET, "127.0.0.1", 3), (socket.AF_INET6, "::1", 2)):
        for _ in range(2):
            listener = socket.socket(family)
            listener.bind((host, 0))
            listener.listen(8)
            keep.append(listener)
        listeners.append(listener)
        for _ in range(pairs):
            keep.extend(pair(listener))  # 2 established each
        bound_only = socket.socket(family)  # bound, never listening or connecting: in no table
        bound_only.bind((host, 0))
        keep.append(bound_only)
    v4_listener, v6_listener = listeners
    for _ in range(3):  # the side closing first ends in time_wait
        client, accepted = closed_by_client(v4_listener)
        accepted.close()
    for _ in range(2):  # the peer closed, this side not yet: close_wait here, fin_wait_2 there
        keep.append(closed_by_client(v6_listener)[1])
    return keep


def closed_by_client(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    """A pair whose client closed, once its FIN reached the accepted side (so the closes never cross)."""
    client, accepted = pair(listener)
    client.close()
    assert accepted.recv(1) == b""
    return client, accepted


def proc_counts() -> dict[str, int]:
    counts = parse_proc_net_tcp(Path("/proc/net/tcp").read_text())
    return dict(counts + parse_proc_net_tcp(Path("/proc/net/tcp6").read_text()))


def netlink_counts(one_walk: bool) -> dict[str, int]:
    diag = SockDiag(one_walk)
    try:
        assert diag.one_walk is one_walk
        return dict(count_by_name(diag.tcp_states()))
    finally:
        diag.close()


def count_known_sockets() -> dict:
    """In the namespace: open the sockets, wait for the closes to settle, then read both ways."""
    keep = open_known_sockets()
    deadline = time.monotonic() + 20
    while proc_counts() != EXPECTED and time.monotonic() < deadline:
        time.sleep(0.05)
    result = {"proc": proc_counts(), "one_walk": netlink_counts(True), "per_family": netlink_counts(False)}
    with TcpConnectionsProbe() as probe:
        result["probe"] = {s.attributes["network.connection.state"]: s.value for s in probe.collect() if s.value}
        result["notes"] = list(probe.notes)
    outside = f"/proc/{os.getppid()}"  # the test, which ip-netns-exec'd this
    result["outside"] = [outside, *TcpConnectionsProbe(proc=outside).check().notes]
    for s in keep:
        s.close()
    return result


@pytest.fixture
def netns():
    need(os.geteuid() == 0 and shutil.which("ip") is not None, "creating a network namespace needs root and ip(8)")
    name = f"sloscope-sockdiag-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_netlink_counts_equal_proc_net_tcp_in_a_namespace(netns):
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.probes.test_tcp_sock_diag"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["proc"] == EXPECTED
    assert result["one_walk"] == result["per_family"] == EXPECTED
    assert result["probe"] == {state: float(n) for state, n in EXPECTED.items()}
    assert result["notes"][0].startswith("counting through netlink sock_diag")
    outside, note = result["outside"]
    assert note == f"reading {outside}/net/tcp{{,6}}: {outside} is in another network namespace than this process"


if __name__ == "__main__":
    print(json.dumps(count_known_sockets()))
