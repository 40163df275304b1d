"""What the spool's checksummed format costs: Spool.append and Spool.peek of version 1 files (header with
SHA-256), against the same steps on bare requests (version 0) measured in the same run.

Baseline: write the bare request to a temporary file, fsync, rename, fsync the directory (what version 0
did), and read it back and parse it. Prints the time per batch of each and their ratio, with and without
fsync (the collector always fsyncs; without it the checksum's share shows).

    .venv/bin/python benchmarks/spool_checksum.py [--batches 200] [--kib 64] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402

from sloscope.collectors.spool import Spool  # noqa: E402
from sloscope.files import fsync_directory  # noqa: E402


def a_request(kib: int) -> bytes:
    """A metrics request of about `kib` KiB: gauge points with one attribute each, as probes write them."""
    req = ExportMetricsServiceRequest()
    metric = req.resource_metrics.add().scope_metrics.add().metrics.add(name="hw.gpu.temperature")
    while req.ByteSize() < kib * 1024:
        point = metric.gauge.data_points.add(as_double=71.5, time_unix_nano=time.time_ns())
        point.attributes.add(key="hw.id").value.string_value = f"GPU-{len(metric.gauge.data_points):08d}"
    return req.SerializeToString()


def bare_round_trip(directory: str, data: bytes, n: int, fsync: bool) -> float:
    start = time.perf_counter()
    for seq in range(n):
        tmp, final = os.path.join(directory, f".{seq}.tmp"), os.path.join(directory, f"{seq}.pb")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
        os.close(fd)
        os.replace(tmp, final)
        if fsync:
            fsync_directory(directory)
    for seq in range(n):
        with open(os.path.join(directory, f"{seq}.pb"), "rb") as f:
            ExportMetricsServiceRequest.FromString(f.read())
        os.unlink(os.path.join(directory, f"{seq}.pb"))
    return (time.perf_counter() - start) / n


def spool_round_trip(directory: str, data: bytes, n: int, fsync: bool) -> float:
    spool = Spool(directory, max_bytes=2**40, max_batches=10**9, fsync=fsync)
    start = time.perf_counter()
    for _ in range(n):
        spool.append(data, 0)
    while spool:
        seq, _body, _points = spool.peek()
        spool.remove(seq)
    elapsed = time.perf_counter() - start
    spool.close()  # its lock, for the next round's spool on the same directory
    return elapsed / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--kib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary directory under var/)")
    args = parser.parse_args()
    data = a_request(args.kib)
    root = Path(args.dir or "var")
    root.mkdir(parents=True, exist_ok=True)
    print(f"{args.batches} batches of {len(data)} bytes in {root.resolve()}")
    for fsync in (True, False):
        bare_times, spool_times = [], []
        with tempfile.TemporaryDirectory(dir=root) as bare, tempfile.TemporaryDirectory(dir=root) as spooled:
            bare_round_trip(bare, data, 10, fsync)  # warm caches and the allocator first
            for _ in range(args.rounds):  # alternated, so that a busy moment of the disk hits both
                bare_times.append(bare_round_trip(bare, data, args.batches, fsync))
                spool_times.append(spool_round_trip(spooled, data, args.batches, fsync))
        baseline, checked = statistics.median(bare_times), statistics.median(spool_times)
        print(f"fsync {'on ' if fsync else 'off'}: bare write+read {baseline * 1e3:7.3f} ms/batch, "
              f"checksummed spool append+peek {checked * 1e3:7.3f} ms/batch, ratio {checked / baseline:.2f} "
              f"(medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
