"""Syscall-probe overhead: a syscall-heavy loop's throughput with the eBPF syscall-latency probe attached,
against the same loop without it, measured in the same run (rounds alternate off/on; medians compared).

    sudo .venv/bin/python benchmarks/probe_overhead.py [--seconds 1] [--rounds 3]

Two loops: `dd bs=1` (C: one read and one write per byte, the worst case for per-syscall cost) and a Python
loop of os.read/os.write (closer to an application doing real work between syscalls). Two probe
configurations: tracing every process, and a pid filter that excludes the loop (the cost a filtered-out
process pays: the enter program's lookup only). Prints throughput, the ratio with/without, and the added
nanoseconds per syscall.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.base import ProbeUnavailable  # noqa: E402
from probes.ebpf.syscall_latency import SyscallLatencyProbe  # noqa: E402


def dd_loop(seconds: float) -> float:
    """syscalls per second of dd copying byte by byte (each byte: one read, one write)."""
    count = 200_000
    while True:
        t = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "bs=1", f"count={count}"], check=True,
                       capture_output=True)
        elapsed = time.perf_counter() - t
        if elapsed >= seconds * 0.5:
            return 2 * count / elapsed
        count *= 2


def python_loop(seconds: float) -> float:
    zero, null = os.open("/dev/zero", os.O_RDONLY), os.open("/dev/null", os.O_WRONLY)
    read, write = os.read, os.write
    n = 0
    deadline = time.perf_counter() + seconds
    t = time.perf_counter()
    try:
        while time.perf_counter() < deadline:
            for _ in range(1000):
                read(zero, 1)
                write(null, b"x")
            n += 2000
    finally:
        os.close(zero)
        os.close(null)
    return n / (time.perf_counter() - t)


LOOPS = {"dd bs=1 (C loop)": dd_loop, "python os.read/os.write": python_loop}


def measure(make_probe, seconds: float, rounds: int) -> dict[str, tuple[float, float]]:
    """loop name -> (median syscalls/s without the probe, with it)."""
    off = {name: [] for name in LOOPS}
    on = {name: [] for name in LOOPS}
    for _ in range(rounds):
        for name, loop in LOOPS.items():
            off[name].append(loop(seconds))
        probe = make_probe()
        probe.start()
        try:
            for name, loop in LOOPS.items():
                on[name].append(loop(seconds))
            probe.collect()
        finally:
            probe.stop()
    return {name: (statistics.median(off[name]), statistics.median(on[name])) for name in LOOPS}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="off/on rounds; medians are compared (default 3)")
    args = parser.parse_args(argv)

    availability = SyscallLatencyProbe().check()
    if not availability.ok:
        print("cannot measure: " + availability.explain(), file=sys.stderr)
        return 1
    configs = {
        "all processes traced": lambda: SyscallLatencyProbe(),
        "loop filtered out (pid filter)": lambda: SyscallLatencyProbe(pids=[1]),
    }
    print(f"syscall probe overhead ({os.cpu_count()} CPUs, kernel {os.uname().release}, "
          f"{args.rounds} rounds x {args.seconds:g} s, medians)")
    print(f"{'probe':<32} {'loop':<26} {'without /s':>12} {'with /s':>12} {'ratio':>7} {'+ns/syscall':>12}")
    try:
        for config, make in configs.items():
            for loop, (without, with_) in measure(make, args.seconds, args.rounds).items():
                added_ns = (1 / with_ - 1 / without) * 1e9
                print(f"{config:<32} {loop:<26} {without:>12,.0f} {with_:>12,.0f} {with_ / without:>7.3f} "
                      f"{added_ns:>12.0f}", flush=True)
    except ProbeUnavailable as exc:
        print(f"cannot measure: {exc}", file=sys.stderr)
        return 1
    print("ratio = throughput with the probe / without it (1.0 = no overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
