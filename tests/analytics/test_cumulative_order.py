"""Cumulative series loaded out of time order (a fleet's files in reverse, a Collector retrying an older batch after
a newer one got through) are stored as the same per-interval deltas as in order: a point behind its series' last
stored point is placed between its stored neighbours. A copy of a stored point still counts once, and resets are
read as resets wherever their points arrive."""

from __future__ import annotations

import pytest

from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from tests.otlp_builders import counter, exp_histogram, metrics, write_lines

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000
START, RESTART = T0 - S, T0 + 8 * S + S // 2
COUNTER, HISTOGRAM = "sloscope.tcp.retransmits", "sloscope.syscall.duration"
POINTS_PER_BATCH = 3

# gpu-node-1: a drop without a new start time at the 7th point (a reset), then a new start time after the 9th
# (the producer restarted). gpu-node-2: a new start time that cannot be used (none) at the 7th point, which
# leaves that interval unknown. Both resets are the first point of a batch, so that out of order their points
# and the ones before them arrive in different writes.
SERIES = {
    "gpu-node-1": [(10, START), (12, START), (15, START), (15, START), (20, START), (22, START), (3, START),
                   (7, START), (9, START), (2, RESTART), (6, RESTART), (11, RESTART)],
    "gpu-node-2": [(100, START), (110, START), (120, START), (130, START), (140, START), (150, START), (200, 0),
                   (205, 0), (215, 0), (230, 0), (231, 0), (250, 0)],
}
IN_ORDER_DELTAS = {  # (value, interval_s) per point, as in-order ingest has always stored them
    "gpu-node-1": [(10.0, 1.0), (2.0, 1.0), (3.0, 1.0), (0.0, 1.0), (5.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0),
                   (2.0, 1.0), (2.0, 0.5), (4.0, 1.0), (5.0, 1.0)],
    "gpu-node-2": [(100.0, 1.0), (10.0, 1.0), (10.0, 1.0), (10.0, 1.0), (10.0, 1.0), (10.0, 1.0), (5.0, 1.0),
                   (10.0, 1.0), (15.0, 1.0), (1.0, 1.0), (19.0, 1.0)],
}
# Each order is a list of ingest runs, each run the batches it loads (as lines of one file, so one write).
ORDERS = {
    "in order": [[0], [1], [2], [3]],
    "reversed": [[3], [2], [1], [0]],
    "shuffled": [[1], [3], [0], [2]],
    "retried": [[0], [2], [1, 3]],  # batch 1 retried after 2 got through, in one write with batch 3
}


def counter_batch(batch: int) -> dict:
    points = range(batch * POINTS_PER_BATCH, (batch + 1) * POINTS_PER_BATCH)
    return {node: metrics([counter(COUNTER, START, [(T0 + i * S, values[i][0], values[i][1]) for i in points])],
                          node=node) for node, values in SERIES.items()}


def histogram_batch(batch: int) -> dict:
    # The same shape as gpu-node-1's counter, as a histogram's count, its observations all in one bucket.
    points = range(batch * POINTS_PER_BATCH, (batch + 1) * POINTS_PER_BATCH)
    values = SERIES["gpu-node-1"]
    return {"gpu-node-1": metrics([_histogram_point(T0 + i * S, *values[i]) for i in points], node="gpu-node-1")}


def _histogram_point(time_ns: int, count: int, start_ns: int) -> dict:
    return exp_histogram(HISTOGRAM, start_ns, [(time_ns, count, count / 1000, -10, [count])],
                         attrs={"syscall.name": "read"})


def load(tmp_path, name: str, runs: list[list[int]], batch=counter_batch) -> str:
    db = str(tmp_path / f"{name}.duckdb")
    for number, batches in enumerate(runs):
        lines = [line for b in batches for line in batch(b).values()]
        assert main(["ingest", "--db", db, str(write_lines(tmp_path / f"{name}-{number}.jsonl", lines))]) == 0
    return db


def stored(db: str, table: str = "samples", value: str = "value") -> dict[str, list[tuple]]:
    with Store(db, read_only=True) as store:
        rows = store.rows(f"SELECT node, {value}, interval_s FROM {table} ORDER BY node, ts")
    by_node = {}
    for node, *delta in rows:
        by_node.setdefault(node, []).append(tuple(delta))
    return by_node


def counters(db: str) -> dict[str, int]:
    with Store(db, read_only=True) as store:
        return store.counters()


@pytest.mark.parametrize("order", ORDERS)
def test_a_cumulative_series_in_any_batch_order_stores_the_deltas_of_time_order(tmp_path, order):
    db = load(tmp_path, order.replace(" ", "-"), ORDERS[order])
    assert stored(db) == IN_ORDER_DELTAS
    c = counters(db)
    assert c["samples_loaded"] == 23 and c.get("samples_duplicate", 0) == 0


def test_a_copy_of_a_stored_point_counts_once_wherever_it_falls(tmp_path):
    db = load(tmp_path, "reversed", ORDERS["reversed"])
    for number, batch in enumerate([1, 3, 0]):  # a middle batch, the newest, the oldest: each sent again
        f = write_lines(tmp_path / f"again-{number}.jsonl", list(counter_batch(batch).values()))
        assert main(["ingest", "--db", db, str(f)]) == 0
    assert stored(db) == IN_ORDER_DELTAS
    c = counters(db)
    assert c["samples_duplicate"] == 3 * POINTS_PER_BATCH * len(SERIES)
    assert c["samples_loaded"] == 23


def test_a_late_point_between_a_reset_and_the_point_before_it_is_placed_by_the_same_rules(tmp_path):
    # gpu-node-1's points 5 and 6 straddle its drop: stored 0-4 and 6-11 first, point 5 last.
    db = str(tmp_path / "gap.duckdb")
    values = SERIES["gpu-node-1"]

    def run(name, points):
        line = metrics([counter(COUNTER, START, [(T0 + i * S, values[i][0], values[i][1]) for i in points])])
        assert main(["ingest", "--db", db, str(write_lines(tmp_path / f"{name}.jsonl", [line]))]) == 0

    run("early", range(5))
    run("late", range(6, 12))
    assert stored(db)["gpu-node-1"][5] == (3.0, 2.0)  # the drop, counted from point 4 while 5 is missing
    run("missing", [5])
    assert stored(db)["gpu-node-1"] == IN_ORDER_DELTAS["gpu-node-1"]


@pytest.mark.parametrize("order", ["reversed", "shuffled", "retried"])
def test_a_cumulative_histogram_in_any_batch_order_stores_the_deltas_of_time_order(tmp_path, order):
    in_order = load(tmp_path, "in-order", ORDERS["in order"], histogram_batch)
    other = load(tmp_path, order, ORDERS[order], histogram_batch)
    columns = "count, round(sum, 9), buckets"
    assert stored(other, "histograms", columns) == stored(in_order, "histograms", columns)
    counts = [row[0] for row in stored(in_order, "histograms", columns)["gpu-node-1"]]
    assert counts == [10, 2, 3, 5, 2, 3, 4, 2, 2, 4, 5]  # no row where nothing was observed (point 3)


def test_in_time_order_only_resets_and_the_points_before_them_keep_their_running_totals(tmp_path):
    # What in-order ingest writes besides deltas: gpu-node-1's first point, its drop and its restart, gpu-node-2's
    # first point and its unusable start, each with the point before it.
    db = load(tmp_path, "in-order", ORDERS["in order"])
    with Store(db, read_only=True) as store:
        kept = store.rows(f"SELECT node, (time_ns - {T0}) // {S}, reset FROM cumulative_points ORDER BY ALL")
    assert kept == [("gpu-node-1", 0, True), ("gpu-node-1", 5, False), ("gpu-node-1", 6, True),
                    ("gpu-node-1", 8, False), ("gpu-node-1", 9, True),
                    ("gpu-node-2", 0, True), ("gpu-node-2", 5, False), ("gpu-node-2", 6, True)]


def test_a_series_stored_before_running_totals_were_kept_places_nothing_before_its_last_point_then(tmp_path):
    db = load(tmp_path, "older", [[2], [3]])
    with Store(db) as store:  # no running totals kept, as in a store written before cumulative_points existed
        store.con.execute("DELETE FROM cumulative_points")
    before = stored(db)
    assert main(["ingest", "--db", db, str(write_lines(tmp_path / "late.jsonl", counter_batch(1).values()))]) == 0
    assert stored(db) == before
    assert counters(db)["samples_duplicate"] == POINTS_PER_BATCH * len(SERIES)


def test_a_late_histogram_point_after_intervals_that_added_nothing_counts_from_the_point_before_it(tmp_path):
    # Counts 10, 15, 15, 15, 20: points 2 and 3 added nothing, so they have no row. Point 2 comes last, after 3
    # and 4: the stored point after it (3) has no row, and the last known point before it (0) another count.
    db = str(tmp_path / "idle.duckdb")
    counts = [10, 15, 15, 15, 20]
    for name, points in (("early", [0, 1]), ("later", [3, 4]), ("late", [2])):
        line = metrics([_histogram_point(T0 + i * S, counts[i], START) for i in points])
        assert main(["ingest", "--db", db, str(write_lines(tmp_path / f"{name}.jsonl", [line]))]) == 0
    assert stored(db, "histograms", "count") == {"gpu-node-1": [(10, 1.0), (5, 1.0), (5, 1.0)]}
