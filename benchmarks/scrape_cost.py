"""What a scrape of serve's /metrics costs as the store's label sets grow: 1k, 100k and 1M of them.

Each size is a DuckDB store holding that many request label sets (a service each) and as many GPU utilization
series (a GPU each), written through the store's API in one batch. Each measurement runs in a process of its own,
so that its peak RSS (the kernel's accounting of that process) is its own:

- open: the store opened and nothing read, the floor under the others;
- unbounded (the baseline: what every scrape read before): the request, gauge, counter and histogram queries
  without the cap, every row fetched;
- refresh: one refresh of the exposition (the same queries with the cap of 10,000 label sets per family in
  SQL, rendered), which the first scrape waits for;
- scrape: the scrapes after it, which serve the refreshed text (the largest of 5, 0.2 s apart).

Prints seconds and peak RSS per size and measurement, and the baseline's over the new one as ratios.

    .venv/bin/python benchmarks/scrape_cost.py [--sizes 1000 100000 1000000] [--keep DIR]

With --ingest-p99 it measures instead what scrapes cost the exporters of a real `sloscope serve` (--grpc off,
--decode-workers 0) over a store of 1M label sets (--sizes), stamped at the time it is built so that every gauge
is fresh and the open incidents' analysis reads every request. Two exporters send 200 spans a request over
keep-alive connections, 10 requests/s in all, open loop, for --seconds (the baseline), then as long again while a
scraper fetches /metrics every 5 s (a third of Prometheus's default interval), one scrape at a time. Prints, per
phase, the requests sent, their latencies from when each was due to its 200 (p50, p99, max), the scrapes' seconds
and serve's peak RSS, and the p99 with scrapes over the p99 alone. --old-code runs the same on serve from another
version's package, as `setup.py build --build-lib DIR` lays it out, on a store of its own built the same way.

    .venv/bin/python benchmarks/scrape_cost.py --ingest-p99 [--sizes 1000000] [--seconds 60] [--old-code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# tests/ and benchmarks/ are imported where used, not here: the measuring children run this file, and http.client
# alone would add 6 MiB to their peaks
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

T0_S = 1_764_410_400  # the stored times; the exporter's clock is a minute later, so every gauge is fresh
MEASURES = ("open", "unbounded", "refresh")
FAMILY_QUERIES = ("request_totals", "latest_gauges", "counter_totals", "signal_histogram_totals")
MIB = 1 << 20
SPANS_PER_REQUEST = 200
REQUESTS_PER_S = 10.0
EXPORTERS = 2
SCRAPE_EVERY_S = 5.0


def build(path: str, n: int, t0_s: int) -> None:
    """A store of n request label sets and n gauge series from t0_s on, written in one batch; its seconds as a
    JSON line."""
    import numpy as np
    import polars as pl

    from sloscope.analytics.frames import HISTOGRAM_SCHEMA, POINT_SCHEMA, SPAN_COLUMNS, SPAN_SCHEMA, Frames
    from sloscope.analytics.store import Store

    started = time.monotonic()
    i = np.arange(n, dtype=np.int64)
    ids = pl.Series(i + 1, dtype=pl.UInt64)
    nodes = [f"node-{k % 100:02d}" for k in range(n)]
    spans = pl.DataFrame({
        "trace_hi": ids, "trace_lo": ids, "span_id": ids, "parent_id": pl.Series([None] * n, dtype=pl.UInt64),
        "kind": 2, "start_time": (t0_s * 1_000_000 + i).astype("datetime64[us]"),
        "duration_ms": (i % 1000).astype(float), "service": [f"svc-{k:07d}" for k in range(n)], "node": nodes,
        "pod": None, "namespace": None, "pod_ip": None, "gpu_id": None, "tier": "standard", "route": None,
        "status_code": 200, "failed": i % 7 == 0, "peer": None,
    }).select([pl.col(c).cast(SPAN_SCHEMA[c]) if c in SPAN_SCHEMA else pl.col(c) for c in SPAN_COLUMNS])
    points = pl.DataFrame({"node": nodes, "metric": "hw.gpu.utilization",
                           "attributes": [f'{{"hw.id":"GPU-{k:07d}"}}' for k in range(n)], "is_sum": False,
                           "cumulative": False, "start_ns": 0, "time_ns": t0_s * 10**9 + i * 1000, "value": 0.5},
                          schema=POINT_SCHEMA)
    with Store(path) as store:
        store.write(Frames(spans, points, pl.DataFrame(schema=HISTOGRAM_SCHEMA)))
        store.execute("CHECKPOINT")  # so that opening it replays no log, which would raise the floor
    print(json.dumps({"seconds": time.monotonic() - started}))


def measure(path: str, what: str) -> None:
    """One measurement in this process: its seconds (and the scrapes' for `refresh`) as a JSON line."""
    from sloscope.alerts.store_metrics import ALL_TIME, Exposition, StoreCollector
    from sloscope.analytics.store import Store
    from sloscope import metric_names

    with Store(path, read_only=True) as store:
        collector = StoreCollector(store.reading, clock=lambda: T0_S + 60)
        started, scrapes = time.monotonic(), []
        if what == "unbounded":
            families = (*metric_names.GAUGES, *metric_names.COUNTERS, *metric_names.SIGNAL_HISTOGRAMS)
            params = {**ALL_TIME, "bounds_ms": collector.bounds_ms, "max_series": 2**62,
                      "metrics": [f.signal for f in families], "excluded": [list(f.exclude_if) for f in families]}
            with store.reading() as reader:
                rows = sum(len(reader.rows(reader.sql(name), params)) for name in FAMILY_QUERIES)
        elif what == "refresh":
            exposition = Exposition(collector)
            rows = len(exposition.body())
            seconds = time.monotonic() - started
            for _ in range(5):
                time.sleep(0.2)
                scraped = time.monotonic()
                exposition.body()
                scrapes.append(time.monotonic() - scraped)
        else:
            rows = 0
        seconds = seconds if what == "refresh" else time.monotonic() - started
    print(json.dumps({"seconds": seconds, "rows": rows, "scrape_s": max(scrapes, default=None)}))


def run_child(path: Path, what: str, *options: str) -> dict:
    """A measurement (or, with a number of label sets for `what`, the building of the store) in a process of its
    own, with that process's peak RSS in bytes. This process stays small: a child's peak counts its parent's
    size at the fork."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, __file__, "--child", what, str(path), *options], stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{what} on {path} failed")
        out.seek(0)
        return {**json.loads(out.read().decode().strip().splitlines()[-1]), "rss": usage.ru_maxrss * 1024}


def scrape_table(sizes: list[int], folder: Path) -> None:
    print(f"{'label sets':>10} {'built s':>8} {'open MiB':>9} {'unbounded s':>12} {'MiB':>6} {'refresh s':>10} "
          f"{'MiB':>6} {'scrape s':>9} {'time x':>7} {'RSS x':>6}")
    for n in sizes:
        path = folder / f"{n}.duckdb"
        path.unlink(missing_ok=True)
        built = run_child(path, str(n))["seconds"]
        got = {what: run_child(path, what) for what in MEASURES}
        old, new = got["unbounded"], got["refresh"]
        print(f"{n:>10,} {built:>8.1f} {got['open']['rss'] / MIB:>9.0f} {old['seconds']:>12.2f} "
              f"{old['rss'] / MIB:>6.0f} {new['seconds']:>10.2f} {new['rss'] / MIB:>6.0f} "
              f"{new['scrape_s']:>9.4f} {old['seconds'] / new['scrape_s']:>7.0f} "
              f"{old['rss'] / new['rss']:>6.2f}",
              flush=True)
    print("time x: the unbounded queries' seconds over a scrape's; RSS x: their process's peak RSS over the "
          "refreshing one's")


def serve(db: Path, code: Path | None) -> tuple[subprocess.Popen, int]:
    """`sloscope serve` over db on a free port, from the installed package, or from the built package in `code`."""
    from tests.alerting_stack import free_port, wait_listening

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    # in db's folder: `-m` puts the working directory first on the path, where the repository's own sloscope/
    # would come before `code`'s
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db),
                             "--http", f"127.0.0.1:{port}", "--grpc", "off", "--decode-workers", "0",
                             "--log-level", "error"], cwd=db.parent, env=env)
    wait_listening(port, proc, "sloscope serve")
    return proc, port


def reset_peak_rss(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM starts again from VmRSS, so that each phase's peak is its own


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def scrape_every(port: int, stop: threading.Event) -> list[float]:
    """Each scrape's seconds: one every SCRAPE_EVERY_S until `stop`, one at a time as Prometheus scrapes a target
    (the next at once where one took longer); the one in flight at `stop` is waited for."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    took, due = [], time.monotonic()
    while not stop.wait(max(0.0, due - time.monotonic())):
        began = time.monotonic()
        conn.request("GET", "/metrics")
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            raise SystemExit(f"/metrics: HTTP {reply.status}")
        took.append(time.monotonic() - began)
        due = began + SCRAPE_EVERY_S
    conn.close()
    return took


def ingest_phase(proc: subprocess.Popen, port: int, payloads: list[bytes], scraping: bool) -> dict:
    """The payloads' export latencies (sorted), with or without a scraper beside them, and serve's peak RSS."""
    from benchmarks.ingest_throughput import paced_latencies

    reset_peak_rss(proc.pid)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        scrapes = pool.submit(scrape_every, port, stop) if scraping else None
        try:
            latencies = paced_latencies(port, "/v1/traces", payloads, REQUESTS_PER_S, EXPORTERS)
        finally:
            stop.set()
        return {"latencies": latencies, "scrapes": scrapes.result() if scrapes else [], "rss": peak_rss(proc.pid)}


def ingest_beside_scrapes(n: int, folder: Path, seconds: float, code: Path | None) -> list[dict]:
    """Both phases, back to back, on one serve over a store of n label sets built now."""
    from benchmarks.ingest_throughput import trace_payloads

    per_phase = round(seconds * REQUESTS_PER_S)
    payloads = trace_payloads(2 * per_phase * SPANS_PER_REQUEST, SPANS_PER_REQUEST)
    path = folder / f"{n}-{'old' if code else 'new'}-serve.duckdb"
    path.unlink(missing_ok=True)
    run_child(path, str(n), "--t0", str(int(time.time())))
    proc, port = serve(path, code)
    try:
        return [ingest_phase(proc, port, payloads[:per_phase], False),
                ingest_phase(proc, port, payloads[per_phase:], True)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def ingest_table(sizes: list[int], folder: Path, seconds: float, old_code: Path | None) -> None:
    print(f"{'label sets':>10} {'serve':>5} {'scraping':>9} {'requests':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'scrapes':>8} {'p50 s':>6} {'max s':>6} {'peak MiB':>9}")
    for n in sizes:
        for code in (None, old_code) if old_code else (None,):
            alone, scraped = ingest_beside_scrapes(n, folder, seconds, code)
            for scraping, got in (("none", alone), (f"every {SCRAPE_EVERY_S:.0f} s", scraped)):
                print(f"{n:>10,} {'old' if code else 'now':>5} {scraping:>9} {phase_row(got)}", flush=True)
            print(f"{'':>10} p99 with scrapes / alone: {p99(scraped['latencies']) / p99(alone['latencies']):.2f}")
    print("latency: from when a request was due (open loop) to its 200; peak MiB: serve's VmHWM over the phase")


def phase_row(got: dict) -> str:
    ms, took = [1000 * s for s in got["latencies"]], got["scrapes"]
    scrapes = f"{statistics.median(took):>6.2f} {max(took):>6.2f}" if took else f"{'-':>6} {'-':>6}"
    return (f"{len(ms):>9} {statistics.median(ms):>7.1f} {p99(ms):>7.1f} {max(ms):>7.1f} {len(took):>8} {scrapes} "
            f"{got['rss'] / MIB:>9.0f}")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", help="label sets (default: 1k 100k 1M; 1M with --ingest-p99)")
    parser.add_argument("--keep", type=Path, help="build the stores here and keep them")
    parser.add_argument("--ingest-p99", action="store_true", help="export latencies of a serve, scraped and not")
    parser.add_argument("--seconds", type=float, default=60.0, help="each ingest phase's length (default: 60)")
    parser.add_argument("--old-code", type=Path, metavar="DIR", help="also serve from this built package")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "DB"), help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=int, default=T0_S, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, path = args.child
        build(path, int(what), args.t0) if what.isdigit() else measure(path, what)
        return
    folder = args.keep or Path(tempfile.mkdtemp(prefix="scrape_cost-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if args.ingest_p99:
            ingest_table(args.sizes or [1_000_000], folder, args.seconds, args.old_code)
        else:
            scrape_table(args.sizes or [1_000, 100_000, 1_000_000], folder)
    finally:
        if args.keep is None:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
