"""The ClickHouse store: the OpenTelemetry Collector clickhouseexporter's tables, read (and, for `sloscope ingest`,
written) through chDB in-process or a ClickHouse server over HTTP (clickhouse-connect).

It answers the same queries as the DuckDB store, in ClickHouse's dialect (analytics/sql/clickhouse/), so the
analysis that consumes their frames is the one of analytics/slo.py and analytics/attribution.py. The frames come
back with DuckDB's column types: naive UTC datetimes, Int64 counts, Float64 values, String text.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from sloscope.metric_rules import FAMILY_PREFIX, FAMILY_RULE, VALUE_LIMIT, kept_metrics

from sloscope.analytics import exporter_tables
from sloscope.analytics.errors import StoreError
from sloscope.analytics.frames import Frames
from sloscope.analytics.rollups import KEPT, POINT_LOOKBACK, Rollups, readers
from sloscope.analytics.sql_files import clickhouse_sql
from sloscope.analytics.store_base import StoreBase

log = logging.getLogger("sloscope.clickhouse_store")
META_TABLE, COUNTERS_TABLE = "sloscope_meta", "sloscope_counters"
PARAMETER = re.compile(r"\{(\w+):([^{}]+)\}")
# Distributed(cluster, database, table[, sharding key]): each name quoted or not, the database maybe left to the
# default (an empty name, or currentDatabase()).
DISTRIBUTED = re.compile(r"Distributed\(\s*'?([^',()]*)'?\s*,\s*'?([^',()]*(?:\(\))?)'?\s*,\s*'?([^',()\s]+)'?")
DERIVED_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+)\s+.+?\s+MATERIALIZED\s+(.+)", re.S)


def statements(name: str) -> list[str]:
    """The statements of a DDL file of analytics/sql/clickhouse/ (separated by a line holding only ";")."""
    return clickhouse_sql(name).split("\n;\n")


def catalog_rules() -> dict:
    """The rules by which the decoders read a catalog signal's points (sloscope/metric_rules.py), by name."""
    rules = kept_metrics()
    return {"node_attributes": {name: r.node_attribute for name, r in rules.items() if r.node_attribute},
            "resource_attributes": {name: list(r.resource_attributes) for name, r in rules.items()
                                    if r.resource_attributes},
            "blank_from": {name: r.blank_from for name, r in rules.items() if math.isfinite(r.blank_from)},
            "value_low": {name: r.low for name, r in rules.items() if r.low != -VALUE_LIMIT},
            "value_high": {name: r.high for name, r in rules.items() if r.high != VALUE_LIMIT},
            "value_limit": VALUE_LIMIT,
            "dropped_attributes": {name: sorted(r.dropped_attributes) for name, r in rules.items()
                                   if r.dropped_attributes},
            "counters": [name for name, r in rules.items() if r.counter],
            "family_prefix": FAMILY_PREFIX, "family_node_attribute": FAMILY_RULE.node_attribute,
            "family_blank_from": FAMILY_RULE.blank_from,
            "family_dropped_attributes": sorted(FAMILY_RULE.dropped_attributes)}


@functools.cache
def derived_column_statements() -> tuple[str, ...]:
    """The statements of derived_columns.sql with the catalog's rules written in, each a literal of its type."""
    rules = catalog_rules()
    return tuple(PARAMETER.sub(lambda m: f"CAST({sql_literal(rules[m.group(1)])}, {sql_literal(m.group(2))})", s)
                 for s in statements("derived_columns"))


def modifying(statement: str) -> str:
    """A statement of derived_column_statements() that gives an existing column this release's expression."""
    return statement.replace(" ADD COLUMN IF NOT EXISTS ", " MODIFY COLUMN ", 1)


def derived_columns() -> dict[str, dict[str, str]]:
    """table -> {column: expression} of the columns derived_columns.sql adds to the exporter's tables."""
    found: dict[str, dict[str, str]] = {}
    for statement in derived_column_statements():
        table, column, expression = DERIVED_COLUMN.search(statement).groups()
        found.setdefault(table, {})[column] = expression.strip()
    return found


def literal(value) -> str:
    """A query parameter in ClickHouse's text form (how chDB takes them): as in TSV, a backslash, tab or newline of
    a string is escaped (a node name may hold any of them), and an array is a quoted literal."""
    if isinstance(value, datetime):
        return value.isoformat(" ", "microseconds")
    if isinstance(value, (list, tuple, frozenset, set)):
        return sql_literal(list(value))
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def sql_literal(value) -> str:
    """A value as a ClickHouse SQL literal: numbers, quoted strings, arrays and maps of them."""
    if isinstance(value, dict):
        return "map(" + ", ".join(f"{sql_literal(k)}, {sql_literal(v)}" for k, v in value.items()) + ")"
    if isinstance(value, (list, tuple, frozenset, set)):
        return "[" + ",".join(sql_literal(v) for v in value) + "]"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


class ChdbBackend:
    """ClickHouse in this process (chDB), on the database directory `path`."""

    def __init__(self, path: Path, database: str):
        try:
            from chdb import session  # optional (sloscope[clickhouse]): imported only for a chdb:// store
        except ImportError:
            raise StoreError("chdb:// needs chDB: pip install 'sloscope[clickhouse]'") from None
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"chdb:///{path}: cannot make the database directory: {exc.strerror}") from None
        self.session = session.Session(str(path))
        self.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
        self.execute(f"USE {database}")
        self.execute("SET session_timezone = 'UTC'")

    def execute(self, query: str, params: dict | None = None) -> None:
        self.session.query(query, "CSV", params={k: literal(v) for k, v in (params or {}).items()})

    def arrow(self, query: str, params: dict | None = None) -> pa.Table:
        result = self.session.query(query, "ArrowStream", params={k: literal(v) for k, v in (params or {}).items()})
        data = result.bytes()
        return ipc.open_stream(data).read_all() if data else pa.table({})

    def insert(self, table: str, data: pa.Table) -> None:
        # chDB reads Arrow from a file; the insert names its columns, the others take the table's defaults.
        with tempfile.NamedTemporaryFile(suffix=".arrow") as tmp:
            with ipc.new_stream(tmp.name, data.schema) as out:
                out.write_table(data)
            columns = ", ".join(data.column_names)
            self.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM file('{tmp.name}', 'ArrowStream')")

    def close(self) -> None:
        self.session.close()


@contextmanager
def _quiet_drivers():
    """The HTTP drivers' own warnings held back: a failed connect is said once, in the StoreError that names it."""
    loggers = [logging.getLogger(name) for name in ("urllib3", "clickhouse_connect")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def root_cause(exc: BaseException) -> str:
    """What went wrong: where the driver wrapped a failed connection, the system's reason ("Connection refused",
    not urllib3's pool and object addresses around it); otherwise the error's own message (a server's)."""
    inner = exc
    while (wrapped := inner.__cause__ or inner.__context__) is not None:
        inner = wrapped
    return inner.strerror if isinstance(inner, OSError) and inner.strerror else str(exc)


class HttpBackend:
    """A ClickHouse server over HTTP (clickhouse-connect)."""

    def __init__(self, host: str, port: int, user: str, password: str, database: str):
        try:
            import clickhouse_connect  # optional (sloscope[clickhouse]): imported only for a clickhouse:// store
        except ImportError:
            raise StoreError("clickhouse:// needs clickhouse-connect: pip install 'sloscope[clickhouse]'") from None
        try:
            with _quiet_drivers():
                self.client = clickhouse_connect.get_client(host=host, port=port, username=user, password=password,
                                                            database=database, settings={"session_timezone": "UTC"})
        except Exception as exc:  # the driver's errors have no common base worth naming
            raise StoreError(f"clickhouse://{user}@{host}:{port}/{database}: cannot connect: {root_cause(exc)}") \
                from None

    def execute(self, query: str, params: dict | None = None) -> None:
        self.client.command(query, parameters=params)

    def arrow(self, query: str, params: dict | None = None) -> pa.Table:
        return self.client.query_arrow(query, parameters=params)

    def insert(self, table: str, data: pa.Table) -> None:
        self.client.insert_arrow(table, data)

    def close(self) -> None:
        self.client.close()


def _duckdb_types(table: pa.Table) -> pl.DataFrame:
    """A result as the DuckDB store would give it: naive UTC datetimes, signed integers, plain strings."""
    frame = pl.from_arrow(table) if table.num_columns else pl.DataFrame()
    casts = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Datetime):
            casts.append(pl.col(name).dt.convert_time_zone("UTC").dt.replace_time_zone(None).dt.cast_time_unit("us")
                         if dtype.time_zone else pl.col(name).dt.cast_time_unit("us"))
        elif dtype.is_unsigned_integer():
            casts.append(pl.col(name).cast(pl.Int64))
        elif dtype in (pl.Categorical, pl.Binary):
            casts.append(pl.col(name).cast(pl.String))
    return frame.with_columns(casts) if casts else frame


def _within_range(params: dict | None) -> dict | None:
    """Time parameters moved into the times the exporter's columns hold: a bound beyond them selects the same
    rows."""
    if not params:
        return params
    return {k: min(max(v, exporter_tables.FIRST_TIME), exporter_tables.LAST_TIME) if isinstance(v, datetime) else v
            for k, v in params.items()}


def _no_rows(columns: dict[str, str]) -> str:
    """A relation of these columns (name -> type) and no rows, for a table that is absent."""
    return "(SELECT " + ", ".join(f"defaultValueOfTypeName({sql_literal(kind)}) AS {name}"
                                  for name, kind in columns.items()) + " FROM system.one WHERE 0)"


class ClickHouseStore(StoreBase):
    """The exporter's tables in one database, as a sloscope store (analytics/store_api.py). `names` maps each table's
    default name to the one the exporter's settings gave it (exporter_tables.table_names): queries and statements
    are written with the default names, and every one sent names the tables as they are."""

    dialect, meta_table = "clickhouse", META_TABLE

    def __init__(self, backend, label: str, read_only: bool = False, names: dict[str, str] | None = None):
        self.backend, self.path, self.read_only = backend, label, read_only
        self._named = exporter_tables.renaming(names or {})
        self._defaults = {name: default for default, name in (names or {}).items()}
        # A table under a default name that the settings gave another is not the one sloscope reads.
        self._shadowed = {default for default, name in (names or {}).items() if name != default} - set(self._defaults)
        self._recorded_spec = None
        self._turn = threading.Lock()
        self._rollups = Rollups(self, readers("signal_series_steps", POINT_LOOKBACK), named=self._named,
                                columns="\n".join(derived_column_statements()), kept=KEPT)
        try:
            self._check_attribute_columns()
            if read_only:
                self._check_tables()
        except StoreError:
            backend.close()  # a refused store holds nothing open
            raise
        if not read_only:
            for statement in statements("exporter_tables"):
                self._execute(statement)
            self._add_derived_columns()
        self._sources = self._sources_lacking_columns()

    def _add_derived_columns(self) -> None:
        """sloscope's columns, with this release's expressions, on the exporter's tables; not on a Distributed table:
        the tables of its shards need them first, and this server reaches only its own (a Distributed table with a
        column its shards' tables lack fails every query that names it)."""
        distributed = self._distributed_tables()
        if distributed:
            log.warning("%s: %s read through the Distributed engine: sloscope adds no columns to them; until "
                        "`sloscope clickhouse-columns --on-cluster CLUSTER --local-suffix SUFFIX` has added them to "
                        "the shards' tables and these, queries compute the same values as they read", self.path,
                        ", ".join(sorted(map(self._named, distributed))))
        stale = self._stale_columns()
        for statement in derived_column_statements():
            table, column = DERIVED_COLUMN.search(statement).groups()[:2]
            if table not in distributed:
                self._execute(statement)
                if (table, column) in stale:
                    self._execute(modifying(statement))

    def _distributed_tables(self) -> dict[str, str]:
        """Default table name -> the `database.table` its Distributed engine reads, for those of the exporter's
        tables that are Distributed."""
        found = {}
        for table, engine, database in self._by_default_name(
                "SELECT name, engine_full, currentDatabase() FROM system.tables "
                "WHERE database = currentDatabase() AND engine = 'Distributed'"):
            reads = DISTRIBUTED.match(engine)
            if reads:
                shard_database = reads.group(2) if reads.group(2) not in ("", "currentDatabase()") else database
                found[table] = f"{shard_database}.{reads.group(3)}"
        return found

    def _check_attribute_columns(self) -> None:
        """Refuse, in one line, tables whose attributes are of the JSON type (the exporter's `json` option), which
        sloscope's queries, written for the exporter's default Map columns, cannot read."""
        found = self.rows("SELECT table, name FROM system.columns WHERE database = currentDatabase() "
                          "AND has({tables:Array(String)}, table) AND name LIKE '%Attributes' "
                          "AND (startsWith(type, 'JSON') OR startsWith(type, 'Object('))",
                          {"tables": [self._named(t) for t in (*exporter_tables.READ_TABLES,
                                                              *exporter_tables.OPTIONAL_TABLES)]})
        if found:
            columns = ", ".join(f"{table}.{name}" for table, name in found)
            raise StoreError(f"{self.path}: {columns} of type JSON (the clickhouseexporter's json option): sloscope "
                             "reads the exporter's default Map(String, String) attribute columns")

    def _by_default_name(self, query: str) -> list[tuple]:
        """Rows of a query of system tables whose first field is a table, that table by its default name; rows of
        a table that only shares a default name the settings gave another table are left out."""
        return [(self._defaults.get(table, table), *rest) for table, *rest in self.rows(query)
                if table not in self._shadowed]

    def _execute(self, statement: str, params: dict | None = None) -> None:
        try:
            self.backend.execute(self._named(statement), _within_range(params))
        except Exception as exc:  # a refused grant, a server gone: the driver's errors have no common base
            raise StoreError(f"{self.path}: statement failed: {root_cause(exc)}") from None

    def _insert(self, table: str, data: pa.Table) -> None:
        try:
            self.backend.insert(self._named(table), data)
        except Exception as exc:
            raise StoreError(f"{self.path}: insert into {self._named(table)} failed: {root_cause(exc)}") from None

    def _our_expressions(self) -> dict[tuple[str, str], str]:
        """(table, column) -> this release's expression of each of sloscope's columns, as ClickHouse formats it."""
        expected = [(table, column, expression) for table, columns in derived_columns().items()
                    for column, expression in columns.items()]
        formatted = self.rows("SELECT " + ", ".join(
            f"formatQuerySingleLine({sql_literal('SELECT ' + expression)}) AS c{i}"
            for i, (_, _, expression) in enumerate(expected)))[0]
        return {(table, column): text for (table, column, _), text in zip(expected, formatted)}

    def _stale_columns(self) -> set[tuple[str, str]]:
        """(table, column) of sloscope's columns whose expression is not this release's (an earlier release added
        them), compared as ClickHouse formats both. A server without formatQuerySingleLine (before 23.x) trusts
        them."""
        try:
            ours = self._our_expressions()
            stored = {(table, column): formatted for table, column, formatted in self._by_default_name(
                "SELECT table, name, formatQuerySingleLine('SELECT ' || default_expression) FROM system.columns "
                "WHERE database = currentDatabase() AND default_kind = 'MATERIALIZED'")}
        except StoreError:
            return set()
        return {key for key, formatted in ours.items() if stored.get(key, formatted) != formatted}

    def _unshared_columns(self) -> set[tuple[str, str]]:
        """(table, column) of sloscope's columns that a Distributed table's shard table on this server lacks or has
        with another expression (all of them where that table is on other servers only): the shards cannot give
        them, so queries compute them."""
        distributed = self._distributed_tables()
        if not distributed:
            return set()
        shard_tables = {name: table for table, name in distributed.items()}
        try:
            ours = self._our_expressions()
            found = {(shard_tables[name], column): formatted for name, column, formatted in self.rows(
                "SELECT database || '.' || table, name, formatQuerySingleLine('SELECT ' || default_expression) "
                "FROM system.columns WHERE default_kind = 'MATERIALIZED' "
                "AND has({tables:Array(String)}, database || '.' || table)", {"tables": list(shard_tables)})}
        except StoreError:
            return {(table, column) for table in distributed for column in derived_columns().get(table, {})}
        return {key for key in ours if key[0] in distributed and found.get(key) != ours[key]}

    def _sources_lacking_columns(self) -> dict[str, str]:
        """table -> what queries read in its place: the table with the derived columns it lacks (or has with an
        earlier release's expression) computed; an optional table that is absent: no rows."""
        present = set(self._by_default_name(
            "SELECT table, name FROM system.columns WHERE database = currentDatabase()"))
        stale = self._stale_columns()
        if stale:
            log.warning("%s: %s added by an earlier release of sloscope, read as computed; give them this "
                        "release's expressions with `sloscope clickhouse-columns --modify`", self.path,
                        ", ".join(f"{table}.{column}" for table, column in sorted(stale)))
        tables, usable = {table for table, _ in present}, present - stale - self._unshared_columns()
        sources = {}
        for table, columns in derived_columns().items():
            lacking = [f"{expression} AS {column}" for column, expression in columns.items()
                       if (table, column) not in usable]
            if lacking:
                # `*` leaves out materialized columns: the usable ones are named.
                kept = [column for column in columns if (table, column) in usable]
                rows = table if table in tables else _no_rows(exporter_tables.OPTIONAL_TABLES[table])
                sources[table] = f"(SELECT *, {', '.join([*kept, *lacking])} FROM {rows})"
        return sources

    def _check_tables(self) -> None:
        found = self.tables()
        missing = [t for t in exporter_tables.READ_TABLES if t not in found]
        if missing:
            raise StoreError(f"{self.path}: no {', '.join(map(self._named, missing))} table (the clickhouseexporter "
                             "creates them, or sloscope ingest; where the exporter's settings name them otherwise, "
                             "give those in the URL's query: ?traces_table_name=NAME&...)")

    def sql(self, name: str, instead: dict[str, str] | None = None) -> str:
        text = clickhouse_sql(name, instead)
        for table, source in self._sources.items():
            text = re.sub(rf"\bFROM {table}\b", lambda _: f"FROM {source}", text)
        return text

    def tables(self) -> set[str]:
        return {table for (table,) in self._by_default_name(
            "SELECT name FROM system.tables WHERE database = currentDatabase()")}

    @contextmanager
    def reading(self):
        """This store, for one use from any thread (its queries take turns)."""
        yield self

    def tier_params(self, spec) -> dict:
        """The tier rules the requests relation applies: the spec's allow-list and default tier."""
        return {"allowed_tiers": sorted(spec.tiers), "default_tier": spec.default_tier}

    def frame(self, query: str, params=None) -> pl.DataFrame:
        if "{allowed_tiers:" in query and "allowed_tiers" not in (params or {}):
            # A query over requests that does not look at tiers still parses the tier rules: the store's spec's.
            params = {**self.tier_params(self._spec()), **(params or {})}
        try:
            with self._turn:  # neither chDB's session nor a clickhouse-connect client runs two queries at once
                table = self.backend.arrow(self._named(query), _within_range(params))
            return _duckdb_types(table)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"{self.path}: query failed: {root_cause(exc)}") from None

    def rows(self, query: str, params=None) -> list[tuple]:
        return self.frame(query, params).rows()

    def execute(self, statement: str, params: dict | None = None) -> None:
        with self._turn:
            self._execute(statement, params)

    def insert(self, table: str, data: pa.Table) -> None:
        with self._turn:
            self._insert(table, data)

    @contextmanager
    def transaction(self):
        """The statements inside, one by one: ClickHouse has no transaction across them (a rollup's batch is
        read only once its header, written last, is in)."""
        yield

    def meta(self, key: str) -> str | None:
        return self.scalar(f"SELECT argMax(value, updated) FROM {META_TABLE} WHERE key = {{key:String}} "
                           "GROUP BY key", {"key": key})

    def set_meta(self, key: str, value: str) -> None:
        self._insert(META_TABLE, pa.table({"key": [key], "value": [value],
                                           "updated": pa.array([time.time_ns()], pa.timestamp("ns"))}))

    def _spec(self):
        if self._recorded_spec is None:
            self._recorded_spec = self.slo_spec()
        return self._recorded_spec

    def gpu_nodes(self) -> dict[str, str]:
        return {gpu: node for node, gpu in self.rows(self.sql("gpu_topology"))}

    def counters(self) -> dict[str, int]:
        return dict(self.rows(f"SELECT name, sum(value) FROM {COUNTERS_TABLE} GROUP BY name ORDER BY name"))

    def add_counters(self, counts: dict[str, int]) -> None:
        rows = {k: int(v) for k, v in counts.items() if v}
        if rows:
            self._insert(COUNTERS_TABLE, pa.table({"name": list(rows), "value": list(rows.values())}))

    def write(self, frames: Frames, extra_counts: dict[str, int] | None = None) -> dict[str, int]:
        """Append decoded rows to the exporter's tables. ClickHouse has no transactions over tables: each table's
        insert is atomic on its own, and rows are appended as they come (no deduplication, as the exporter)."""
        counts = dict(extra_counts or {})
        for table, data in exporter_tables.tables_of(frames):
            if data.num_rows:
                self._insert(table, data)
        counts.update(requests_loaded=len(frames.requests), spans_loaded=len(frames.graph_spans),
                      samples_loaded=len(frames.points), histograms_loaded=len(frames.histograms))
        self.add_counters(counts)
        return counts

    def close(self) -> None:
        self.backend.close()
