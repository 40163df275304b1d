"""Live faults: how fast sloscope finds real faults, what its probes cost, and what the faults did to the service.

Runs `sloscope demo --live` (live/): serve, collect with the kernel's eBPF probes every second, an
instrumented service under two-tier load, and each fault for a fixed time with recovery between. Prints per
fault the time from the fault's start to the incident's start (and to the first /rca poll that reported it),
the top cause and the injected cause's rank, and the service's p99 in the minute before against the fault;
then the CPU share (CPU time / wall time) of the collector, serve and the service.

    .venv/bin/python benchmarks/live_faults.py [--faults cpu,disk,network,memory] [--fault-seconds 45] [--json]

Needs root, eBPF, stress-ng, fio, nftables and iproute2; elsewhere it prints why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sloscope.live.run import FAULT_NAMES, LiveConfig, LiveDemo, unavailable

TARGET_S = 30.0


def main() -> int:
    defaults = LiveConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default=",".join(FAULT_NAMES))
    parser.add_argument("--fault-seconds", type=float, default=defaults.fault_s)
    parser.add_argument("--recovery-seconds", type=float, default=defaults.recovery_s)
    parser.add_argument("--warmup-seconds", type=float, default=defaults.warmup_s)
    parser.add_argument("--dir", type=Path, default=Path("var/bench-live"))
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON instead")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"live_faults: skipped: {'; '.join(why)}")
        return 0
    cfg = LiveConfig(dir=args.dir, faults=tuple(args.faults.split(",")), fault_s=args.fault_seconds,
                     recovery_s=args.recovery_seconds, warmup_s=args.warmup_seconds)
    report = LiveDemo(cfg, out=sys.stderr).run()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"live faults on {report['node']}: {cfg.fault_s:.0f}s each, {cfg.recovery_s:.0f}s recovery, "
          f"{cfg.rate:g} req/s with 10x bursts, rca baseline {cfg.baseline_s:.0f}s")
    print(f"{'fault':8} {'found':5} {'top cause':17} {'rank':>4} {'detect':>7} {'reported':>8} "
          f"{'p99 before':>10} {'p99 during':>10} {'x':>6}")
    for f in report["faults"]:
        x = f["p99_during_ms"] / f["p99_before_ms"] if f["p99_before_ms"] and f["p99_during_ms"] else None
        print(f"{f['fault']:8} {'yes' if f['found'] else 'NO':5} {f['top_cause'] or '-':17} "
              f"{f['true_rank'] or '-':>4} {_s(f['detection_s']):>7} {_s(f['reported_s']):>8} "
              f"{_ms(f['p99_before_ms']):>10} {_ms(f['p99_during_ms']):>10} {f'{x:.1f}x' if x else '-':>6}")
    detected = [f["detection_s"] for f in report["faults"] if f["detection_s"] is not None]
    reported = [f["reported_s"] for f in report["faults"] if f["reported_s"] is not None]
    if detected:
        print(f"detection (incident start - fault start): max {max(detected):.0f}s; first reported by a 5 s /rca "
              f"poll: max {max(reported) if reported else float('nan'):.0f}s; target under {TARGET_S:.0f}s: "
              f"{'met' if max(reported or detected) < TARGET_S else 'NOT met'}")
    for name, share in report["cpu_share"].items():
        print(f"CPU share of {name}: {share.get('after_start', 0):.1%} of one CPU after start-up, "
              f"{share.get('whole_run', 0):.1%} over the whole run")
    print(f"all faults found and attributed: {'yes' if report['ok'] else 'NO'}")
    return 0


def _s(value):
    return f"{value:+.0f}s" if value is not None else "-"


def _ms(value):
    return f"{value:.0f} ms" if value is not None else "-"


if __name__ == "__main__":
    sys.exit(main())
