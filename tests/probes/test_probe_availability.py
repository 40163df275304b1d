"""Without root, BTF, tracefs, tracepoints or kernel headers an eBPF probe says exactly what is missing, and the
node falls back to procfs for that signal without crashing."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sloscope.probes.base import Host, ProbeUnavailable
from sloscope.probes.ebpf.block_io import BlockIoProbe
from sloscope.probes.ebpf.runqueue import RunqueueProbe
from sloscope.probes.ebpf.syscall_latency import SyscallLatencyProbe
from sloscope.probes.ebpf.tcp import TcpProbe
from sloscope.probes.ebpf.tcp_rtt import TcpRttProbe
from sloscope.probes.registry import Decision, ProbeSet
from tests.conftest import need

REPO = Path(__file__).resolve().parents[2]
TRACEFS = "/sys/kernel/tracing"


class FakeHost(Host):
    """A host described by what it has: files (and directories implied by them), euid and capabilities."""

    def __init__(self, *, euid=0, caps=1 << 21, files=(), unreadable=(), bcc_error=None, release="6.18.0-test"):
        self._euid, self._caps, self._files = euid, caps, set(files)
        self._unreadable, self._bcc_error, self._release = set(unreadable), bcc_error, release

    def euid(self):
        return self._euid

    def effective_capabilities(self):
        return self._caps

    def exists(self, path):
        return path in self._files or any(f.startswith(path.rstrip("/") + "/") for f in self._files)

    def accessible(self, path):
        return self.exists(path) and path not in self._unreadable

    def kernel_release(self):
        return self._release

    def bcc_import_error(self):
        return self._bcc_error


def full_host(**kwargs):
    files = {"/sys/kernel/btf/vmlinux", "/lib/modules/6.18.0-test/build/include/linux/kernel.h"}
    for probe in (TcpProbe(host=Host()), BlockIoProbe(host=Host()), RunqueueProbe(host=Host()),
                  SyscallLatencyProbe(host=Host()), TcpRttProbe(host=Host())):
        for tp in probe.tracepoints():
            cat, ev = tp.split(":")
            files.add(f"{TRACEFS}/events/{cat}/{ev}/format")
    files |= set(kwargs.pop("extra_files", ()))
    files -= set(kwargs.pop("without", ()))
    return FakeHost(files=files, **kwargs)


def test_a_complete_host_lacks_nothing():
    for cls in (TcpProbe, BlockIoProbe, RunqueueProbe, SyscallLatencyProbe, TcpRttProbe):
        assert cls(host=full_host()).check().ok, cls


def test_an_empty_unprivileged_host_lists_every_missing_piece():
    host = FakeHost(euid=1000, caps=0, bcc_error="ModuleNotFoundError: No module named 'bcc'")
    missing = TcpProbe(host=host).check().missing
    assert missing == (
        "bcc: Python module not importable (Debian package python3-bpfcc): ModuleNotFoundError: No module named 'bcc'",
        "privilege: loading eBPF needs root (CAP_SYS_ADMIN) or CAP_BPF+CAP_PERFMON; this process (euid 1000) has neither",
        "BTF: /sys/kernel/btf/vmlinux not found (kernel built without CONFIG_DEBUG_INFO_BTF)",
        "kernel headers: /lib/modules/6.18.0-test/build not found and no /sys/kernel/kheaders.tar.xz "
        "(install linux-headers for this kernel, or link /lib/modules/$(uname -r)/build to them)",
        "tracefs: not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing "
        "(mount -t tracefs tracefs /sys/kernel/tracing)",
    )


@pytest.mark.parametrize("take_away,expect", [
    ({"without": {"/sys/kernel/btf/vmlinux"}}, "BTF: /sys/kernel/btf/vmlinux not found"),
    ({"without": {"/lib/modules/6.18.0-test/build/include/linux/kernel.h"}}, "kernel headers: /lib/modules/"),
    ({"without": {f"{TRACEFS}/events/tcp/tcp_retransmit_skb/format"}},
     "tracepoint tcp:tcp_retransmit_skb: not in /sys/kernel/tracing/events (this kernel lacks it)"),
    ({"unreadable": {TRACEFS}, "euid": 1000, "caps": (1 << 38) | (1 << 39)},
     "tracefs: /sys/kernel/tracing is not readable by euid 1000"),
    ({"caps": 0, "euid": 0}, "privilege: loading eBPF needs root"),
])
def test_each_missing_piece_is_named_alone(take_away, expect):
    missing = TcpProbe(host=full_host(**take_away)).check().missing
    assert len(missing) == 1 and missing[0].startswith(expect), missing


def test_cap_bpf_and_perfmon_suffice_without_root():
    assert TcpProbe(host=full_host(euid=1000, caps=(1 << 38) | (1 << 39))).check().ok
    assert not TcpProbe(host=full_host(euid=1000, caps=1 << 39)).check().ok


def test_kheaders_stand_in_for_header_files():
    host = full_host(without={"/lib/modules/6.18.0-test/build/include/linux/kernel.h"},
                     extra_files={"/sys/kernel/kheaders.tar.xz"})
    assert BlockIoProbe(host=host).check().ok


def test_syscall_probe_needs_only_some_of_its_tracepoints():
    gone = {f"{TRACEFS}/events/syscalls/sys_enter_fdatasync/format", f"{TRACEFS}/events/syscalls/sys_exit_fdatasync/format"}
    availability = SyscallLatencyProbe(host=full_host(without=gone)).check()
    assert availability.ok
    assert any("fdatasync" in n for n in availability.notes)
    none_left = {f for f in full_host()._files if "/syscalls/" in f}
    assert not SyscallLatencyProbe(host=full_host(without=none_left)).check().ok


def test_start_raises_with_the_missing_list_and_attaches_nothing():
    probe = RunqueueProbe(host=FakeHost(euid=1000, caps=0))
    with pytest.raises(ProbeUnavailable) as err:
        probe.start()
    assert err.value.probe == "runqueue" and any(m.startswith("privilege:") for m in err.value.missing)
    assert not probe.running
    probe.stop()  # idempotent, harmless


def test_probe_set_falls_back_to_procfs_and_keeps_going():
    host = FakeHost(euid=1000, caps=0)
    with ProbeSet(["syscall", "tcp", "block", "runqueue", "pressure"], host=host) as probes:
        decisions = {d.requested: d for d in probes.decisions}
        assert decisions["tcp"].running == ("netstat",) and decisions["tcp"].fallback
        assert decisions["tcp"].lost_signals == ("sloscope.tcp.state_transitions",)
        assert decisions["block"].running == ("diskstats",)
        assert decisions["block"].lost_signals == ("sloscope.block.io.duration",)
        assert decisions["syscall"].running == () and decisions["syscall"].lost_signals == ("sloscope.syscall.duration",)
        expect_sched = os.path.exists("/proc/schedstat")
        assert decisions["runqueue"].running == (("schedstat",) if expect_sched else ())
        assert decisions["pressure"].missing == ()
        assert "falling back to netstat" in decisions["tcp"].explain()
        assert "privilege" in decisions["tcp"].explain()
        assert decisions["syscall"].explain().endswith("-> no fallback (not produced: sloscope.syscall.duration)")
        names = {s.name for s in probes.collect()}
        assert "sloscope.tcp.retransmits" in names and "system.disk.io_time" in names
        assert ("sloscope.cpu.runqueue.delay" in names) == expect_sched
        health = {s.attributes["probe.name"]: (s.value, s.attributes["probe.running"]) for s in probes.health(1)}
        assert health["tcp"] == (0.0, "netstat") and health["syscall"] == (0.0, "none")
        assert health["pressure"] == (1.0, "pressure")
    assert probes.probes == {}


def test_a_probe_whose_fallback_cannot_run_either_says_so():
    decision = Decision("spdk", running=(), missing=("SPDK socket /var/tmp/spdk.sock: not found",))
    assert decision.explain() == ("spdk: unavailable: SPDK socket /var/tmp/spdk.sock: not found -> its fallback nvme "
                                  "is unavailable too")


def test_probe_set_survives_a_probe_that_breaks_while_collecting():
    with ProbeSet(["pressure", "netstat"], host=FakeHost(euid=1000, caps=0)) as probes:
        probes.probes["netstat"].proc = "/nonexistent"
        samples = probes.collect()
        assert {s.name for s in samples} == {"sloscope.pressure.stall"}
        assert "netstat" in probes.errors
        assert {s.attributes["probe.name"]: s.value for s in probes.health(1)} == {"pressure": 1.0, "netstat": 0.0}


def test_an_unprivileged_process_reports_what_is_missing_and_falls_back(request):
    """The real check, as user nobody: the eBPF probe says why it cannot run, and the procfs fallback still
    produces the signal."""
    need(os.geteuid() == 0, "needs root to switch to user nobody")

    def drop():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    # The checkout may lie where nobody cannot read (a clone under a 0700 directory): run a copy of the two
    # packages the probes need from a directory nobody can.
    readable = Path(tempfile.mkdtemp(prefix="sloscope-nobody-"))
    readable.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(readable, ignore_errors=True))
    for folder, package in (("sloscope", "sloscope"), ("probes", "sloscope/probes")):  # as setup.py maps them
        shutil.copytree(REPO / folder, readable / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(readable)}
    # the probes need only the standard library (and bcc, which they must do without here): any Python the
    # unprivileged user may run will do (a venv under /root is out of its reach)
    def runs_as_nobody(python):
        try:
            return subprocess.run([python, "-c", "import sloscope.probes.cli"], cwd=readable, env=env,
                                  preexec_fn=drop, capture_output=True, timeout=30).returncode == 0
        except OSError:
            return False

    pythons = [p for p in (sys.executable, "/usr/bin/python3") if os.path.exists(p) and runs_as_nobody(p)]
    need(bool(pythons), "no Python interpreter that user nobody can run")
    proc = subprocess.run([pythons[0], "-m", "sloscope.probes.cli", "probe", "tcp", "--duration", "0.3",
                           "--interval", "0.3", "--format", "json"], cwd=readable, env=env, preexec_fn=drop,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    (status,) = [r for r in records if r["record"] == "status"]
    assert status["requested"] == "tcp" and status["running"] == ["netstat"]
    assert any(m.startswith("privilege:") and "euid 65534" in m for m in status["missing"]), status
    assert any(m.startswith("tracefs:") for m in status["missing"]), status
    assert status["lost_signals"] == ["sloscope.tcp.state_transitions"]
    samples = [r for r in records if r["record"] == "sample"]
    assert [s["name"] for s in samples] == ["sloscope.tcp.retransmits"]
    assert samples[0]["kind"] == "counter_delta" and samples[0]["unit"] == "{segment}"
