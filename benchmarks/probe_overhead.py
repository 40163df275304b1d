"""Syscall-probe overhead against bcc's `syscount-bpfcc -L`, on the same loops in the same run.

    sudo .venv/bin/python benchmarks/probe_overhead.py [--seconds 1] [--rounds 5]

Each round measures every loop with nothing attached, then with `syscount-bpfcc -L` (per-syscall latency
totals, every process), then with sloscope's syscall probe tracing every process, then with a pid filter that
excludes the loop (what a filtered-out process pays). Added ns per syscall = 1/with - 1/without, against the
same round's bare run; the figures are medians over rounds with the spread (min..max) beside them, and the
ratio of sloscope's added ns to syscount's (target <= 1.0 with every process traced). Rates are syscalls per
CPU second of the loop's own process (the programs run in its context), so that other load on the machine
stretches the wall clock without moving the figures much.

Loops: `dd bs=1` (C: one read and one write per byte, the worst case for per-syscall cost), a Python loop of
os.read/os.write (an application doing some work between syscalls), and a Python loop of getppid, a syscall
the probe does not trace (what every other syscall pays while it is attached).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sloscope.probes.ebpf.syscall_latency import SyscallLatencyProbe  # noqa: E402

SYSCOUNT = "syscount-bpfcc"


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dd_loop(seconds: float) -> float:
    """syscalls per CPU second of dd copying byte by byte (each byte: one read, one write)."""
    count = 200_000
    while True:
        cpu = children_cpu_seconds()
        subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={count}"], check=True,
                       capture_output=True)
        cpu = children_cpu_seconds() - cpu
        if cpu >= seconds * 0.5:
            return 2 * count / cpu
        count *= 2


def python_loop(seconds: float) -> float:
    zero, null = os.open("/dev/zero", os.O_RDONLY), os.open("/dev/null", os.O_WRONLY)
    read, write = os.read, os.write
    n = 0
    deadline = time.perf_counter() + seconds
    t = time.thread_time()
    try:
        while time.perf_counter() < deadline:
            for _ in range(1000):
                read(zero, 1)
                write(null, b"x")
            n += 2000
    finally:
        os.close(zero)
        os.close(null)
    return n / (time.thread_time() - t)


def untraced_loop(seconds: float) -> float:
    getppid = os.getppid
    n = 0
    deadline = time.perf_counter() + seconds
    t = time.thread_time()
    while time.perf_counter() < deadline:
        for _ in range(2000):
            getppid()
        n += 2000
    return n / (time.thread_time() - t)


LOOPS = {"dd bs=1 (C loop)": dd_loop, "python os.read/os.write": python_loop,
         "python getppid (untraced)": untraced_loop}


class Syscount:
    """`syscount-bpfcc -L` as a process: attached once it says it is tracing, detached by SIGINT."""

    def __enter__(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([SYSCOUNT, "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("Tracing"):
            self.proc.kill()
            raise RuntimeError(f"{SYSCOUNT} did not start: {line.strip()}")
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        self.proc.communicate(timeout=30)
        return False


class Bare:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


CONFIGS = {
    "nothing attached": Bare,
    f"{SYSCOUNT} -L": Syscount,
    "sloscope, all processes": SyscallLatencyProbe,
    "sloscope, loop filtered out": lambda: SyscallLatencyProbe(pids=[1]),
}


def measure(seconds: float, rounds: int) -> dict[str, dict[str, list[float]]]:
    """config -> loop -> added ns per syscall, one figure per round (the bare config: its syscalls/s)."""
    added: dict[str, dict[str, list[float]]] = {c: {loop: [] for loop in LOOPS} for c in CONFIGS}
    for _ in range(rounds):
        bare = {}
        for config, make in CONFIGS.items():
            with make():
                rates = {loop: run(seconds) for loop, run in LOOPS.items()}
            for loop, rate in rates.items():
                if config == "nothing attached":
                    bare[loop] = rate
                    added[config][loop].append(rate)
                else:
                    added[config][loop].append((1 / rate - 1 / bare[loop]) * 1e9)
    return added


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.0f} ({min(values):.0f}..{max(values):.0f})"


def report(added: dict[str, dict[str, list[float]]]) -> None:
    print(f"{'configuration':<30} {'loop':<27} {'added ns/syscall, median (min..max)':>36}")
    for loop in LOOPS:
        print(f"{'nothing attached':<30} {loop:<27} {statistics.median(added['nothing attached'][loop]):>14,.0f}"
              " syscalls/s")
        for config in list(CONFIGS)[1:]:
            print(f"{config:<30} {loop:<27} {spread(added[config][loop]):>36}")
    base = f"{SYSCOUNT} -L"
    for config in list(CONFIGS)[2:]:
        for loop in LOOPS:
            ours, theirs = added[config][loop], added[base][loop]
            if statistics.median(theirs) <= 0:
                continue
            per_round = [o / t for o, t in zip(ours, theirs) if t > 0]
            print(f"ratio to {base}: {config:<28} {loop:<27} {statistics.median(ours) / statistics.median(theirs):6.2f}"
                  f"  (per round {min(per_round):.2f}..{max(per_round):.2f})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians and spread over them (default 5)")
    args = parser.parse_args(argv)

    availability = SyscallLatencyProbe().check()
    if not availability.ok:
        print("cannot measure: " + availability.explain(), file=sys.stderr)
        return 1
    if shutil.which(SYSCOUNT) is None:
        print(f"cannot measure: {SYSCOUNT} not found (Debian package bpfcc-tools)", file=sys.stderr)
        return 1
    print(f"syscall probe overhead ({os.cpu_count()} CPUs, kernel {os.uname().release}, "
          f"{args.rounds} rounds x {args.seconds:g} s per loop)")
    report(measure(args.seconds, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
