"""Time to remediation through the real Prometheus and Alertmanager, with the intervals docs/alerts.md recommends
(5 s scrape and evaluation, `sloscope rules --hold 10s`, Alertmanager group_wait 0s).

From the first breaching request to the executed action, for two paths: a node failing half its requests
(SloscopeNodeErrorRatioHigh -> nft_drain_backend, checked in the nftables set) and a tier breaking its latency
SLO (SloscopeLatencyBudgetBurn -> raise_sampling, from the audit). Beside each, measured in the same run, the
time until Prometheus itself reports the alert firing: the difference is what sloscope's webhook and
remediation add. Needs root (nftables in a network namespace), prometheus and prometheus-alertmanager.

    .venv/bin/python benchmarks/time_to_remediate.py [--runs 3] [--interval 5] [--hold 10s]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sloscope.analytics.store import Store  # noqa: E402
from tests.alerting_stack import BACKENDS, AlertingStack  # noqa: E402
from tests.alerts.test_alerting_end_to_end import _traffic  # noqa: E402


def one_run(interval: int, hold: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stack = AlertingStack(Path(tmp), interval_s=interval, hold=hold).start()
        stop, seen = threading.Event(), {}
        try:
            time.sleep(interval * 2)  # Prometheus has scraped the idle server: counters exist before the breach
            started_wall = datetime.now(timezone.utc).replace(tzinfo=None)
            started = time.monotonic()
            threading.Thread(target=_traffic, args=(stack, stop), daemon=True).start()
            deadline = started + 300
            while len(seen) < 3 and time.monotonic() < deadline:
                now = time.monotonic() - started
                firing = stack.firing()
                for name in ("SloscopeNodeErrorRatioHigh", "SloscopeLatencyBudgetBurn"):
                    if name in firing:
                        seen.setdefault(name, now)
                if BACKENDS["gpu-node-3"] not in stack.backends():
                    seen.setdefault("drained", now)
                time.sleep(0.25)
        finally:
            stop.set()
            stack.stop_serve()
            stack.close()
        with Store(stack.db, read_only=True) as store:
            ts = store.scalar("SELECT min(ts) FROM remediation_audit WHERE action = 'raise_sampling' "
                              "AND decision = 'executed'")
        if ts is not None:
            seen["sampling_raised"] = (ts - started_wall).total_seconds()
        return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interval", type=int, default=5, help="Prometheus scrape and evaluation interval (s)")
    parser.add_argument("--hold", default="10s", help="`sloscope rules --hold` (for: of node and physical alerts)")
    args = parser.parse_args()
    runs = []
    for n in range(args.runs):
        runs.append(one_run(args.interval, args.hold))
        print(f"run {n + 1}: " + ", ".join(f"{k} {v:.1f}s" for k, v in sorted(runs[-1].items(), key=lambda i: i[1])),
              file=sys.stderr, flush=True)

    def line(label, key, base):
        values = [r[key] for r in runs if key in r]
        bases = [r[base] for r in runs if base in r]
        if not values:
            return f"{label}: never happened in {len(runs)} runs"
        return (f"{label}: median {statistics.median(values):.1f}s (max {max(values):.1f}s, {len(values)}/{len(runs)} "
                f"runs); Prometheus reported the alert firing at {statistics.median(bases):.1f}s -> sloscope's "
                f"webhook + action add {statistics.median(values) - statistics.median(bases):.1f}s (polled every 0.25 s)")

    print(f"scrape/evaluation every {args.interval}s, hold {args.hold}; from the first breaching request:")
    print(line("node drained (SloscopeNodeErrorRatioHigh -> nft_drain_backend)", "drained",
               "SloscopeNodeErrorRatioHigh"))
    print(line("sampling raised (SloscopeLatencyBudgetBurn -> raise_sampling)", "sampling_raised",
               "SloscopeLatencyBudgetBurn"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
