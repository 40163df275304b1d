"""The DuckDB store: schema (versioned), and batch writes that are idempotent.

Every write of a batch is one transaction. Re-writing data that is already stored adds nothing: requests are
keyed by their trace and span ids, samples by (node, metric, attributes, ts), and a cumulative point at the time
of a stored point of its series is recognised as already seen (analytics/cumulative.py, which also places points
that arrive behind their series' last one).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from contextlib import contextmanager, suppress
from datetime import timedelta
from functools import cached_property
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from sloscope.analytics.cumulative import SERIES, CumulativeWrites
from sloscope.analytics.errors import StoreError
from sloscope.analytics.frames import REQUEST_KEY, Frames
from sloscope.analytics.rollups import Rollups, readers
from sloscope.analytics.sql_files import sql
from sloscope.analytics.store_base import ReaderBase, StoreBase

SCHEMA_VERSION = 7
# How DuckDB knows its own files: a block checksum of 8 bytes, then these magic bytes.
DUCKDB_MAGIC, DUCKDB_MAGIC_OFFSET = b"DUCK", 8
DEFAULT_DB = Path(os.environ.get("SLOSCOPE_DB", "var/sloscope.duckdb"))


NOT_A_DATABASE_FILE = "not a DuckDB database file; give a database sloscope wrote, or a new path to create one"


def refuse_other_files(path: Path) -> None:
    """StoreError for an existing file without DuckDB's header: DuckDB opens some files it does not own (a JSON
    file, a gzip file) as an in-memory database, and whatever was written then would be lost."""
    if not path.exists():
        return
    try:
        with open(path, "rb") as file:
            head = file.read(DUCKDB_MAGIC_OFFSET + len(DUCKDB_MAGIC))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the database: {exc.strerror}") from None
    if head[DUCKDB_MAGIC_OFFSET:] != DUCKDB_MAGIC:
        raise StoreError(f"{path}: {NOT_A_DATABASE_FILE}")


PARAMETER, COMMENT = re.compile(r"\$(\w+)"), re.compile(r"--[^\n]*")


def bound(query: str, params):
    """The parameters of `params` (a dict) that the query names: DuckDB refuses others, and a query read from a
    rollup names fewer than the one it stands for."""
    if not isinstance(params, dict):
        return params
    named = set(PARAMETER.findall(COMMENT.sub("", query)))
    return {k: v for k, v in params.items() if k in named}


class Reader(ReaderBase):
    """Queries over one DuckDB connection or cursor: what analysis needs of a store (analytics/store_api.py)."""

    read_only = True
    dialect, meta_table = "duckdb", "meta"

    def __init__(self, con, path: str | Path = "<cursor>"):
        self.con, self.path = con, Path(path)

    def sql(self, name: str, instead: dict[str, str] | None = None) -> str:
        """The query NAME of analytics/sql/, the relations named in `instead` replaced by those they map to."""
        return sql(name, instead)

    @cached_property
    def _rollups(self) -> Rollups:
        """Rollups made where this store is open for writing, read wherever they are current."""
        return Rollups(self, readers("signal_steps", timedelta(0)), fills=not self.read_only)

    def tier_params(self, spec) -> dict:
        """Parameters a requests query needs to resolve tiers: none here, where ingest resolved them."""
        return {}

    def frame(self, query: str, params=None) -> pl.DataFrame:
        return self.con.sql(query, params=bound(query, params)).pl()

    def rows(self, query: str, params=None) -> list[tuple]:
        return self.con.execute(query, bound(query, params) or []).fetchall()

    def meta(self, key: str) -> str | None:
        return self.scalar("SELECT value FROM meta WHERE key = ?", [key])

    def tables(self) -> set[str]:
        return {name for (name,) in self.rows("SELECT table_name FROM information_schema.tables")}

    def counters(self) -> dict[str, int]:
        return dict(self.rows("SELECT name, value FROM ingest_counters ORDER BY name"))


class Store(CumulativeWrites, Reader, StoreBase):
    def __init__(self, path: str | Path = DEFAULT_DB, read_only: bool = False, memory_limit: str = "3GB"):
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no such database (ingest something first)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.memory_limit = memory_limit
        refuse_other_files(self.path)
        self.con = self._connect()
        self._refuse_unless_file_backed()
        if not read_only:
            self._migrate()
        self._check_version()

    def _connect(self):
        try:
            return duckdb.connect(str(self.path), read_only=self.read_only,
                                  config={"memory_limit": self.memory_limit, "preserve_insertion_order": False})
        except duckdb.Error as exc:
            raise StoreError(f"{self.path}: cannot open the database: {exc}") from None

    def _refuse_unless_file_backed(self) -> None:
        """Whatever else DuckDB may open as an in-memory database is refused too: nothing written would last."""
        (path,), = self.con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
                                    ).fetchall()
        if path is None:
            self.con.close()
            raise StoreError(f"{self.path}: {NOT_A_DATABASE_FILE}")

    def reopen(self) -> None:
        """A new connection, for a database DuckDB invalidated after a fatal error (it refuses everything on the
        old one); opening replays its write-ahead log. Readers from `reader()` after this use the new one."""
        with suppress(duckdb.Error):  # an invalidated connection may fail to close; it is dropped either way
            self.con.close()
        self.con = self._connect()

    def execute(self, statement: str, params: dict | None = None) -> None:
        try:
            self.con.execute(statement, bound(statement, params) or [])
        except duckdb.Error as exc:
            raise StoreError(f"{self.path}: statement failed: {exc}") from None

    def insert(self, table: str, data: pa.Table) -> None:
        """The rows of `data` into `table`, by column name; its times with a time zone are UTC, as the store's."""
        naive = pa.schema([f.with_type(pa.timestamp(f.type.unit)) if pa.types.is_timestamp(f.type) else f
                           for f in data.schema])
        with self._registered("incoming", data.cast(naive)):
            self.execute(f"INSERT INTO {table} BY NAME SELECT * FROM incoming")

    def close(self) -> None:
        self.con.close()

    def cursor(self):
        """A new cursor of the current connection (the writer may have reopened it), for tables kept beside the
        store's in its file: the remediation audit (alerts/audit.py)."""
        return self.con.cursor()

    def probe(self) -> None:
        """A small committed write: raises when the store cannot commit at all."""
        with self.transaction():
            self.set_meta("writer_probe", str(time.time_ns()))

    @contextmanager
    def transaction(self):
        """The statements inside as one transaction: committed at the end, rolled back on any error."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
            self.con.execute("COMMIT")
        except BaseException:
            # A failed COMMIT has already ended the transaction: rolling back then fails, and must not hide why.
            with suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            raise

    # --- schema ---------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        """Create what is missing; bring a store of an older version to this one, a version per transaction."""
        self.con.execute(sql("schema"))
        self.con.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        found = int(self.meta("schema_version"))
        for version in range(found + 1, SCHEMA_VERSION + 1):
            try:
                with self.transaction():
                    self.con.execute(sql(f"migrate_to_{version}"))
                    self.set_meta("schema_version", str(version))
            except duckdb.Error as exc:
                self.con.close()
                raise StoreError(f"{self.path}: cannot migrate from schema version {version - 1} to {version}: "
                                 f"{exc}") from None
        self.con.execute(sql("cumulative_points_from_state"))

    def _check_version(self) -> None:
        try:
            found = self.scalar("SELECT value FROM meta WHERE key = 'schema_version'")
        except duckdb.CatalogException:
            raise StoreError(f"{self.path}: not a sloscope database (no meta table)") from None
        if found is None or int(found) != SCHEMA_VERSION:
            older = found is not None and int(found) < SCHEMA_VERSION
            raise StoreError(f"{self.path}: schema version {found}, this sloscope reads version {SCHEMA_VERSION}"
                             + ("; opening it for writing (sloscope serve or ingest) migrates it" if older else ""))

    def reader(self) -> Reader:
        """A reader on its own cursor, for another thread than the one writing."""
        return Reader(self.cursor(), self.path)

    @contextmanager
    def reading(self):
        """A reader for one use, from any thread: its own cursor of the current connection, closed after. Its
        queries read one snapshot (a transaction), so that a commit between two of them (a write, a retention
        run) is seen by all of them or none: /metrics' request families read the kept and the retired counts."""
        reader = self.reader()
        try:
            reader.con.execute("BEGIN TRANSACTION")
            yield reader
        finally:
            reader.con.close()

    def live_reader(self) -> "LiveReader":
        """A reader for one thread at a time that outlives `reopen` (a `reader()` would keep the closed
        connection)."""
        return LiveReader(self)

    def set_meta(self, key: str, value: str) -> None:
        self.con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    # --- counters -------------------------------------------------------------------------------------

    def add_counters(self, counts: dict[str, int]) -> None:
        rows = [(k, int(v)) for k, v in counts.items() if v]
        if rows:  # one statement, not one per counter: it is part of every commit
            self.con.execute(
                f"INSERT INTO ingest_counters VALUES {', '.join(['(?, ?)'] * len(rows))} "
                "ON CONFLICT (name) DO UPDATE SET value = ingest_counters.value + excluded.value",
                [x for row in rows for x in row])

    def gpu_nodes(self) -> dict[str, str]:
        """GPU UUID -> the node it was last seen on."""
        return {gpu: node for node, gpu in self.rows(sql("gpu_topology"))}

    # --- writes ---------------------------------------------------------------------------------------

    def write(self, frames: "Frames", extra_counts: dict[str, int] | None = None) -> dict[str, int]:
        """Store decoded rows and their ingest counters in one transaction; returns the counters, which include
        how many rows were added and skipped, by kind."""
        counts = Counter(extra_counts or {})
        with self.transaction():
            if not frames.spans.is_empty():
                counts.update(self._write_requests(frames.requests))
                counts.update(self._write_graph_spans(frames.graph_spans))
            if not frames.points.is_empty():
                counts.update(self._write_points(frames.points))
            if not frames.histograms.is_empty():
                counts.update(self._write_histograms(frames.histograms))
            self.add_counters(counts)
        return counts

    def _insert_new(self, table: str, frame: pl.DataFrame, key: list[str], time_column: str,
                    check_first: str | None = None) -> int:
        """Insert the rows of frame whose key is not stored yet (nor repeated within frame). check_first: a key
        column that seldom repeats; where none of its values does, neither does the key, and the search for
        repeats (which gathers every column) is skipped."""
        if frame.is_empty():
            return 0
        if check_first is None or frame[check_first].n_unique() < len(frame):
            frame = frame.unique(subset=key, keep="first")
        else:  # in one chunk, as unique() leaves it: DuckDB reads a writer's batch of many requests' chunks slower
            frame = frame.rechunk()
        lo, hi = frame[time_column].min(), frame[time_column].max()
        with self._registered("incoming", frame):
            cols = ", ".join(frame.columns)
            keys = ", ".join(key)
            (added,), = self.con.execute(
                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM incoming ANTI JOIN "
                f"(SELECT {keys} FROM {table} WHERE {time_column} BETWEEN ? AND ?) stored USING ({keys})",
                [lo, hi]).fetchall()  # an INSERT answers the number of rows it inserted
        return added

    @contextmanager
    def _registered(self, name: str, frame: pl.DataFrame | pa.Table):
        """frame as a view for the statements inside; a failed statement's error is the one that surfaces (an
        aborted transaction also fails the unregistering, which would hide why)."""
        self.con.register(name, frame)
        try:
            yield
        except BaseException:
            with suppress(duckdb.Error):
                self.con.unregister(name)
            raise
        self.con.unregister(name)

    def _write_requests(self, frame: pl.DataFrame) -> dict[str, int]:
        added = self._insert_new("requests", frame, REQUEST_KEY, "start_time", check_first="span_id")
        return {"requests_loaded": added, "requests_duplicate": len(frame) - added}

    def _write_graph_spans(self, frame: pl.DataFrame) -> dict[str, int]:
        added = self._insert_new("spans", frame, REQUEST_KEY, "start_time", check_first="span_id")
        return {"spans_loaded": added, "spans_duplicate": len(frame) - added}

    def _write_points(self, frame: pl.DataFrame) -> dict[str, int]:
        direct = frame.filter(~pl.col("cumulative")).with_columns(
            interval_s=pl.when(pl.col("is_sum") & (pl.col("start_ns") > 0) & (pl.col("start_ns") < pl.col("time_ns")))
            .then((pl.col("time_ns") - pl.col("start_ns")) / 1e9))
        cumulative = self._cumulative_to_delta(frame.filter(pl.col("cumulative")), "sum")
        rows = pl.concat([
            direct.select(SERIES + ["time_ns", "value", "interval_s"]),
            cumulative.rows.select(SERIES + ["time_ns", "value", "interval_s"]),
        ]).with_columns(ts=pl.from_epoch("time_ns", time_unit="ns").dt.cast_time_unit("us")).drop("time_ns")
        added = self._insert_new("samples", rows, ["ts"] + SERIES, "ts")
        return {"samples_loaded": added, "samples_duplicate": cumulative.duplicates + len(rows) - added,
                "samples_recounted": cumulative.recounted, "points_without_baseline": cumulative.without_baseline}

    def _write_histograms(self, frame: pl.DataFrame) -> dict[str, int]:
        direct = frame.filter(~pl.col("cumulative")).with_columns(
            interval_s=pl.when((pl.col("start_ns") > 0) & (pl.col("start_ns") < pl.col("time_ns")))
            .then((pl.col("time_ns") - pl.col("start_ns")) / 1e9))
        cumulative = self._cumulative_to_delta(frame.filter(pl.col("cumulative")), "histogram")
        # Cumulative min/max cover the whole life of the series, not the interval: not kept for deltas.
        deltas = cumulative.rows.with_columns(min=pl.lit(None, pl.Float64), max=pl.lit(None, pl.Float64))
        columns = SERIES + ["time_ns", "interval_s", "count", "sum", "min", "max", "buckets"]
        rows = pl.concat([direct.select(columns), deltas.select(columns)]).filter(pl.col("count") > 0).with_columns(
            ts=pl.from_epoch("time_ns", time_unit="ns").dt.cast_time_unit("us")).drop("time_ns")
        added = self._insert_new("histograms", rows, ["ts"] + SERIES, "ts")
        return {"histograms_loaded": added, "histograms_duplicate": cumulative.duplicates + len(rows) - added,
                "histograms_recounted": cumulative.recounted, "points_without_baseline": cumulative.without_baseline}


class LiveReader(Reader):
    """A reader on a cursor of its store's current connection, taking a new one after the store reopened."""

    def __init__(self, store: Store):
        self.store, self.path = store, store.path
        self._parent = self._cursor = None

    @property
    def con(self):
        if self._parent is not self.store.con:
            self._parent, self._cursor = self.store.con, self.store.con.cursor()
        return self._cursor
