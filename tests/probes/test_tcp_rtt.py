"""TCP round-trip time (sloscope.tcp.rtt): the eBPF probe (tcp:tcp_probe) and its netlink fallback (tcp_info
through sock_diag), on crafted netlink replies, over loopback, and through a path of known delay between two
network namespaces.

The delay: the kernel here may lack sch_netem (nor can a module be loaded everywhere), so the two namespaces are
joined by a tun device in each, and a small forwarder in this file (`delay_line`) copies every packet from one to
the other after DELAY_S. Each direction is delayed once, so a round trip takes 2 * DELAY_S and a bit."""

import ctypes
import fcntl
import heapq
import json
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import ExponentialHistogram
from opentelemetry.sdk.resources import Resource

from sloscope.collectors.otlp_metrics import MetricsBuilder
from sloscope.probes import registry
from sloscope.probes.base import Host
from sloscope.probes.ebpf.tcp_rtt import TcpRttProbe
from sloscope.probes.procfs.sock_diag import (INET_DIAG_INFO, NLMSG_DONE, NLMSG_ERROR, NLMSGHDR, TCPDIAG_GETSOCK,
                                              DUMP_DONE, DUMP_FULL, DUMP_MORE, SockDiag, read_rtts)
from sloscope.probes.procfs.tcp_info import TcpInfoProbe, kernel_slot
from sloscope.probes.registry import ProbeSet
from sloscope.probes.sample import HistogramSample, exponential_index, slot_to_index
from tests.conftest import need

REPO = Path(__file__).resolve().parents[2]
SIGNAL = "sloscope.tcp.rtt"
DELAY_S = 0.010
DELAYED_BUCKET = -6  # (2^-6 s, 2^-5 s] = (15.6 ms, 31.25 ms]: two delays of 10 ms and what the forwarder adds
EXCHANGES = 50


# -- the netlink reply, crafted --------------------------------------------------------------------------------

def attribute(kind: int, payload: bytes) -> bytes:
    body = struct.pack("=HH", 4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def tcp_info(rtt_us: int) -> bytes:
    """A struct tcp_info of 232 bytes, zero but for tcpi_rtt."""
    info = bytearray(232)
    struct.pack_into("=I", info, 68, rtt_us)
    return bytes(info)


def socket_message(seq: int, rtt_us: int | None, kind: int = TCPDIAG_GETSOCK) -> bytes:
    """An inet_diag_msg of an established socket with attributes: the shutdown byte the kernel always sends, then
    the tcp_info (left out for None)."""
    payload = bytes([socket.AF_INET, 1]) + bytes(70) + attribute(8, b"\0")  # INET_DIAG_SHUTDOWN
    if rtt_us is not None:
        payload += attribute(INET_DIAG_INFO, tcp_info(rtt_us))
    body = NLMSGHDR.pack(NLMSGHDR.size + len(payload), kind, 2, seq, 0) + payload
    return body + b"\0" * (-len(body) % 4)


def done(seq: int, error: int = 0) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + 4, NLMSG_ERROR if error else NLMSG_DONE, 2, seq, 0) + struct.pack("=i", error)


def test_read_rtts_takes_tcpi_rtt_of_each_socket_until_done():
    rtts: list[int] = []
    part = socket_message(7, 120) + socket_message(6, 999) + socket_message(7, None) + socket_message(7, 20500)
    assert read_rtts(part, len(part), 7, TCPDIAG_GETSOCK, rtts, 100) == DUMP_MORE
    assert rtts == [120, 0, 20500]  # the message of sequence 6 is an older dump's; no tcp_info reads 0
    last = socket_message(7, 3) + done(7)
    assert read_rtts(last, len(last), 7, TCPDIAG_GETSOCK, rtts, 100) == DUMP_DONE
    assert rtts == [120, 0, 20500, 3]


def test_read_rtts_stops_at_the_limit_but_not_before_a_dump_that_ends_there():
    rtts: list[int] = []
    part = socket_message(7, 1) + socket_message(7, 2) + socket_message(7, 3)
    assert read_rtts(part, len(part), 7, TCPDIAG_GETSOCK, rtts, 2) == DUMP_FULL
    assert rtts == [1, 2]
    rtts = []
    exact = socket_message(7, 1) + socket_message(7, 2) + done(7)
    assert read_rtts(exact, len(exact), 7, TCPDIAG_GETSOCK, rtts, 2) == DUMP_DONE


def test_read_rtts_refuses_errors_and_malformed_lengths():
    error = done(7, error=-1)
    with pytest.raises(OSError) as exc:
        read_rtts(error, len(error), 7, TCPDIAG_GETSOCK, [], 10)
    assert exc.value.errno == 1
    bad = NLMSGHDR.pack(400, TCPDIAG_GETSOCK, 2, 7, 0)
    with pytest.raises(ValueError, match="malformed"):
        read_rtts(bad, len(bad), 7, TCPDIAG_GETSOCK, [], 10)


@pytest.mark.parametrize("rtt_us", [1, 3, 7, 100, 976, 977, 20000, 25000, 999_999, 1_000_001, 3_000_000])
def test_the_fallback_buckets_microseconds_as_the_kernel_programs_do(rtt_us):
    """hist.h's slots, mapped onto OTLP's scale-0 index, are the index of the value in seconds (none of these is a
    power of two of a second, where the two conventions differ by design: probes/sample.py)."""
    assert slot_to_index(kernel_slot(rtt_us * 1000)) == exponential_index(rtt_us / 1e6)


def test_kernel_slot_is_bpf_log2l_of_the_units():
    assert kernel_slot(0) == 0
    assert kernel_slot(1) == 1  # 1 ns is 1.07 units: slot 1 holds [1, 2)
    assert kernel_slot(10**9) == 31  # 1 s is 2^30 units: slot 31 holds [2^30, 2^31)
    assert kernel_slot(10**9 - 1) == 30


def test_the_fallback_cannot_read_another_namespace_through_netlink(tmp_path):
    probe = TcpInfoProbe(proc=str(tmp_path))
    (missing,) = probe.check().missing
    assert missing.startswith(f"the network namespace of {tmp_path} cannot be compared") and "netlink" in missing
    with pytest.raises(ValueError, match="max_connections"):
        TcpInfoProbe(max_connections=0)


class NoEbpf(Host):
    def bcc_import_error(self):
        return "ModuleNotFoundError: No module named 'bcc'"


def test_registry_runs_tcp_info_for_tcp_rtt_where_ebpf_cannot_run():
    assert "tcp_rtt" in registry.NODE_PROBES and registry.FALLBACKS["tcp_rtt"] == ("tcp_info",)
    assert registry.PROBES["tcp_rtt"].signals == registry.PROBES["tcp_info"].signals == (SIGNAL,)
    keep = loopback_pairs(socket.AF_INET, "127.0.0.1", 1)
    try:
        with ProbeSet(["tcp_rtt"], host=NoEbpf()) as probes:
            (decision,) = probes.decisions
            assert decision.running == ("tcp_info",) and decision.lost_signals == ()
            assert "bcc: Python module not importable" in decision.missing[0]
            (h,) = probes.collect()
            check_shape(h)
            assert h.count >= 2  # our pair at least
    finally:
        for s in keep:
            s.close()


# -- what both sources hand over -------------------------------------------------------------------------------

def check_shape(h):
    """The histogram the exporter takes: one node-wide series, scale 0, no zero bucket (an RTT is never 0), the
    exact mean within its buckets, and an OTLP exponential histogram in seconds once built."""
    assert isinstance(h, HistogramSample) and h.name == SIGNAL and h.attributes == {}
    assert h.scale == 0 and h.zero_count == 0 and h.count == sum(h.positive_bucket_counts) > 0
    assert h.positive_bucket_counts[0] and h.positive_bucket_counts[-1]
    assert h.bucket_bounds(0)[0] <= h.mean <= h.bucket_bounds(len(h.positive_bucket_counts) - 1)[1]
    assert h.start_time_unix_nano < h.time_unix_nano
    data = MetricsBuilder(Resource.create({"host.name": "test"}), "delta").build([h])
    (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
    assert metric.name == SIGNAL and metric.unit == "s" and isinstance(metric.data, ExponentialHistogram)
    (point,) = metric.data.data_points
    assert (point.scale, point.count, point.positive.offset) == (0, h.count, h.positive_offset)
    assert list(point.positive.bucket_counts) == h.positive_bucket_counts


def in_buckets(h: HistogramSample, top: int, bottom: int | None = None) -> int:
    """How many samples lie in the buckets of index bottom..top (scale 0)."""
    return sum(c for j, c in enumerate(h.positive_bucket_counts)
               if (bottom is None or h.positive_offset + j >= bottom) and h.positive_offset + j <= top)


def loopback_pairs(family: int, host: str, pairs: int, exchanges: int = 20) -> list[socket.socket]:
    """`pairs` established connections over loopback that have exchanged data; the caller closes them."""
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(pairs)
    keep = []
    try:
        for _ in range(pairs):
            client = socket.create_connection(listener.getsockname()[:2])
            accepted, _ = listener.accept()
            keep += [client, accepted]
            for _ in range(exchanges):
                client.sendall(b"q" * 100)
                accepted.recv(100)
                accepted.sendall(b"a")
                client.recv(1)
    finally:
        listener.close()
    return keep


# -- the eBPF probe over loopback ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rtt_probe():
    availability = TcpRttProbe().check()
    need(availability.ok, availability.explain())
    probe = TcpRttProbe()
    probe.start()
    yield probe
    probe.stop()


@pytest.mark.privileged
def test_ebpf_probe_sees_each_received_segment_of_loopback_traffic(rtt_probe):
    rtt_probe.collect()
    keep = loopback_pairs(socket.AF_INET, "127.0.0.1", 1, exchanges=200)
    for s in keep:
        s.close()
    (h,) = rtt_probe.collect()
    check_shape(h)
    # each side received 200 segments (and the handshake's last ACK); other traffic on the node may add more
    assert h.count >= 400
    assert in_buckets(h, -8) >= 400  # loopback round trips: far below 4 ms, whatever the machine's load


# -- the fallback in a namespace of its own: exactly the connections opened there ------------------------------

def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns():
    need(os.geteuid() == 0 and shutil.which("ip") is not None, "creating a network namespace needs root and ip(8)")
    name = f"sloscope-rtt-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def read_in_namespace(netns: str, *args: str) -> dict:
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "tests.probes.test_tcp_rtt", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def loopback_reading() -> dict:
    """In a namespace of its own: 3 IPv4 and 1 IPv6 connections (8 sockets), read by the probe, by both dump
    methods, and with a cap below their number (twice: a dump cut short leaves the next read working)."""
    keep = loopback_pairs(socket.AF_INET, "127.0.0.1", 3) + loopback_pairs(socket.AF_INET6, "::1", 1)
    result = {}
    with TcpInfoProbe() as probe:
        result["samples"] = [s.to_dict() for s in probe.collect()]
        result["notes"] = list(probe.notes)
    for one_walk in (True, False):
        diag = SockDiag(one_walk)
        result[f"one_walk={one_walk}"] = [len(diag.established_rtts(100)[0]), diag.established_rtts(5)[1],
                                          diag.established_rtts(8)[1]]
        diag.close()
    with TcpInfoProbe(max_connections=3) as capped:
        first = capped.collect()
        capped._due_ns = 0  # the next read now, not after the probe's 10 s period
        second = capped.collect()
        result["capped"] = [first[0].count, second[0].count, list(capped.notes)]
    for s in keep:
        s.close()
    return result


@pytest.mark.privileged
def test_fallback_reads_one_rtt_per_connection_in_a_namespace(netns):
    result = read_in_namespace(netns, "loopback")
    (sample,) = result["samples"]
    h = HistogramSample(**{k: v for k, v in sample.items() if k != "kind"})
    check_shape(h)
    assert h.count == 8  # each end of each connection, and nothing else lives in the namespace
    assert h.positive_offset + len(h.positive_bucket_counts) - 1 <= -8  # loopback: well under 4 ms
    assert result["notes"][0].startswith("reading through netlink sock_diag")
    # both dump methods see the 8 sockets; a cap of 5 cuts the dump short, a cap of 8 does not
    assert result["one_walk=True"] == result["one_walk=False"] == [8, True, False]
    first, second, notes = result["capped"]
    assert first == second == 3
    assert notes[-1] == ("more than 3 established connections: each read takes the first 3 in the kernel's "
                         "hash-table order")


# -- both, through a path of known delay -------------------------------------------------------------------------

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def tun_in(netns: str, name: str) -> int:
    """A descriptor of tun device `name` of namespace `netns`: the device is looked up in the namespace of the
    process that attaches, so this process enters it first (it stays there: the descriptors keep their own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
    finally:
        os.close(fd)
    tun = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return tun


def delay_line(ns_a: str, ns_b: str, delay_s: float) -> None:
    """Copy every packet between tunA (in ns_a) and tunB (in ns_b), each `delay_s` after it came, until stdin
    closes."""
    a, b = tun_in(ns_a, "tunA"), tun_in(ns_b, "tunB")
    other = {a: b, b: a}
    due: list[tuple[float, int, int, bytes]] = []  # (when, arrival number, descriptor to write, packet)
    arrivals = 0
    selector = selectors.DefaultSelector()
    for fd in (a, b, sys.stdin.fileno()):
        selector.register(fd, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else None
        for key, _ in selector.select(timeout):
            if key.fd == sys.stdin.fileno():
                if not os.read(key.fd, 1):
                    return
                continue
            arrivals += 1
            heapq.heappush(due, (time.monotonic() + delay_s, arrivals, other[key.fd], os.read(key.fd, 65536)))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, fd, packet = heapq.heappop(due)
            os.write(fd, packet)


@pytest.fixture
def delayed_path():
    """Namespaces a (10.232.0.1) and b (10.232.0.2) joined by the delay line; removed whatever happens."""
    need(os.geteuid() == 0 and shutil.which("ip") is not None and os.path.exists("/dev/net/tun"),
         "a delayed path between namespaces needs root, ip(8) and /dev/net/tun")
    a, b = f"slortt{os.getpid()}a", f"slortt{os.getpid()}b"
    line = None
    try:
        for ns, dev, here, there in ((a, "tunA", "10.232.0.1", "10.232.0.2"), (b, "tunB", "10.232.0.2", "10.232.0.1")):
            ip("netns", "add", ns)
            ip("-n", ns, "tuntap", "add", "dev", dev, "mode", "tun")
            ip("-n", ns, "addr", "add", here, "peer", there, "dev", dev)
            for link in (dev, "lo"):
                ip("-n", ns, "link", "set", link, "up")
        line = subprocess.Popen([sys.executable, "-m", "tests.probes.test_tcp_rtt", "delay-line", a, b, str(DELAY_S)],
                                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert line.stdout.readline().strip() == "ready"
        yield a, b
    finally:
        if line:
            line.stdin.close()
            try:
                line.wait(timeout=5)
            except subprocess.TimeoutExpired:
                line.kill()
                line.wait()
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


ECHO_SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.232.0.2", 5002)); s.listen(1); print("ready", flush=True)
c, _ = s.accept()
while (d := c.recv(65536)):
    c.sendall(d)
"""
ECHO_CLIENT = """
import socket, sys
c = socket.create_connection(("10.232.0.2", 5002), timeout=20)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(%d):
    c.sendall(b"x" * 100)
    got = 0
    while got < 100:
        got += len(c.recv(100 - got))
print("done", flush=True)
sys.stdin.read()  # the connection stays open, and established, until the test has read it
""" % EXCHANGES


def read_fallback(netns: str) -> HistogramSample:
    (sample,) = read_in_namespace(netns, "read")
    return HistogramSample(**{k: v for k, v in sample.items() if k != "kind"})


@pytest.mark.privileged
def test_both_sources_put_a_delayed_path_in_the_bucket_of_its_round_trip(rtt_probe, delayed_path):
    a, b = delayed_path
    server = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", ECHO_SERVER],
                              stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert server.stdout.readline().strip() == "ready"
        rtt_probe.collect()
        client = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-c", ECHO_CLIENT],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started = time.monotonic()
        assert client.stdout.readline().strip() == "done"
        took = time.monotonic() - started
        ebpf = rtt_probe.collect()
        client_side, server_side = read_fallback(a), read_fallback(b)
    finally:
        for proc in (client, server):
            if proc:
                proc.kill()
                proc.wait()
    assert took >= EXCHANGES * 2 * DELAY_S  # the path is as slow as it should be
    (h,) = ebpf
    check_shape(h)
    # every segment either end received (EXCHANGES each way at least) read the ~20 ms RTT; the node's other
    # traffic lands elsewhere, or adds to it
    assert in_buckets(h, DELAYED_BUCKET, DELAYED_BUCKET) >= 2 * EXCHANGES
    # the fallback in each namespace: its one connection, in the same bucket, with its own RTT as the sum
    for side in (client_side, server_side):
        check_shape(side)
        assert (side.count, side.positive_offset, side.positive_bucket_counts) == (1, DELAYED_BUCKET, [1])
        assert 2 * DELAY_S <= side.sum <= 2 ** (DELAYED_BUCKET + 1)


def main(argv: list[str]) -> None:
    if argv[0] == "delay-line":
        delay_line(argv[1], argv[2], float(argv[3]))
    elif argv[0] == "loopback":
        print(json.dumps(loopback_reading()))
    elif argv[0] == "read":
        with TcpInfoProbe() as probe:
            print(json.dumps([s.to_dict() for s in probe.collect()]))


if __name__ == "__main__":
    main(sys.argv[1:])
