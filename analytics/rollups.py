"""Rollups: a store's SLI windows and signal steps kept per chunk of time in tables of sloscope's own, so that an
analysis reads what earlier ones computed instead of every span and point again. The ClickHouse store fills them as
it reads (the Collector writes the exporter's tables); the DuckDB store when it is open for writing (`sloscope
ingest`), and reads them wherever they are current.

The chunks lie on a grid of about a minute (a whole number of the query's steps) from 2000-01-03, where the
queries align their windows and steps. A chunk's rows are one batch, and a header row, written after them, names
the source rows they were computed from: the count and a digest of the rows in the chunk (for the ClickHouse
store's signal steps, also in the 5 minutes before it, where a counter's previous point may lie). A batch is read
only while the tables still give that count and digest; rows that arrived late, a copy, rows that changed (the
DuckDB store's late cumulative points, requests moved to their node), or rows that TTL or retention dropped make
the chunk computed again. A header means the whole batch is in; a batch without one (a write cut short) is never
read.

The rolled-up rows are the raw query's exactly: a window's or a step's rows depend on its own spans or points and,
for a ClickHouse cumulative series, on the point before each within 5 minutes (signal_series_steps.sql), never on
where the range begins. A range that cuts a window or step holding rows outside the range is read from the raw
tables, as is every range where sloscope may not create or write its tables (a read-only ClickHouse user): a
warning says so once.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pyarrow as pa

from sloscope.analytics import exporter_tables
from sloscope.analytics.errors import StoreError

log = logging.getLogger("sloscope.rollups")
GRID_ORIGIN = datetime(2000, 1, 3)  # where DuckDB's time_bucket, and the queries with it, align steps
CHUNK_S = 60
POINT_LOOKBACK = timedelta(minutes=5)  # signal_series_steps.sql: how far back a cumulative point's predecessor is
# ClickHouse's rollup_tables.sql drops a day's rollups this long after it, a part at a time: a header may outlive
# its rows, so none is read within a day of that.
KEPT = timedelta(days=8)
SUPERSEDED_AFTER_S = 60  # a replaced batch is deleted once this old, so that a query reading it has finished
# How long a single node's query reads the batches last chosen for the fleet's over the same range without checking
# the tables again: an analysis reads a window for the fleet and then for its node, as one look at the tables.
REUSE_S = 5.0
MAX_CHUNKS = 1440  # a range of more chunks than this (a day's) is read raw: the batches chosen go in the query
MAX_RUN = 60  # chunks computed by one query (an hour's), so that rolling up days holds an hour's rows at a time
RETRY_S = 600  # after the server refused a rollup's statement, analyses read the raw tables this long
SLI_TABLE, STEP_TABLE = "sloscope_sli_rollup", "sloscope_step_rollup"  # made by rollup_tables.sql


@dataclass(frozen=True)
class Rollup:
    """One rolled-up query: `relation` is what a query names in double braces and `reads` rolls it up."""

    relation: str  # the query's own name, or the relation of it that the rollup stands for
    table: str
    fill: str  # writes whole chunks' batches (analytics/sql/clickhouse/)
    reads: str  # the relation read from the chosen batches
    slices: str  # counts and digests the source rows per chunk
    keyed_by: tuple[str, ...]  # the parameters its rows depend on, besides the range
    lookback: timedelta


def readers(steps_relation: str, point_lookback: timedelta) -> dict[str, "Rollup"]:
    """The queries that read a rollup, in a dialect whose signal steps are the relation `steps_relation` and depend
    on points up to `point_lookback` before them: sli_windows is its rollup's own query; signal_steps and
    fleet_movement read the steps' relation."""
    sli = Rollup("sli_windows", SLI_TABLE, "sli_rollup_fill", "sli_rollup", "span_slices",
                 ("allowed_tiers", "default_tier", "tiers", "thresholds_ms", "step_s", "named_tiers", "tier_services",
                  "service_keys", "service_thresholds_ms", "parent_lookback_s", "ttft_thresholds_ms",
                  "tpot_thresholds_ms", "queue_thresholds_ms"), timedelta(0))
    steps = Rollup(steps_relation, STEP_TABLE, "step_rollup_fill", "step_rollup", "point_slices",
                   ("seed", "metrics", "unknown_node", "step_s"), point_lookback)
    return {"sli_windows": sli, "signal_steps": steps, "fleet_movement": steps}


def _micros(t: datetime) -> int:
    return (t - GRID_ORIGIN) // timedelta(microseconds=1)


def _time(micros: int) -> datetime:
    return GRID_ORIGIN + timedelta(microseconds=micros)


def _wrapped(n: int) -> int:
    """n as a signed 64-bit integer, as ClickHouse's sums of digests wrap."""
    return (n + 2**63) % 2**64 - 2**63


@dataclass(frozen=True)
class Grid:
    """The steps and chunks that a range [since, until) lies on, in microseconds from GRID_ORIGIN."""

    step: int
    chunk: int
    since: int
    until: int

    @classmethod
    def of(cls, params: dict) -> "Grid":
        step = round(params["step_s"] * 1e6)
        # A day inside the times the exporter's columns hold, so that a chunk's bounds stay within them.
        since = max(params["since"], exporter_tables.FIRST_TIME + timedelta(days=1))
        until = min(params["until"], exporter_tables.LAST_TIME - timedelta(days=1))
        return cls(step, step * math.ceil(CHUNK_S * 1e6 / step), _micros(since), _micros(until))

    @property
    def first_chunk(self) -> int:
        return _floor(self.since, self.chunk)

    @property
    def end_chunk(self) -> int:
        return _ceil(self.until, self.chunk)


def _floor(t: int, size: int) -> int:
    return t // size * size


def _ceil(t: int, size: int) -> int:
    return -(-t // size) * size


class Rollups:
    """The rollups of one store: of the queries `readers` names (readers())."""

    def __init__(self, store, readers: dict[str, Rollup], *, fills: bool = True, named=lambda text: text,
                 columns: str = "", kept: timedelta | None = None):
        """`fills`: whether the store may make and write the rollups (else it reads those that are current).
        `named` gives a query the tables' names as the exporter's settings have them; `columns` is the text of
        sloscope's derived columns (derived_columns.sql), on which the rows depend. `kept`: how long the tables
        keep a day's rollups, where they drop them by themselves."""
        self.store, self.readers, self.fills, self.named, self.columns = store, readers, fills, named, columns
        self.kept = kept
        self._made = False  # whether the tables were made (or found)
        self._retry_at = 0.0  # monotonic time before which the raw tables are read
        self._kept_replaced = False  # whether deleting replaced batches was refused (said once)
        self._recent: tuple[tuple, float, dict] | None = None  # the last batches chosen: (range, when, batches)
        self._texts: dict[Rollup, str] = {}  # what each rollup's key is taken over besides its parameters

    def query(self, name: str, params: dict) -> tuple[str, dict] | None:
        """The query NAME over its rollup, with its parameters, or None where it must read the raw tables. A query
        of the whole fleet fills the chunks the rollup lacks; one of a single node only reads what is there."""
        rollup = self.readers.get(name)
        if rollup is None or not self._ready():
            return None
        fill, key = self.fills and not params.get("node"), self._key(rollup, params)
        try:
            chosen = (None if fill else self._reused(rollup, key, params)) or self._batches(rollup, key, params, fill)
        except StoreError as exc:
            self._give_up(exc)
            return None
        if chosen is None:
            return None
        query = self.store.sql(rollup.reads) if name == rollup.relation else \
            self.store.sql(name, {rollup.relation: rollup.reads})
        return query, {**params, **chosen}

    def fill(self, name: str, params: dict) -> None:
        """The chunks of NAME's rollup that [since, until) touches, computed where they lack a batch (in a store
        that keeps them for a while, those inside it: older ones would be dropped)."""
        if not self.fills:
            return
        grid = Grid.of(params)
        first = grid.first_chunk
        horizon = self._horizon()
        if horizon is not None:  # from a chunk after the horizon's, which moves on while this runs
            first = max(first, _ceil(_micros(horizon), grid.chunk) + grid.chunk)
        for start in range(first, grid.end_chunk, MAX_CHUNKS * grid.chunk):
            end = min(start + MAX_CHUNKS * grid.chunk, grid.end_chunk)
            self.query(name, {**params, "node": "", "since": _time(start), "until": _time(end)})

    def _reused(self, rollup: Rollup, key: int, params: dict) -> dict | None:
        if self._recent is None:
            return None
        asked, when, chosen = self._recent
        return chosen if asked == (rollup, key, params["since"], params["until"]) and \
            time.monotonic() - when < REUSE_S else None

    def _ready(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        if not self._made:
            if not self.fills:  # a reader uses the tables where a writer made them
                self._made = {r.table for r in self.readers.values()} <= self.store.tables()
                if not self._made:
                    self._retry_at = time.monotonic() + RETRY_S
                return self._made
            try:
                for statement in self.store.sql("rollup_tables").split("\n;\n"):
                    self.store.execute(statement)
            except StoreError as exc:
                self._give_up(exc)
                return False
            self._made = True
        return True

    def _give_up(self, exc: StoreError) -> None:
        log.warning("analyses read the raw tables without sloscope's rollups for %d minutes: %s", RETRY_S // 60, exc)
        self._retry_at = time.monotonic() + RETRY_S

    def _horizon(self) -> datetime | None:
        """The oldest time whose rollups are read, in a store that drops them: a day inside what it keeps."""
        if self.kept is None:
            return None
        return datetime.now(timezone.utc).replace(tzinfo=None) - self.kept + timedelta(days=1)

    def _batches(self, rollup: Rollup, key: int, params: dict, fill: bool) -> dict | None:
        grid = Grid.of(params)
        horizon = self._horizon()
        if horizon is not None and _time(grid.first_chunk) < horizon or \
                grid.end_chunk - grid.first_chunk > MAX_CHUNKS * grid.chunk:
            return None
        headers = self._headers(rollup, key, grid)
        inside = range(grid.first_chunk + grid.chunk, grid.end_chunk - grid.chunk, grid.chunk)
        if not fill and not {chunk for chunk, *_ in headers}.issuperset(inside):
            # A chunk it cannot fill (new rows not rolled up yet) makes it read the raw tables: the source rows are
            # not fingerprinted for nothing. The range's first and last chunk may hold no rows, so have no batch.
            return None
        slices = self._slices(rollup, params, grid)
        if slices is None:
            return None
        chosen, replaced = _current(headers, slices)
        missing = [c for c in sorted(slices) if c not in chosen]
        if missing and not fill:
            return None
        for run in _runs(missing, chosen):
            chosen.update(self._fill(rollup, params, key, grid, run, slices))
        if missing and replaced:
            self._delete(rollup, key, replaced)
        found = {"rollup_parameters": key, "rollup_batches": sorted(chosen.values()),
                 "chunk_origin": _time(grid.first_chunk), "first_step": _time(_floor(grid.since, grid.step))}
        self._recent = (rollup, key, params["since"], params["until"]), time.monotonic(), found
        return found

    def _slices(self, rollup: Rollup, params: dict, grid: Grid) -> dict[int, tuple[int, int]] | None:
        """Of each chunk of the range that holds source rows: (rows, digest) of the rows its batch is computed from
        (its own and its lookback's). None where a window or step of the range holds rows outside it."""
        lookback = _ceil(rollup.lookback // timedelta(microseconds=1), grid.chunk)
        first = grid.first_chunk - lookback
        slices = self.store.frame(self.store.sql(rollup.slices), {
            "since": _time(first), "until": _time(grid.end_chunk), "chunk_origin": _time(first),
            "chunk_us": grid.chunk, "range_start": params["since"], "range_end": params["until"],
            "first_step": _time(_floor(grid.since, grid.step)),
            "last_step_end": _time(_ceil(grid.until, grid.step))})
        if slices["outside"].sum():
            return None
        own = {first + n * grid.chunk: (rows, digest) for n, rows, digest in
               slices.select("chunk", "source_rows", "source_digest").iter_rows()}
        around = [(c, [own.get(s, (0, 0)) for s in range(c - lookback, c + 1, grid.chunk)])
                  for c in own if c >= grid.first_chunk]
        return {c: (sum(rows for rows, _ in counted), _wrapped(sum(digest for _, digest in counted)))
                for c, counted in around}

    def _key(self, rollup: Rollup, params: dict) -> int:
        """What a batch's rows depend on besides their range: the query's text as sent (the tables' names), the
        expressions of sloscope's columns, and the query's parameters."""
        if rollup not in self._texts:  # the store's text of a query does not change while it is open
            self._texts[rollup] = self.named(self.store.sql(rollup.fill)) + self.columns
        text = self._texts[rollup] + json.dumps({k: params[k] for k in rollup.keyed_by if k in params},
                                                sort_keys=True)
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True)

    def _headers(self, rollup: Rollup, key: int, grid: Grid) -> list[tuple[int, int, int, int]]:
        """(chunk, batch, source rows, source digest) of the whole batches stored for the range, oldest first."""
        return [(_micros(start), batch, rows, digest) for start, batch, rows, digest in self.store.rows(
            self._of(rollup, "rollup_headers"),
            {"key": key, "first": _time(grid.first_chunk), "until": _time(grid.end_chunk)})]

    def _fill(self, rollup: Rollup, params: dict, key: int, grid: Grid, chunks: list[int],
              sources: dict) -> dict[int, int]:
        """Batches of these chunks (a run: no chunk between them has one), computed and written with their
        headers."""
        start, end = chunks[0], chunks[-1] + grid.chunk
        batches = [secrets.randbits(63) for _ in chunks]
        with self.store.transaction():
            self.store.execute(self.store.sql(rollup.fill), {
                **params, "node": "", "since": _time(start), "until": _time(end), "rollup_parameters": key,
                "rollup_chunks": [(c - start) // grid.chunk for c in chunks], "rollup_batches": batches,
                "chunk_origin": _time(start), "chunk_us": grid.chunk})
            self.store.insert(rollup.table, pa.table({
                "parameters": pa.array([key] * len(chunks), pa.int64()),
                "chunk_start": pa.array([_time(c) for c in chunks], pa.timestamp("us", "UTC")),
                "batch": pa.array(batches, pa.int64()), "header": pa.array([True] * len(chunks)),
                "source_rows": pa.array([sources[c][0] for c in chunks], pa.int64()),
                "source_digest": pa.array([sources[c][1] for c in chunks], pa.int64())}))
        return dict(zip(chunks, batches))

    def _of(self, rollup: Rollup, name: str) -> str:
        """The query NAME, of the rollup's table (written `rollup_table` in it)."""
        return re.sub(r"\brollup_table\b", rollup.table, self.store.sql(name))

    def _delete(self, rollup: Rollup, key: int, batches: list[int]) -> None:
        """Replaced batches deleted once old enough that no query still reads them (a batch still being written has
        no header, so is never among them); where the server refuses (a lightweight DELETE needs ClickHouse 23.3),
        they are left, and only cost room until the tables' TTL."""
        try:
            self.store.execute(self._of(rollup, "replaced_rollups"),
                               {"key": key, "batches": batches, "superseded_after_s": SUPERSEDED_AFTER_S})
        except StoreError as exc:
            if not self._kept_replaced:
                log.warning("replaced rollup batches are kept: %s", exc)
            self._kept_replaced = True


def _current(headers: list[tuple[int, int, int, int]], sources: dict) -> tuple[dict[int, int], list[int]]:
    """chunk -> the newest batch of `headers` computed from the rows the tables hold now (`sources`); and the
    batches computed from other rows."""
    current = {(chunk, batch): sources.get(chunk) == (rows, digest) for chunk, batch, rows, digest in headers}
    return ({chunk: batch for (chunk, batch), same in current.items() if same},
            [batch for (_, batch), same in current.items() if not same])


def _runs(missing: list[int], chosen: dict[int, int]) -> list[list[int]]:
    """The chunks that lack a batch, in runs that no chunk with one interrupts, of at most MAX_RUN: each run is
    computed by one query."""
    have, runs = sorted(chosen), []
    for chunk in missing:
        if runs and len(runs[-1]) < MAX_RUN and \
                bisect.bisect_left(have, chunk) == bisect.bisect_right(have, runs[-1][-1]):
            runs[-1].append(chunk)
        else:
            runs.append([chunk])
    return runs
