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

T0_S = 1_764_410_400  # the stored times; the exporter's clock is a minute later, so every gauge is fresh
MEASURES = ("open", "unbounded", "refresh")
FAMILY_QUERIES = ("request_totals", "latest_gauges", "counter_totals", "signal_histogram_totals")


def build(path: str, n: int) -> None:
    """A store of n request label sets and n gauge series, written in one batch; its seconds as a JSON line."""
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
        "kind": 2, "start_time": (T0_S * 1_000_000 + i).astype("datetime64[us]"),
        "duration_ms": (i % 1000).astype(float), "service": [f"svc-{k:07d}" for k in range(n)], "node": nodes,
        "pod": None, "namespace": None, "pod_ip": None, "gpu_id": None, "tier": "standard", "route": None,
        "status_code": 200, "failed": i % 7 == 0, "peer": None,
    }).select([pl.col(c).cast(SPAN_SCHEMA[c]) if c in SPAN_SCHEMA else pl.col(c) for c in SPAN_COLUMNS])
    points = pl.DataFrame({"node": nodes, "metric": "hw.gpu.utilization",
                           "attributes": [f'{{"hw.id":"GPU-{k:07d}"}}' for k in range(n)], "is_sum": False,
                           "cumulative": False, "start_ns": 0, "time_ns": T0_S * 10**9 + i * 1000, "value": 0.5},
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


def run_child(path: Path, what: str) -> dict:
    """A measurement (or, with a number of label sets for `what`, the building of the store) in a process of its
    own, with that process's peak RSS in bytes. This process stays small: a child's peak counts its parent's
    size at the fork."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, __file__, "--child", what, str(path)], stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{what} on {path} failed")
        out.seek(0)
        return {**json.loads(out.read().decode().strip().splitlines()[-1]), "rss": usage.ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--keep", type=Path, help="build the stores here and keep them")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, path = args.child
        build(path, int(what)) if what.isdigit() else measure(path, what)
        return
    folder = args.keep or Path(tempfile.mkdtemp(prefix="scrape_cost-"))
    folder.mkdir(parents=True, exist_ok=True)
    mib = 1 << 20
    print(f"{'label sets':>10} {'built s':>8} {'open MiB':>9} {'unbounded s':>12} {'MiB':>6} {'refresh s':>10} "
          f"{'MiB':>6} {'scrape s':>9} {'time x':>7} {'RSS x':>6}")
    try:
        for n in args.sizes:
            path = folder / f"{n}.duckdb"
            path.unlink(missing_ok=True)
            built = run_child(path, str(n))["seconds"]
            got = {what: run_child(path, what) for what in MEASURES}
            old, new = got["unbounded"], got["refresh"]
            print(f"{n:>10,} {built:>8.1f} {got['open']['rss'] / mib:>9.0f} {old['seconds']:>12.2f} "
                  f"{old['rss'] / mib:>6.0f} {new['seconds']:>10.2f} {new['rss'] / mib:>6.0f} "
                  f"{new['scrape_s']:>9.4f} {old['seconds'] / new['scrape_s']:>7.0f} "
                  f"{old['rss'] / new['rss']:>6.2f}",
                  flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(folder)
    print("time x: the unbounded queries' seconds over a scrape's; RSS x: their process's peak RSS over the "
          "refreshing one's")


if __name__ == "__main__":
    main()
