"""RCA at scale: one hour of a 100-node fleet, every catalog signal at 1 s, about 5 million request spans.

Prints, for the DuckDB store and (with --store) a ClickHouse store beside it, loaded from the same files: the
ingest rate (rows/s), the bytes on disk, the rca wall time and peak memory (each in its own process, measured by
the kernel's accounting of that process), and the seconds of each rca stage (SLI windows, incident merge, signal
steps, attribution), so the next bottleneck shows. `sloscope ingest` rolls up what it loads (analytics/rollups.py);
each store is also analysed once without rollups: a ClickHouse store's emptied first, as in the first analysis of
tables a Collector wrote, and a copy of the DuckDB store without them, as one `sloscope serve` wrote. A ClickHouse
store's rca runs start once the engine's background merges of the load are done, as a server's are between
loads (how long that took is printed). As baselines measured in the same run on the same files: the rate at which
the lines can merely be decompressed and parsed as JSON, and the time of one plain aggregate query over all
requests in DuckDB.

With --mesh the hour is a service mesh's (`sloscope simulate --mesh`): every request one trace of SERVER, CLIENT
and INTERNAL spans over the nodes, so that the analysis follows the trace graph (the `trace_graph` stage: each
incident's culprits from the raw spans of its own traces) at this scale; --rate is then the requests entering the
mesh per second per node.

    .venv/bin/python benchmarks/rca_scale.py [--nodes 100] [--minutes 60] [--rate 4.6] [--keep DIR]
                                             [--store chdb:///DIR] [--rca-runs 3] [--mesh]
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
from contextlib import contextmanager
from pathlib import Path

import orjson

from sloscope.analytics.rollups import SLI_TABLE, STEP_TABLE
from sloscope.receiver.otlp_files import read_lines
from sloscope.simulator.fleet import SimulationConfig, simulate

SLOSCOPE = [sys.executable, "-m", "sloscope.commands.cli"]
STAGES = ("sli_windows", "incident_merge", "signal_steps", "attribution", "trace_graph")
RAW_ROWS = {"duckdb": "SELECT (SELECT count() FROM requests) + (SELECT count() FROM spans) + "
                      "(SELECT count() FROM samples) + (SELECT count() FROM histograms), "
                      "(SELECT count() FROM requests) + (SELECT count() FROM spans)",
            "chdb": "SELECT (SELECT count() FROM otel_traces) + (SELECT count() FROM otel_metrics_gauge) + "
                    "(SELECT count() FROM otel_metrics_sum) + (SELECT count() FROM otel_metrics_exponential_histogram), "
                    "(SELECT count() FROM otel_traces)"}


def run_measured(cmd: list[str]) -> tuple[float, int, str, bytes, float]:
    """Wall seconds, peak resident set size of the process (bytes), its stderr tail, its stdout, and its CPU
    seconds (user and system: on a shared machine, what the work cost whatever else ran)."""
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
    return (time.monotonic() - started, usage.ru_maxrss * 1024, err.strip().splitlines()[-1] if err.strip() else "",
            stdout, usage.ru_utime + usage.ru_stime)


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


def analyse_in_this_process(url: str, without_rollups: bool = False) -> int:
    """The rca document and its stage seconds as one JSON line (run as a child, so its peak RSS is its own);
    `without_rollups`: a ClickHouse store's rollups emptied first, as where a Collector wrote the tables and nothing
    has analysed them yet."""
    from sloscope.analytics.rca import analyse
    from sloscope.analytics.stores import open_store

    timings: dict[str, float] = {}
    with open_store(url, read_only=True) as store:
        for table in (SLI_TABLE, STEP_TABLE) if without_rollups else ():
            store.execute(f"TRUNCATE TABLE IF EXISTS {table}")
        result = analyse(store, store.slo_spec(), timings=timings)
    sys.stdout.write(json.dumps({"incidents": result["incidents"], "timings": timings}))
    return 0


def bytes_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stored_rows(url: str) -> tuple[int, int]:
    """(all rows, spans) as the store holds them (ClickHouse: the exporter's rows, duplicates and all)."""
    from sloscope.analytics.stores import open_store

    with open_store(url, read_only=True) as store:
        return store.rows(RAW_ROWS[url.partition(":")[0]])[0]


def settled(url: str, most_s: float = 300.0) -> float | None:
    """Seconds until a ClickHouse store's background merges of the load are done (None for DuckDB, which has
    none): as a server's, between loads, so that they do not share the 2 cores with the rca runs."""
    if url.startswith("duckdb:"):
        return None
    from sloscope.analytics.stores import open_store

    started = time.monotonic()
    with open_store(url, read_only=True) as store:
        quiet = 0
        while quiet < 3 and time.monotonic() - started < most_s:
            busy = store.scalar("SELECT count() FROM system.merges")
            quiet = 0 if busy else quiet + 1
            time.sleep(1.0)
    return time.monotonic() - started


def duckdb_aggregate_s(url: str) -> float:
    """One plain aggregate over all requests: what a scan of the table costs, for scale."""
    from sloscope.analytics.stores import open_store

    with open_store(url, read_only=True) as store:
        t = time.monotonic()
        store.rows("SELECT tier, count(*), quantile_cont(duration_ms, 0.99) FROM requests GROUP BY tier")
        return time.monotonic() - t


def analysed(url: str, runs: int, *flags: str) -> tuple[float, int, float, dict, list[float]]:
    """rca `runs` times, each in a process of its own: the run of median analysis time (its wall seconds, peak
    RSS, CPU seconds and answer) and every run's analysis seconds, since one run on a shared machine says little."""
    measured = []
    for _ in range(runs):
        rca_s, rca_rss, _, out, rca_cpu = run_measured([sys.executable, __file__, "--analyse", url, *flags])
        answer = json.loads(out)
        measured.append((sum(answer["timings"].values()), rca_s, rca_rss, rca_cpu, answer))
    measured.sort(key=lambda m: m[0])
    _, rca_s, rca_rss, rca_cpu, answer = measured[len(measured) // 2]
    return rca_s, rca_rss, rca_cpu, answer, [m[0] for m in measured]


@contextmanager
def unrolled(url: str):
    """(url, flags of the child, what it measures) of the store as analysed before it has rollups: a ClickHouse
    store's emptied by the child, whose analysis makes them again; a copy of a DuckDB store without them, which a
    read-only analysis does not make."""
    if not url.startswith("duckdb:"):
        yield url, ("--without-rollups",), "the first analysis of tables a Collector wrote, which makes them"
        return
    from sloscope.analytics.stores import open_store

    path = Path(url.partition(":///")[2])
    copy = path.with_name(f"unrolled-{path.name}")
    shutil.copyfile(path, copy)
    try:
        with open_store(f"duckdb:///{copy}") as store:
            for table in (SLI_TABLE, STEP_TABLE):
                store.execute(f"DROP TABLE IF EXISTS {table}")
        yield f"duckdb:///{copy}", (), "a store that `sloscope serve` wrote, or one analysed read-only before"
    finally:
        copy.unlink(missing_ok=True)


def measure(url: str, files: list[Path], truth, floor: float, node_seconds: float, rca_runs: int) -> dict:
    """Load, size and analyse one store, printing its figures; returns them."""
    ingest_s, ingest_rss, ingest_line, _, ingest_cpu = run_measured(SLOSCOPE + ["ingest", "--store", url,
                                                                            *map(str, files)])
    os.sync()  # the store's writeback done before it is read, so that it does not share the rca's time
    merging_s = settled(url)
    rows, spans = stored_rows(url)
    disk = bytes_on_disk(Path(url.partition(":///")[2]))
    rca_s, rca_rss, rca_cpu, answer, every = analysed(url, rca_runs)
    incidents, timings = answer["incidents"], answer["timings"]
    # The top cause's node: in a mesh, the culprit's, not the entry's where the incident was felt.
    found = sorted({(i["causes"][0].get("node", i["node"]), i["causes"][0]["cause"]) if i["causes"]
                    else (i["node"], "-") for i in incidents})
    print(f"{url}")
    print(f"  rows stored: {rows:,} ({spans:,} spans); on disk {disk / 2**20:,.0f} MiB "
          f"({disk / rows:.1f} bytes/row)")
    print(f"  ingest: {ingest_s:.0f}s, {rows / ingest_s:,.0f} rows/s, peak RSS {ingest_rss / 2**30:.2f} GiB "
          f"(main process), {ingest_cpu:.0f} CPU s; parse-only floor {floor:,.0f} rows/s per core -> ingest/floor {rows / ingest_s / floor:.2f}")
    print(f"  per node: {rows / node_seconds:,.0f} rows/s, {disk / node_seconds * 86_400 / 2**20:,.0f} MiB/day")
    print(f"  rca:    {rca_s:.1f}s (process, {rca_cpu:.1f} CPU s), {sum(timings.values()):.2f}s analysing, peak RSS "
          f"{rca_rss / 2**30:.2f} GiB; stages: " + ", ".join(f"{s} {timings.get(s, 0.0):.2f}s" for s in STAGES))
    print(f"          median of {len(every)} runs; each run's analysis: " + ", ".join(f"{t:.2f}s" for t in every))
    print(f"          {len(incidents)} incidents, (node, top cause): {found}; injected "
          f"{truth.fault['cause']} on {truth.fault['node']}")
    with unrolled(url) as (plain, flags, what):
        _, rss, _, cold, every = analysed(plain, 1, *flags)
    print(f"  rca without rollups ({what}): {every[0]:.2f}s analysing, peak RSS {rss / 2**30:.2f} GiB; stages: "
          + ", ".join(f"{s} {cold['timings'].get(s, 0.0):.2f}s" for s in STAGES)
          + f"; same incidents: {cold['incidents'] == incidents}")
    print(f"          ({ingest_line})")
    if merging_s is not None:
        print(f"          (the engine's merges after the load ended {merging_s:.0f}s later, before the rca runs)")
    return {"rca_s": rca_s, "analysis_s": sum(timings.values()), "rows": rows, "ingest_s": ingest_s, "found": found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=float, default=4.6, help="requests/s per service per node (with --mesh: "
                        "requests/s entering the mesh per node)")
    parser.add_argument("--mesh", action="store_true", help="a service mesh's traces, every span kind")
    parser.add_argument("--rca-runs", type=int, default=3, help="rca runs per store; the median is shown")
    parser.add_argument("--keep", type=Path, help="keep the generated files and databases here")
    parser.add_argument("--store", metavar="URL", help="a ClickHouse store to measure beside DuckDB "
                        "(chdb:///DIR; emptied first)")
    parser.add_argument("--analyse", metavar="URL", help=argparse.SUPPRESS)  # the measured child
    parser.add_argument("--without-rollups", action="store_true", help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    if args.analyse:
        return analyse_in_this_process(args.analyse, args.without_rollups)
    if args.store and not args.store.startswith("chdb:///"):
        parser.error("--store: a chdb:///DIR store (one this run may empty)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="sloscope-scale-"))
    otlp, db = work / "otlp", work / "scale.duckdb"
    try:
        t = time.monotonic()
        truth = simulate(SimulationConfig(out=otlp, nodes=args.nodes, duration_s=args.minutes * 60, rate=args.rate,
                                          seed=11, fault="storage_queue", mesh=args.mesh))
        files = sorted(otlp.glob("*.jsonl*"))
        size = sum(f.stat().st_size for f in files)
        what = " of a mesh" if args.mesh else ""
        print(f"generated {args.nodes} nodes x {args.minutes} min{what} in {time.monotonic() - t:.0f}s: "
              f"{size / 2**20:.0f} MiB of gzip OTLP/JSON; fault {truth.fault['cause']} on {truth.fault['node']}")
        floor = parse_only_rate(files)
        db.unlink(missing_ok=True)
        node_seconds = args.nodes * args.minutes * 60.0
        duck = measure(f"duckdb:///{db}", files, truth, floor, node_seconds, args.rca_runs)
        scan_s = duckdb_aggregate_s(f"duckdb:///{db}")
        print(f"  one aggregate over all requests {scan_s:.2f}s -> rca/aggregate {duck['rca_s'] / scan_s:.0f}x")
        if args.store:
            shutil.rmtree(args.store.partition(":///")[2], ignore_errors=True)
            ch = measure(args.store, files, truth, floor, node_seconds, args.rca_runs)
            print(f"chDB/DuckDB: rca analysis {ch['analysis_s'] / duck['analysis_s']:.2f}x (process "
                  f"{ch['rca_s'] / duck['rca_s']:.2f}x, chDB's library loading included), ingest rows/s "
                  f"{ch['rows'] / ch['ingest_s'] / (duck['rows'] / duck['ingest_s']):.2f}x; same (node, top cause): "
                  f"{ch['found'] == duck['found']}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
