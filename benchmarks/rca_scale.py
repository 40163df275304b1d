"""RCA at scale: one hour of a 100-node fleet, every catalog signal at 1 s, about 5 million request spans.

Prints the ingest rate (rows/s) and the rca wall time and peak memory (each in its own process, measured by
the kernel's accounting of that process), and, as baselines measured in the same run on the same files,
the rate at which the lines can merely be decompressed and parsed as JSON, and the time of one plain
aggregate query over all requests.

    .venv/bin/python benchmarks/rca_scale.py [--nodes 100] [--minutes 60] [--rate 4.6] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from receiver.otlp_files import read_lines
from simulator.fleet import SimulationConfig, simulate

SLOSCOPE = [sys.executable, "-m", "commands.cli"]


def run_measured(cmd: list[str]) -> tuple[float, int, str, bytes]:
    """Wall seconds, peak resident set size of the process (bytes), its stderr tail, and its stdout."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        err = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        stdout = out.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return time.monotonic() - started, usage.ru_maxrss * 1024, err.strip().splitlines()[-1] if err.strip() else "", stdout


def parse_only_rate(files: list[Path], max_lines: int = 400) -> float:
    """Points+spans per second for just decompressing and parsing lines (a floor for any ingest)."""
    rows, started = 0, time.monotonic()
    for path in files:
        for n, (_, line) in enumerate(read_lines(path)):
            if n >= max_lines:
                break
            doc = orjson.loads(line)
            rows += line.count(b'"timeUnixNano"') + line.count(b'"spanId"')
            del doc
    return rows / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=float, default=4.6, help="requests/s per service per node")
    parser.add_argument("--keep", type=Path, help="keep the generated files and database here")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="sloscope-scale-"))
    otlp, db = work / "otlp", work / "scale.duckdb"
    try:
        t = time.monotonic()
        truth = simulate(SimulationConfig(out=otlp, nodes=args.nodes, duration_s=args.minutes * 60, rate=args.rate,
                                          seed=11, fault="storage_queue"))
        files = sorted(otlp.glob("*.jsonl*"))
        size = sum(f.stat().st_size for f in files)
        print(f"generated {args.nodes} nodes x {args.minutes} min in {time.monotonic() - t:.0f}s: "
              f"{size / 2**20:.0f} MiB of gzip OTLP/JSON; fault {truth.fault['cause']} on {truth.fault['node']}")
        db.unlink(missing_ok=True)
        ingest_s, ingest_rss, ingest_line, _ = run_measured(SLOSCOPE + ["ingest", "--db", str(db), *map(str, files)])
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        rows = con.execute("SELECT (SELECT count(*) FROM requests) + (SELECT count(*) FROM samples) + "
                           "(SELECT count(*) FROM histograms), (SELECT count(*) FROM requests)").fetchall()[0]
        t = time.monotonic()
        con.execute("SELECT tier, count(*), quantile_cont(duration_ms, 0.99) FROM requests GROUP BY tier").fetchall()
        scan_s = time.monotonic() - t
        con.close()
        floor = parse_only_rate(files)
        rca_s, rca_rss, _, rca_out = run_measured(SLOSCOPE + ["rca", "--db", str(db), "--format", "json"])
        incidents = json.loads(rca_out)["incidents"]
        found = sorted({(i["node"], i["causes"][0]["cause"] if i["causes"] else "-") for i in incidents})
        print(f"rows stored: {rows[0]:,} ({rows[1]:,} request spans)")
        print(f"ingest: {ingest_s:.0f}s, {rows[0] / ingest_s:,.0f} rows/s, peak RSS {ingest_rss / 2**30:.2f} GiB "
              f"(main process); parse-only floor {floor:,.0f} rows/s per core -> ingest/floor {rows[0] / ingest_s / floor:.2f}")
        print(f"rca:    {rca_s:.1f}s, peak RSS {rca_rss / 2**30:.2f} GiB; one aggregate over all requests "
              f"{scan_s:.2f}s -> rca/aggregate {rca_s / scan_s:.0f}x")
        print(f"        {len(incidents)} incidents, (node, top cause): {found}; injected "
              f"{truth.fault['cause']} on {truth.fault['node']}")
        print(f"        ({ingest_line})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
