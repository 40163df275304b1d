"""Late placement: requests stored on the unknown node because their pod was not known yet (a span can arrive
before the watch reports its pod) are moved to the pod's node once it is, and the spans of other kinds of the same
pods with them. Spans are never held back waiting for a
pod: a 2xx means committed, so they are stored at once and moved afterwards, within `interval_s` of the pod
appearing (or of the request's commit, whichever is later), for requests started in the last `window_s`."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone

import duckdb

from sloscope.analytics.frames import REQUEST_KEY, Frames

from sloscope.analytics.sql_files import sql
from sloscope.enrich.pods import RETENTION_S, PodDirectory
from sloscope.catalog import UNKNOWN_NODE
from sloscope.records import Batch

log = logging.getLogger("sloscope.late_placement")
INTERVAL_S = 2.0
MIN_GAP_S = 0.25  # between runs, however often pods change


def place_late(store, directory: PodDirectory, since: datetime) -> int:
    """Move the unknown node's requests started since `since` whose pod is now known, and the other spans of their
    pods; how many spans moved."""
    if not len(directory):
        return 0
    reader = store.reader()
    try:
        reader.con.execute("BEGIN TRANSACTION")
        unknown = reader.frame(sql("unknown_node_requests"), [UNKNOWN_NODE, since])
        placed, _, _ = directory.place(unknown)
        placed = placed.filter(placed["node"].is_not_null())
        moved = 0
        if not placed.is_empty():
            reader.con.register("placed", placed.select(*REQUEST_KEY, "node"))
            moved = reader.rows(sql("move_requests_to_nodes"), [UNKNOWN_NODE])[0][0]
            reader.con.unregister("placed")
            reader.con.register("placed_pods", placed.select("pod", "node").drop_nulls().unique())
            moved += reader.rows(sql("move_spans_to_nodes"), [UNKNOWN_NODE, since])[0][0]
            reader.con.unregister("placed_pods")
        reader.con.execute("COMMIT")
        return moved
    finally:
        reader.con.close()  # an open transaction (after a failure) is rolled back with it


class LatePlacement:
    """Runs place_late every interval_s, and soon after the directory changes; the counter of what moved goes to
    the store with the writer's next commit (spans_node_replaced_late)."""

    def __init__(self, store, writer, directory: PodDirectory, interval_s: float = INTERVAL_S,
                 window_s: float = RETENTION_S):
        self.store, self.writer, self.directory = store, writer, directory
        self.interval_s, self.window_s = interval_s, window_s
        self.unreported: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="late-placement", daemon=True)

    def start(self) -> "LatePlacement":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.directory.changed.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.directory.changed.wait(self.interval_s)
            self.directory.changed.clear()
            if not self._stop.is_set():
                self.run_once()
                self._stop.wait(MIN_GAP_S)

    def run_once(self) -> int:
        since = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=self.window_s)
        try:
            moved = place_late(self.store, self.directory, since)
        except duckdb.Error as exc:  # a conflict with a concurrent write, a store failing: the next run retries
            self.unreported["late_placement_failures"] += 1
            log.warning("late placement: %s", exc)
            moved = 0
        self.unreported["spans_node_replaced_late"] += moved
        if +self.unreported and self.writer.offer(Frames.of(Batch()), Counter(self.unreported)) is not None:
            self.unreported.clear()
        return moved
