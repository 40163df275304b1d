"""The store interface: what the analysis (analytics/slo.py, attribution.py, rca.py), /metrics
(alerts/store_metrics.py), the sampling policy (sampling/observations.py) and the report (dashboards/report.py)
may call on a store, whichever it is: the DuckDB store (analytics/store.py) or the ClickHouse store over the
Collector's ClickHouse exporter's tables
(analytics/clickhouse_store.py). analytics/stores.py opens one from its URL.

Queries are the files of the store's dialect, by name: analytics/sql/ for DuckDB, analytics/sql/clickhouse/ for
ClickHouse. `sql(name)` gives a query's text, and `frame`, `rows` and `scalar` run a text with its parameters: a
dict, each named in the query as its dialect writes them ($since, {since:DateTime64(6)}); times are naive UTC.
Frames come back with the same column types from both stores.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable

import polars as pl

from sloscope.slo_spec import SloSpec

from sloscope.analytics.frames import Frames


@runtime_checkable
class StoreReader(Protocol):
    """The queries of a store, for one thread: a store's `reading()` gives one (a store answers them too)."""

    dialect: str  # "duckdb" or "clickhouse": whose files `sql` reads
    path: Path | str  # what the store is, for messages: its DuckDB file, or its URL
    read_only: bool  # False where it may write: rollups as it reads (roll_up), the spec it is given (spec)

    def sql(self, name: str, instead: dict[str, str] | None = None) -> str:
        """The text of the query NAME, each relation it inlines that `instead` names replaced by the one it maps
        to."""

    def frame(self, query: str, params=None) -> pl.DataFrame:
        """The rows of a query as a frame."""

    def rows(self, query: str, params=None) -> list[tuple]:
        """The rows of a query as tuples."""

    def scalar(self, query: str, params=None):
        """The first column of a query's first row; None where it has no row."""

    def computed(self, name: str, params: dict) -> pl.DataFrame:
        """The rows of the query NAME, read from sloscope's rollups where they are current (analytics/rollups.py),
        else computed from the stored rows."""

    def roll_up(self, name: str, params: dict) -> None:
        """The rollups of the query NAME over [since, until) made ahead of analysis, where this store may write."""

    def tier_params(self, spec: SloSpec) -> dict:
        """The parameters a query over requests needs to resolve their tiers by `spec`."""

    def meta(self, key: str) -> str | None:
        """What the store recorded under `key`."""

    def tables(self) -> set[str]:
        """The tables the store holds, by the names its queries give them."""

    def counters(self) -> dict[str, int]:
        """The ingest counters: name -> count."""

    def slo_spec(self) -> SloSpec:
        """The SLO spec recorded with the store (by the last command given --slo), else the built-in one."""

    def spec(self, path: str | Path | None = None) -> SloSpec:
        """The SLO spec a command runs with: the file given (recorded with the store where it may write), else
        the recorded one, else the built-in one."""


@runtime_checkable
class StoreApi(StoreReader, Protocol):
    """An open store: its queries, readers for other threads, what ingest writes; closed at the end of a `with`."""

    def reading(self) -> AbstractContextManager[StoreReader]:
        """A reader for one use, from any thread: on DuckDB its own cursor, whose queries read one snapshot; on
        ClickHouse the store itself, whose queries take turns."""

    def gpu_nodes(self) -> dict[str, str]:
        """GPU UUID -> the node it was last seen on."""

    def write(self, frames: Frames, extra_counts: dict[str, int] | None = None) -> dict[str, int]:
        """Decoded rows into the store, with ingest counters; returns the counters, with the rows loaded."""

    def close(self) -> None:
        """Releases the store's connection."""

    def __enter__(self) -> StoreApi: ...

    def __exit__(self, *exc) -> None: ...
