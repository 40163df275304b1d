"""Memory and CPU of `sloscope collect` at steady state, beside baselines measured in the same run.

    sudo .venv/bin/python benchmarks/collector_footprint.py [--seconds 20] [--repeats 3]

Against `sloscope serve` on 127.0.0.1 (OTLP/gRPC), at a 1 s interval, three processes, each run --repeats times:
- a bare interpreter importing what the collector imports (the floor no probe choice can go below);
- the collector with the procfs probes only (what the eBPF probes add is the difference to the next);
- the collector with every local probe (`--probe auto`: eBPF where privileged, GPU and SPDK where present).
Steady state starts once the collector has no child process left (the eBPF programs compile in children) and
its descriptors stopped changing. Prints RSS (median and max over the window), CPU share of one core, the
spread over repeats, and each RSS as a ratio to the bare interpreter's. Targets: under 200 MiB and 1 % CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCFS_PROBES = ("pressure", "diskstats", "netstat", "schedstat", "tcp_connections", "vmstat")
IMPORTS = ("import sloscope.collectors.agent, sloscope.probes.registry, sloscope.commands.cli; "
           "from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter; "
           "import signal; signal.pause()")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def has_children(pid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    return True
            except (OSError, IndexError):
                continue
    return False


def wait_steady(proc: subprocess.Popen, limit_s: float = 120) -> None:
    """Until the process has no children and the same descriptors for 3 s (start-up and compiles done)."""
    deadline, stable_since, last = time.monotonic() + limit_s, None, None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with status {proc.returncode} during start-up")
        fds = sorted(os.listdir(f"/proc/{proc.pid}/fd"))
        if has_children(proc.pid) or fds != last:
            stable_since, last = time.monotonic(), fds
        elif time.monotonic() - stable_since >= 3:
            return
        time.sleep(0.5)
    raise RuntimeError(f"no steady state within {limit_s:g} s")


def measure(argv: list[str], seconds: int) -> tuple[float, float, float]:
    """(median RSS MiB, max RSS MiB, CPU share) of a process over `seconds` of steady state."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_steady(proc)
        cpu0, t0, rss = cpu_seconds(proc.pid), time.monotonic(), []
        for _ in range(seconds):
            time.sleep(1)
            rss.append(rss_mib(proc.pid))
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        return statistics.median(rss), max(rss), cpu
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def collect_argv(port: int, spool: Path, probes: tuple[str, ...]) -> list[str]:
    argv = [sys.executable, "-m", "sloscope.commands.cli", "collect", "--endpoint", f"http://127.0.0.1:{port}",
            "--interval", "1", "--spool-dir", str(spool)]
    for p in probes:
        argv += ["--probe", p]
    return argv


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=20, help="steady-state window per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per process (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sloscope-footprint-") as tmp:
        work = Path(tmp)
        port = free_port()
        serve = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db",
                                  str(work / "c.duckdb"), "--grpc", f"127.0.0.1:{port}", "--http", "off"], cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)
            runs = {
                "bare python, the collector's imports": [sys.executable, "-c", IMPORTS],
                "collect, procfs probes only": collect_argv(port, work / "spool-procfs", PROCFS_PROBES),
                "collect --probe auto (every local probe)": collect_argv(port, work / "spool-auto", ("auto",)),
            }
            results = {name: [measure(cmd, args.seconds) for _ in range(args.repeats)] for name, cmd in runs.items()}
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
    report(results, args)
    return 0


def report(results: dict[str, list[tuple[float, float, float]]], args) -> None:
    print(f"collector footprint ({os.cpu_count()} CPUs, interval 1 s, {args.repeats} runs x {args.seconds} s "
          "steady state; medians over runs, min..max beside)")
    print(f"{'process':<42} {'RSS MiB':>18} {'max RSS MiB':>12} {'x bare':>7} {'CPU of one core':>22}")
    bare = statistics.median(r[0] for r in next(iter(results.values())))
    for name, runs in results.items():
        rss, peak, cpu = ([r[i] for r in runs] for i in range(3))
        print(f"{name:<42} {statistics.median(rss):>7.0f} ({min(rss):.0f}..{max(rss):.0f}) {max(peak):>12.0f} "
              f"{statistics.median(rss) / bare:>7.2f} {statistics.median(cpu):>9.2%} ({min(cpu):.2%}..{max(cpu):.2%})")


if __name__ == "__main__":
    sys.exit(main())
