"""GPU check: sloscope's two GPU paths against a real NVIDIA GPU, idle and under co-tenants.

    .venv/bin/python benchmarks/gpu_check.py [--seconds 4] [--interval 0.5] [--gpu 0] [--dcgm-url URL]

Paths: NVML (nvidia-ml-py against the driver) and dcgm-exporter (--dcgm-url, default
http://127.0.0.1:9400/metrics), each where it can be reached. Windows: idle; one small kernel (a co-tenant
process spinning a single-block kernel, torch.cuda._sleep, in a loop); a saturating co-tenant (an fp16
8192x8192 matmul loop). The co-tenant windows need torch with CUDA; without it they are skipped, and the
script says so.

For each path, window and GPU it prints both SM signals: `sloscope.gpu.kernel.busy.max` (the peak over the
window's collects of NVML's utilization samples: the share of time a kernel ran) and `sloscope.gpu.sm.active`
(the mean of DCGM's SM_ACTIVE: the share of SMs with a warp), each "-" on the path that does not have it
(NVML has no SM-share field; dcgm-exporter no per-window kernel-busy samples), with the mean of
`hw.gpu.utilization`, which both paths have. One small kernel should read about 1.0 kernel-busy and about
1/(number of SMs) SM active; the matmul about 1.0 on both.

Without an NVIDIA GPU, driver or exporter it prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import select
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sloscope.probes.base import ProbeError, ProbeUnavailable  # noqa: E402
from sloscope.probes.gpu.dcgm_exporter import DEFAULT_URL, DcgmExporterProbe  # noqa: E402
from sloscope.probes.gpu.nvml import NvmlProbe  # noqa: E402

KERNEL_BUSY = "sloscope.gpu.kernel.busy.max"
SM_ACTIVE = "sloscope.gpu.sm.active"
UTILIZATION = "hw.gpu.utilization"

CO_TENANT = r"""
import sys, time
import torch
dev = torch.device(f"cuda:{int(sys.argv[1])}")
seconds, kind = float(sys.argv[2]), sys.argv[3]
a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
c = a @ a
torch.cuda.synchronize(dev)
print("ready", flush=True)
end = time.monotonic() + seconds
with torch.cuda.device(dev):
    while time.monotonic() < end:
        for _ in range(20):
            if kind == "small":
                torch.cuda._sleep(1_000_000)  # one block spinning: the GPU is busy, one SM of many has work
            else:
                c = a @ a
        torch.cuda.synchronize(dev)
"""
WINDOWS = (("idle", None), ("one small kernel", "small"), ("saturating co-tenant (fp16 matmul)", "matmul"))


def reachable_paths(dcgm_url: str) -> tuple[dict, list[str]]:
    """(path name -> started probe, why each other path is not reachable)."""
    paths, problems = {}, []
    for name, probe in (("nvml", NvmlProbe(per_process=True)), ("dcgm", DcgmExporterProbe(url=dcgm_url))):
        missing = probe.check().missing
        if not missing:
            try:
                probe.start()
            except ProbeUnavailable as exc:
                missing = exc.missing
        if missing:
            problems.append(f"{name}: {'; '.join(missing)}")
        else:
            paths[name] = probe
    return paths, problems


def measure(paths: dict, seconds: float, interval: float) -> dict[str, dict[str, dict]]:
    """Collect every path every `interval` for `seconds`: path -> GPU -> signal -> values."""
    for probe in paths.values():
        probe.collect()  # close the window that was open before this one
    per: dict[str, dict[str, dict]] = {name: {} for name in paths}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        for name, probe in paths.items():
            for s in probe.collect():
                if s.name in (KERNEL_BUSY, SM_ACTIVE, UTILIZATION) and "process.pid" not in s.attributes:
                    gpu = per[name].setdefault(s.attributes["hw.id"], {KERNEL_BUSY: [], SM_ACTIVE: [], UTILIZATION: []})
                    gpu[s.name].append(s.value)
    return per


def _show(values: list[float], how) -> str:
    return f"{how(values):.3f}" if values else "-"


def report(title: str, per: dict[str, dict[str, dict]]) -> None:
    print(f"\n{title}")
    print(f"  {'path':<5} {'GPU':<42} {'kernel.busy.max':>15} {'sm.active':>9} {'utilization':>11} {'collects':>8}")
    for path, gpus in per.items():
        for uuid, g in sorted(gpus.items()):
            mean = lambda v: sum(v) / len(v)  # noqa: E731
            print(f"  {path:<5} {uuid:<42} {_show(g[KERNEL_BUSY], max):>15} {_show(g[SM_ACTIVE], mean):>9} "
                  f"{_show(g[UTILIZATION], mean):>11} {len(g[UTILIZATION]):>8}")


def torch_cuda_problem() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    check = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"],
                           capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        last = check.stderr.strip().splitlines()[-1:] or [""]
        return "torch cannot use CUDA here" + (f" ({last[0]})" if last[0] else "")
    return None


def co_tenant_window(paths: dict, args, title: str, kind: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CO_TENANT, str(args.gpu), str(args.seconds + 30), kind],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = select.select([child.stdout], [], [], 180)[0]  # CUDA start-up, bounded
        if not started or child.stdout.readline().strip() != "ready":
            print(f"\n{title}: skipped, the co-tenant did not start: {child.stderr.read()[-500:]}")
            return
        report(f"{title} ({args.seconds:g} s on cuda:{args.gpu}, pid {child.pid})",
               measure(paths, args.seconds, args.interval))
    finally:
        child.kill()
        child.wait(timeout=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each window (default 4)")
    ap.add_argument("--interval", type=float, default=0.5, help="collect every S seconds (default 0.5)")
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device the co-tenants load (default 0)")
    ap.add_argument("--dcgm-url", default=DEFAULT_URL, help=f"dcgm-exporter's endpoint (default {DEFAULT_URL})")
    args = ap.parse_args(argv)

    paths, problems = reachable_paths(args.dcgm_url)
    if not paths:
        print(f"gpu_check: no NVIDIA GPU path to check here ({' | '.join(problems)}); nothing measured")
        return 0
    try:
        print(f"gpu_check: paths {', '.join(paths)}" + "".join(f"; not reachable: {p}" for p in problems))
        problem = torch_cuda_problem()
        for title, kind in WINDOWS:
            if kind is None:
                report(f"{title} ({args.seconds:g} s)", measure(paths, args.seconds, args.interval))
            elif problem:
                print(f"\n{title}: skipped: {problem} (the co-tenant needs torch with CUDA)")
            else:
                co_tenant_window(paths, args, title, kind)
        for name, probe in paths.items():
            for note in probe.notes:
                print(f"note ({name}): {note}")
    except ProbeError as exc:
        print(f"gpu_check: collecting failed: {exc}")
        return 1
    finally:
        for probe in paths.values():
            probe.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
