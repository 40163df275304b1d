"""The intake log alone: appends of real span requests from one and from many threads, as serve's request threads
make them, each returning once its record is fsynced.

Prints requests/s and CPU per request (user and system, this process) for each thread count, beside the baseline
measured in the same run on the same frames: encoding the records alone, with no file at all. What a durable
acknowledgement costs the machine is the difference.

    .venv/bin/python benchmarks/intake_log_append.py [--requests 400] [--per-request 1000] [--threads 1 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sloscope.analytics.intake_log import IntakeLog  # noqa: E402
from sloscope.analytics.intake_record import encode  # noqa: E402
from sloscope.analytics.frames import Frames  # noqa: E402
from benchmarks.ingest_throughput import trace_payloads  # noqa: E402
from sloscope.enrich.tiers import TierResolver, resolve_tiers  # noqa: E402
from sloscope.receiver.server import Decoders, fast_decode  # noqa: E402


def request_frames(requests: int, per_request: int) -> list[Frames]:
    """Each request's frames as the receiver hands them on: decoded, tiers resolved."""
    resolver, general, out = TierResolver(frozenset({"standard", "p99-latency-critical"}), "standard"), Decoders(), []
    for body in trace_payloads(requests * per_request, per_request):
        batch, _ = fast_decode("traces", body, False) or general.decode("traces", body, False)
        resolve_tiers(batch.spans, resolver)
        out.append(Frames.of(batch))
    return out


def measured(work, threads: int, frames: list[Frames]) -> tuple[float, float]:
    """(requests/s, CPU µs per request) of `work(frames)` run by `threads` threads, each on frames of its own
    (a polars frame is not shared between threads in serve either)."""
    shares = [frames[k::threads] for k in range(threads)]
    workers = [threading.Thread(target=work, args=(share,)) for share in shares]
    cpu, wall = os.times(), time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, after = time.perf_counter() - wall, os.times()
    cpu_s = (after.user + after.system) - (cpu.user + cpu.system)
    return len(frames) / wall, cpu_s / len(frames) * 1e6


def encode_each(share: list[Frames]) -> None:
    for frames in share:
        encode(frames, {})  # dropped at once, as serve drops a record once it is logged: fresh memory costs more


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--per-request", type=int, default=1000, help="spans per request")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the log goes")
    args = parser.parse_args()
    frames = request_frames(args.requests, args.per_request)
    record_bytes = len(encode(frames[0], {}))
    for f in frames[:20]:  # the first encodings load and warm what the others find ready
        encode(f, {})
    print(f"{args.requests} requests of {args.per_request} spans, records of {record_bytes / 1000:.0f} kB, "
          f"log in {args.dir}")
    for threads in args.threads:
        rate, cpu = measured(encode_each, threads, frames)
        print(f"  {threads:>2} threads, encoding alone      {rate:>8,.0f} requests/s, {cpu:5.0f} µs CPU each")
        directory = Path(tempfile.mkdtemp(dir=args.dir))
        log = IntakeLog(directory)

        def append(share):
            for f in share:
                log.release([log.append(encode(f, {}))])

        try:
            rate, logged = measured(append, threads, frames)
        finally:
            log.close()
            shutil.rmtree(directory)
        print(f"  {threads:>2} threads, appended and fsynced {rate:>8,.0f} requests/s, {logged:5.0f} µs CPU each "
              f"(x{logged / cpu:.2f} of encoding alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
