"""GPU check: the real NVML path (nvidia-ml-py against the driver) on a machine with an NVIDIA GPU.

    .venv/bin/python benchmarks/gpu_check.py [--seconds 4] [--interval 0.5] [--gpu 0]

Two windows per GPU: idle, then while a co-tenant process saturates GPU --gpu with a PyTorch matrix-multiply
loop (when torch with CUDA is importable; otherwise that phase is skipped, and the script says so). For each
window it prints the peak of `sloscope.gpu.sm.active.max` over the window's collects (the maximum of the
driver's utilization samples), the mean of `hw.gpu.utilization`, how many collects produced an SM value,
and memory in use. On a busy GPU the peak should be near 1.0; idle near 0.

Without an NVIDIA GPU or driver it prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import select
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.base import ProbeError, ProbeUnavailable  # noqa: E402
from probes.gpu.nvml import NvmlProbe  # noqa: E402

CO_TENANT = r"""
import sys, time
import torch
dev = torch.device(f"cuda:{int(sys.argv[1])}")
seconds = float(sys.argv[2])
a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
c = a @ b
torch.cuda.synchronize(dev)
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(dev)
print("done", flush=True)
"""


def measure(probe: NvmlProbe, seconds: float, interval: float) -> dict[str, dict]:
    """Collect every `interval` for `seconds`; per GPU: peak SM activity, mean utilization, windows, memory."""
    probe.collect()  # close the window that was open before this phase
    per: dict[str, dict] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        for s in probe.collect():
            g = per.setdefault(s.attributes["hw.id"], {"sm": [], "util": [], "mem": None, "limit": None,
                                                       "procs": {}})
            if "process.pid" in s.attributes:
                g["procs"].setdefault(s.attributes["process.pid"], []).append(s.value)
            elif s.name == "sloscope.gpu.sm.active.max":
                g["sm"].append(s.value)
            elif s.name == "hw.gpu.utilization":
                g["util"].append(s.value)
            elif s.name == "hw.gpu.memory.usage":
                g["mem"] = s.value
            elif s.name == "hw.gpu.memory.limit":
                g["limit"] = s.value
    return per


def report(title: str, per: dict[str, dict]) -> None:
    print(f"\n{title}")
    print(f"  {'GPU':<42} {'sm.active.max':>13} {'utilization':>11} {'SM windows':>10} {'memory used':>16}")
    for uuid, g in sorted(per.items()):
        sm = f"{max(g['sm']):.3f}" if g["sm"] else "-"
        util = f"{sum(g['util']) / len(g['util']):.3f}" if g["util"] else "-"
        mem = f"{g['mem'] / 2**30:.1f}/{g['limit'] / 2**30:.0f} GiB" if g["mem"] is not None and g["limit"] else "-"
        print(f"  {uuid:<42} {sm:>13} {util:>11} {len(g['sm']):>10} {mem:>16}")
        for pid, values in sorted(g["procs"].items()):
            print(f"    process {pid}: mean SM utilization {sum(values) / len(values):.3f} over {len(values)} collects")


def torch_cuda_problem() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    check = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"],
                           capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        last = check.stderr.strip().splitlines()[-1:] or [""]
        return "torch cannot use CUDA here" + (f" ({last[0]})" if last[0] else "")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each window (default 4)")
    ap.add_argument("--interval", type=float, default=0.5, help="collect every S seconds (default 0.5)")
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device the co-tenant loads (default 0)")
    args = ap.parse_args(argv)

    probe = NvmlProbe(per_process=True)
    availability = probe.check()
    if not availability.ok:
        print(f"gpu_check: no NVIDIA GPU to check here ({'; '.join(availability.missing)}); nothing measured")
        return 0
    try:
        probe.start()
    except ProbeUnavailable as exc:
        print(f"gpu_check: no NVIDIA GPU to check here ({'; '.join(exc.missing)}); nothing measured")
        return 0
    try:
        print(f"gpu_check: {len(probe.gpus)} GPU(s): " + ", ".join(f"{g.index}={g.uuid}" for g in probe.gpus))
        report(f"idle window ({args.seconds:g} s)", measure(probe, args.seconds, args.interval))

        problem = torch_cuda_problem()
        if problem:
            print(f"\nco-tenant window skipped: {problem} (the PyTorch matmul loop needs torch with CUDA)")
        else:
            env = dict(os.environ)
            child = subprocess.Popen([sys.executable, "-c", CO_TENANT, str(args.gpu), str(args.seconds + 30)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                started = select.select([child.stdout], [], [], 180)[0]  # CUDA start-up, bounded
                line = child.stdout.readline() if started else ""
                if line.strip() != "ready":
                    print(f"\nco-tenant window skipped: the matmul loop did not start: {child.stderr.read()[-500:]}")
                else:
                    per = measure(probe, args.seconds, args.interval)
                    report(f"co-tenant window ({args.seconds:g} s, fp16 8192x8192 matmul loop on cuda:{args.gpu}, "
                           f"pid {child.pid})", per)
            finally:
                child.kill()
                child.wait(timeout=30)
        if probe.notes:
            print("\nnotes:\n" + "\n".join(f"  {n}" for n in probe.notes))
        if probe.error_counts:
            print(f"NVML errors by feature: {dict(probe.error_counts)}")
    except ProbeError as exc:
        print(f"gpu_check: collecting failed: {exc}")
        return 1
    finally:
        probe.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
