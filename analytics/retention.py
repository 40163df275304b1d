"""Retention for the DuckDB store: rows older than the kept period go, in one transaction.

Requests, samples and histograms older than `keep` before `now` are deleted, with the rollups of chunks that begin
before then (analytics/rollups.py); the cumulative state and the counters stay (deltas continue across the cut;
counters count what was ever loaded), and the deleted requests are counted into retired_requests (their token
timings into retired_token_requests) first, so that /metrics' request and token counters never go down. DuckDB
reuses the freed blocks for new rows; the file itself shrinks only on a copy (EXPORT/IMPORT). ClickHouse stores
expire rows with the clickhouseexporter's `ttl` setting instead, in the engine.

`serve --retention` applies it at start and every RETENTION_INTERVAL_S on the writer's thread, between two
writes, so that it has the store's one connection to itself and never races a write.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone

import duckdb

from sloscope.durations import format_duration, parse_duration
from sloscope.errors import ConfigError
from sloscope.latency_buckets import bounds_ms
from sloscope.slo_spec import TOKEN_SLIS

from sloscope.analytics.rollups import SLI_TABLE, STEP_TABLE
from sloscope.analytics.store import Store, StoreError

log = logging.getLogger("sloscope.retention")
RETENTION_INTERVAL_S = 3600.0

EPOCH = datetime(1970, 1, 1)  # before every stored request: the token timings retired are all those before the cutoff
TIME_COLUMNS = {"requests": "start_time", "spans": "start_time", "samples": "ts", "histograms": "ts"}
DUCKDB_ONLY = "retention applies to DuckDB stores; ClickHouse expires rows with the exporter's ttl setting"


def kept_period(text: str, where: str) -> timedelta:
    """A kept period, which must give its unit: a bare number would be seconds, and `7` meaning 7 seconds
    would delete nearly everything. `where` names the flag in the error."""
    try:
        float(text)
    except ValueError:
        return timedelta(seconds=parse_duration(text, where))
    raise ConfigError(f"{where + ': ' if where else ''}{text!r} has no unit; give one, e.g. 7d or 12h")


def apply_retention(store, keep: timedelta, now: datetime) -> dict[str, int]:
    """Delete what is older than now - keep; returns the rows deleted per table (also counted as
    retention_deleted_<table>, and the run as retention_runs)."""
    if not isinstance(store, Store):
        raise StoreError(f"{store.path}: {DUCKDB_ONLY}")
    cutoff = now - keep
    spec = store.slo_spec()
    deleted = {}
    with store.transaction():
        store.con.execute(store.sql("retire_requests"), {"cutoff": cutoff, "bounds_ms": bounds_ms(spec)})
        store.con.execute(store.sql("retire_token_requests"), {"epoch": EPOCH, "cutoff": cutoff, **{
            f"{sli}_bounds_ms": bounds_ms(spec, sli) for sli in TOKEN_SLIS}})
        for table, column in TIME_COLUMNS.items():
            (n,), = store.con.execute(f"DELETE FROM {table} WHERE {column} < ?", [cutoff]).fetchall()
            deleted[table] = n
        for table in sorted(store.tables() & {SLI_TABLE, STEP_TABLE}):  # where a store made them
            store.con.execute(f"DELETE FROM {table} WHERE chunk_start < ?", [cutoff])
        store.add_counters({"retention_runs": 1, **{f"retention_deleted_{table}": n for table, n in deleted.items()}})
    return deleted


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class RetentionSchedule:
    """apply_retention at start and then every interval_s, each run handed to the writer to do between two
    writes. A run that fails is logged and counted (retention_failures); the next one tries again."""

    def __init__(self, store: Store, writer, keep: timedelta, interval_s: float = RETENTION_INTERVAL_S,
                 clock=utc_now):
        self.store, self.writer, self.keep, self.interval_s, self.clock = store, writer, keep, interval_s, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)

    def start(self) -> "RetentionSchedule":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            self.writer.between_writes(self.run_once)
            if self._stop.wait(self.interval_s):
                return

    def run_once(self) -> dict[str, int] | None:
        try:
            deleted = apply_retention(self.store, self.keep, self.clock())
        except (duckdb.Error, StoreError) as exc:
            log.warning("retention: %s", exc)
            try:
                self.store.add_counters({"retention_failures": 1})
            except duckdb.Error:  # a store that cannot delete may not count either; the log has it
                pass
            return None
        if any(deleted.values()):
            log.info("retention: deleted rows older than %s: %s", format_duration(self.keep.total_seconds()), deleted)
        return deleted
