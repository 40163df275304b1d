"""What hostile clients cost the good ones: `sloscope serve`'s accepted spans per second and request latency for
keep-alive exporters alone (the baseline, measured in the same run), then beside clients sending malformed
requests and slow clients trickling their headers; and serve's resident memory in each.

    .venv/bin/python benchmarks/hostile_clients.py [--seconds 20] [--good 2] [--malformed 1] [--slow 6]

Each phase runs a fresh serve (its own database, --decode-workers 0), so one cannot warm the other; the
limits are the soak test's (2 s deadlines, 256 KiB bodies, 32 connections).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.alerting_stack import free_port, wait_listening  # noqa: E402
from tests.hostile_clients import ClientMix, rss_bytes  # noqa: E402

LIMITS = ["--read-header-timeout", "2", "--read-timeout", "2", "--max-request-body-size", "256KiB",
          "--max-connections", "32"]


def phase(db: Path, seconds: float, good: int, malformed: int, slow: int) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--grpc", "off",
                             "--http", f"127.0.0.1:{port}", "--decode-workers", "0", "--log-level", "error",
                             *LIMITS])
    try:
        wait_listening(port, proc, "sloscope serve")
        mix = ClientMix(port)
        threads = mix.start(good, malformed, slow)
        rss, started = [], time.monotonic()
        while time.monotonic() - started < seconds:
            rss.append(rss_bytes(proc.pid))
            time.sleep(0.5)
        mix.stop.set()
        elapsed = time.monotonic() - started
        for thread in threads:
            thread.join(30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    latencies = sorted(mix.latencies) or [float("nan")]
    return {"spans_per_s": mix.kept_spans / elapsed, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "hostile": mix.hostile, "failed_good": len(mix.unanswered), "rss_mib": max(rss) / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--good", type=int, default=2)
    parser.add_argument("--malformed", type=int, default=1)
    parser.add_argument("--slow", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        alone = phase(Path(tmp) / "alone.duckdb", args.seconds, args.good, 0, 0)
        mixed = phase(Path(tmp) / "mixed.duckdb", args.seconds, args.good, args.malformed, args.slow)
    for name, result in (("good clients alone (baseline)", alone), ("beside hostile clients", mixed)):
        print(f"{name:32} {result['spans_per_s']:8.0f} spans/s  p50 {result['p50_ms']:6.1f} ms  "
              f"p99 {result['p99_ms']:6.1f} ms  max RSS {result['rss_mib']:6.1f} MiB  "
              f"hostile requests {result['hostile']}  good requests failed {result['failed_good']}")
    print(f"ratio beside hostile / alone: throughput {mixed['spans_per_s'] / alone['spans_per_s']:.2f}, "
          f"p99 latency {mixed['p99_ms'] / alone['p99_ms']:.2f}, max RSS {mixed['rss_mib'] / alone['rss_mib']:.2f}")
    return 0 if not mixed["failed_good"] and not alone["failed_good"] else 1


if __name__ == "__main__":
    sys.exit(main())
