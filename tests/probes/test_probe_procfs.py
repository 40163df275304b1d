"""procfs parsers against captured files and the live /proc; procfs probes' delta semantics."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sloscope.probes.base import ProbeUnavailable
from sloscope.probes.procfs.diskstats import DiskstatsProbe, parse_diskstats
from sloscope.probes.procfs.netstat import NetstatProbe, parse_netstat
from sloscope.probes.procfs.pressure import PressureProbe, parse_pressure
from sloscope.probes.procfs.schedstat import SchedstatProbe, parse_schedstat
from sloscope.probes.procfs.tcp_connections import TcpConnectionsProbe, parse_proc_net_tcp
from sloscope.probes.procfs.vmstat import parse_vmstat, vmstat_value
from sloscope.probes.sample import Sample
from tests.conftest import need
from sloscope import catalog

DATA = Path(__file__).parents[1] / "data" / "procfs"


def read(name):
    return (DATA / name).read_text()


# -- parsers on captured files ------------------------------------------------------------------------------

def test_pressure_fixture():
    cpu = parse_pressure(read("pressure_cpu"))
    assert set(cpu) == {"some", "full"}
    assert cpu["some"]["total"] == 8780631 and cpu["some"]["avg10"] == 0.83
    io = parse_pressure(read("pressure_io"))
    assert io["some"]["total"] >= io["full"]["total"]


def test_pressure_rejects_garbage():
    with pytest.raises(ValueError):
        parse_pressure("some avg10=1.0 avg60\n")
    with pytest.raises(ValueError):
        parse_pressure("some avg10=1.0\n")


def test_diskstats_fixture():
    stats = parse_diskstats(read("diskstats"))
    assert stats["vda"]["major"] == 254 and stats["vda"]["io_ms"] == 10972
    assert stats["vda"]["reads_completed"] == 109546 and stats["vda"]["flush_ms"] == 126
    assert stats["loop0"]["io_ms"] == 0


def test_diskstats_old_kernel_has_eleven_fields():
    stats = parse_diskstats(read("diskstats_4_14"))
    assert stats["sda"]["io_ms"] == 2100 and stats["sda"]["weighted_io_ms"] == 2400
    assert "discards_completed" not in stats["sda"]
    with pytest.raises(ValueError):
        parse_diskstats("8 0 sda 1 2 3\n")


def test_snmp_and_netstat_by_header_name():
    snmp = parse_netstat(read("snmp"))
    assert snmp["Tcp"]["RetransSegs"] == 0 and snmp["Tcp"]["InSegs"] == 7733 and snmp["Tcp"]["MaxConn"] == -1
    assert snmp["IcmpMsg"] == {"InType3": 1}
    reordered = parse_netstat(read("snmp_reordered"))
    assert reordered["Tcp"]["RetransSegs"] == 1000 and reordered["Tcp"]["InSegs"] == 7733
    assert reordered["Tcp"]["TcpFutureCounter"] == 77
    netstat = parse_netstat(read("netstat"))
    assert netstat["TcpExt"]["TW"] == 12 and "IpExt" in netstat


def test_netstat_rejects_mismatched_lines():
    with pytest.raises(ValueError):
        parse_netstat("Tcp: A B\nTcp: 1\n")
    with pytest.raises(ValueError):
        parse_netstat("Tcp: A B\nUdp: 1 2\n")


def test_schedstat_versions():
    v15 = parse_schedstat(read("schedstat_v15"))
    assert v15.version == 15 and set(v15.cpus) == {0, 1}
    assert v15.run_delay_ns == 6025098780 + 4012345678
    assert v15.cpus[1].timeslices == 1175255
    v17 = parse_schedstat(read("schedstat_v17"))  # domain lines carry a name since v17; cpu lines unchanged
    assert v17.run_delay_ns == 3_500_000_000
    with pytest.raises(ValueError):
        parse_schedstat("version 14\ncpu0 0 0 0 0 0 0 0 0 0\n")


def test_proc_net_tcp_fixture():
    v4 = parse_proc_net_tcp(read("net_tcp"))
    assert v4 == {"established": 6, "fin_wait_2": 1, "time_wait": 2, "close_wait": 1, "listen": 2}
    v6 = parse_proc_net_tcp(read("net_tcp6"))
    assert v6 == {"established": 2, "listen": 1}


def test_vmstat_lookup_agrees_with_the_full_parse():
    for text in (read("vmstat"), Path("/proc/vmstat").read_text(), "pgfault 7"):
        assert all(vmstat_value(text, name) == value for name, value in parse_vmstat(text).items())
    with pytest.raises(KeyError):
        vmstat_value("pgfaults 1\nxpgfault 2\n", "pgfault")
    with pytest.raises(ValueError):
        vmstat_value("pgfault 1 2\n", "pgfault")


# -- parsers on the live /proc ------------------------------------------------------------------------------

def test_live_proc_parses():
    snmp = parse_netstat(Path("/proc/net/snmp").read_text())
    assert snmp["Tcp"]["RetransSegs"] >= 0 and snmp["Tcp"]["InSegs"] >= 0
    assert "TcpExt" in parse_netstat(Path("/proc/net/netstat").read_text())
    disks = parse_diskstats(Path("/proc/diskstats").read_text())
    assert disks and all("io_ms" in d for d in disks.values())
    assert sum(parse_proc_net_tcp(Path("/proc/net/tcp").read_text()).values()) >= 0
    if Path("/proc/pressure/cpu").exists():
        assert parse_pressure(Path("/proc/pressure/cpu").read_text())["some"]["total"] >= 0
    if Path("/proc/schedstat").exists():
        assert parse_schedstat(Path("/proc/schedstat").read_text()).cpus


def test_live_tcp_connections_sees_a_listener_and_a_connection():
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        probe = TcpConnectionsProbe()
        probe.start()
        samples = {s.attributes["network.connection.state"]: s for s in probe.collect()}
        probe.stop()
        assert samples["listen"].value >= 1 and samples["established"].value >= 2
        assert all(s.kind == "gauge" and s.attributes["network.transport"] == "tcp" for s in samples.values())
        assert "time_wait" in samples  # every state is reported, zero or not
    finally:
        for s in (cli, acc, srv):
            s.close()


def test_live_pressure_probe_counts_cpu_stall():
    probe = PressureProbe()
    need(probe.check().ok, probe.check().explain())  # a kernel without PSI; the check's wording is tested below
    hog = "import time\nt = time.monotonic() + 0.5\nwhile time.monotonic() < t: pass"
    with probe:
        hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(os.cpu_count() + 2)]
        try:
            for h in hogs:
                h.wait(timeout=20)
        finally:
            for h in hogs:
                h.kill()
        samples = probe.collect()
    stall = {(s.attributes["pressure.resource"], s.attributes["pressure.kind"]): s.value for s in samples}
    assert {("cpu", "some"), ("io", "some"), ("memory", "some")} <= set(stall)
    assert stall[("cpu", "some")] > 0.01  # more runnable processes than CPUs for half a second


# -- probes over a fake /proc: exact deltas -----------------------------------------------------------------

@pytest.fixture
def fake_proc(tmp_path):
    (tmp_path / "pressure").mkdir()
    for r in ("cpu", "io", "memory"):
        shutil.copy(DATA / f"pressure_{r}", tmp_path / "pressure" / r)
    (tmp_path / "net").mkdir()
    shutil.copy(DATA / "snmp", tmp_path / "net" / "snmp")
    shutil.copy(DATA / "netstat", tmp_path / "net" / "netstat")
    shutil.copy(DATA / "net_tcp", tmp_path / "net" / "tcp")
    shutil.copy(DATA / "diskstats", tmp_path / "diskstats")
    shutil.copy(DATA / "schedstat_v15", tmp_path / "schedstat")
    return tmp_path


def bump(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_counter_probes_report_deltas_since_last_collect(fake_proc):
    pressure, disks = PressureProbe(proc=str(fake_proc)), DiskstatsProbe(proc=str(fake_proc), sysfs="/nonexistent")
    net, sched = NetstatProbe(proc=str(fake_proc)), SchedstatProbe(proc=str(fake_proc))
    for p in (pressure, disks, net, sched):
        p.start()
    bump(fake_proc / "pressure" / "cpu", "total=8780631", "total=9280631")  # +0.5 s
    bump(fake_proc / "diskstats", " 0 10972 67127", " 0 12472 67127")  # vda io_ms +1500 ms
    bump(fake_proc / "net" / "snmp", "7733 4550 0 0", "7733 4550 7 0")  # RetransSegs 0 -> 7
    bump(fake_proc / "schedstat", "6025098780", "6275098780")  # +0.25 s on cpu0

    cpu_some = [s for s in pressure.collect() if s.attributes == {"pressure.resource": "cpu", "pressure.kind": "some"}]
    assert cpu_some[0].value == pytest.approx(0.5)
    vda = [s for s in disks.collect() if s.attributes["system.device"] == "vda"]
    assert vda[0].value == pytest.approx(1.5) and vda[0].name == "system.disk.io_time"
    assert {s.attributes["system.device"] for s in disks.collect()} == {"vda"}  # unused loop/zram left out
    (retrans,) = net.collect()
    assert (retrans.name, retrans.value, retrans.kind) == ("sloscope.tcp.retransmits", 7.0, "counter_delta")
    (delay,) = sched.collect()
    assert delay.name == "sloscope.cpu.runqueue.delay" and delay.value == pytest.approx(0.25)

    # the next collect sees nothing new
    assert net.collect()[0].value == 0.0
    assert all(s.value == 0.0 for s in pressure.collect())
    # a counter going backwards is a reset, not a negative delta
    bump(fake_proc / "net" / "snmp", "7733 4550 7 0", "7733 4550 2 0")
    assert net.collect()[0].value == 0.0


def test_delta_intervals_are_contiguous(fake_proc):
    probe = NetstatProbe(proc=str(fake_proc))
    probe.start()
    a, b = probe.collect()[0], probe.collect()[0]
    assert a.start_time_unix_nano < a.time_unix_nano == b.start_time_unix_nano < b.time_unix_nano


def test_every_procfs_sample_is_a_catalog_signal(fake_proc):
    for cls in (PressureProbe, DiskstatsProbe, NetstatProbe, SchedstatProbe, TcpConnectionsProbe):
        probe = cls(proc=str(fake_proc))
        with probe:
            for s in probe.collect():
                assert isinstance(s, Sample)
                sig = catalog.signal(s.name)
                assert set(s.attributes) <= set(sig.attributes)
                assert s.kind == ("gauge" if sig.instrument == catalog.Instrument.GAUGE else "counter_delta")


def test_missing_files_are_named(tmp_path):
    probe = SchedstatProbe(proc=str(tmp_path))
    availability = probe.check()
    assert not availability.ok
    assert availability.missing == (f"{tmp_path}/schedstat: not found (kernel built without CONFIG_SCHEDSTATS)",)
    with pytest.raises(ProbeUnavailable) as err:
        probe.start()
    assert "CONFIG_SCHEDSTATS" in str(err.value) and not probe.running
    assert "CONFIG_PSI" in PressureProbe(proc=str(tmp_path)).check().missing[0]
