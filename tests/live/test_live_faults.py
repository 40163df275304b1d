"""Live fault injection end to end: `sloscope serve`, `sloscope collect` with the kernel's eBPF probes, an
instrumented service under two-tier load, and real faults (CPU contention with stress-ng, disk contention with
fio, packet loss with nftables in the backend's network namespace) one at a time. Each fault must be found as
an incident on the node and attributed to its cause first; afterwards nothing the run started may be left:
no process, no namespace, no nftables rule, no fault file.

A shortened schedule of `sloscope demo --live` (30 s faults, 45 s baselines): about six and a half minutes."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sloscope.live import faults
from sloscope.live.run import LiveConfig, LiveDemo, unavailable
from tests.conftest import need

pytestmark = [pytest.mark.slow, pytest.mark.privileged]


def _require_live():
    need(os.geteuid() == 0, "the live demo needs root (eBPF probes, network namespaces, nftables)")
    why = unavailable()
    need(not why, "; ".join(why))


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def _ruleset(netns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "ruleset"], capture_output=True,
                          text=True).stdout


def _assert_nothing_left(workdir, netns: str, host_if: str):
    assert not _processes_mentioning(str(workdir)), _processes_mentioning(str(workdir))
    assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", host_if], capture_output=True).returncode != 0
    assert not (workdir / "fio").exists()


def test_cpu_disk_and_packet_loss_are_found_and_attributed(tmp_path):
    _require_live()
    workdir = tmp_path / "live"
    cfg = LiveConfig(dir=workdir, faults=("cpu", "disk", "network"), warmup_s=75, fault_s=30, recovery_s=65,
                     baseline_s=45, lookback_s=15)
    live = LiveDemo(cfg, out=sys.stderr)
    report = live.run()
    _assert_nothing_left(workdir, live.network.netns, live.network.host_if)
    summary = [(f["fault"], f["found"], f["top_cause"], f["causes"]) for f in report["faults"]]
    assert [f["fault"] for f in report["faults"]] == ["cpu", "disk", "network"], summary
    for fault in report["faults"]:
        assert fault["found"], f"{fault['fault']}: no incident on the node during the fault; {summary}"
        assert fault["node"] == cfg.node and fault["tier"] in ("p99-latency-critical", "standard")
        assert fault["top_cause"] == fault["cause"], f"{fault['fault']}: {fault['causes']}; {summary}"
        assert fault["p99_during_ms"] > fault["p99_before_ms"], summary
    assert report["ok"]
    assert 0 < report["collector_cpu_share"]["after_start"] < 0.5


def test_ctrl_c_during_a_fault_stops_everything(tmp_path):
    _require_live()
    workdir = tmp_path / "live"
    demo = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "demo", "--live", "--dir", str(workdir),
                             "--faults", "network", "--warmup-seconds", "5", "--fault-seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("==> fault network"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        netns = next(line.split("namespace ")[1].split()[0] for line in lines if "network namespace" in line)
        deadline = time.monotonic() + 20
        while faults.NFT_TABLE not in _ruleset(netns):  # the fault is on
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=120)
        lines.append(out)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, "".join(lines)
    _assert_nothing_left(workdir, netns, "slh" + netns.rsplit("-", 1)[1][-8:])
