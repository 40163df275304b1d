"""Store URLs: which store a command reads (and `ingest` writes).

    duckdb:///var/sloscope.duckdb              the embedded DuckDB file (the default; `--db PATH` is the same)
    chdb:///var/sloscope-clickhouse            ClickHouse in-process (chDB) on that directory, database otel
    clickhouse://USER@HOST:8123/DATABASE       a ClickHouse server over HTTP, the password read from
                                               --store-password-file or $SLOSCOPE_CLICKHOUSE_PASSWORD

A ClickHouse URL's query names tables the exporter was told to name otherwise, by the exporter's own settings:
`clickhouse://reader@ch:8123/otel?traces_table_name=spans&metrics_tables.sum.name=sums`.

As in SQLAlchemy's file URLs, three slashes start a relative path and four an absolute one. A password in the URL
is refused: it would sit in the process list and the shell history.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import duckdb

from sloscope.slo_spec import load_spec

from sloscope.analytics import exporter_tables
from sloscope.analytics.clickhouse_store import ChdbBackend, ClickHouseStore, HttpBackend
from sloscope.analytics.errors import StoreError
from sloscope.analytics.store import DEFAULT_DB, Reader, Store, refuse_other_files
from sloscope.analytics.store_api import StoreApi

# What stages above analytics use to open a store, besides the interface of analytics/store_api.py.
__all__ = ["DEFAULT_DB", "DEFAULT_STORE", "PASSWORD_ENV", "StoreURL", "add_store_arguments", "open_from_args",
           "open_store", "open_url", "parse_store_url", "recorded_spec", "refuse_other_files", "store_url"]

DEFAULT_STORE = f"duckdb:///{DEFAULT_DB}"
PASSWORD_ENV = "SLOSCOPE_CLICKHOUSE_PASSWORD"
CHDB_DATABASE = "otel"  # the clickhouseexporter's default database
HTTP_PORT = 8123
SCHEMES = ("duckdb", "chdb", "clickhouse")


@dataclass(frozen=True)
class StoreURL:
    scheme: str
    path: Path | None = None
    user: str = "default"
    host: str = ""
    port: int = HTTP_PORT
    database: str = ""
    table_settings: tuple[tuple[str, str], ...] = ()  # the exporter's settings that name its tables

    def __str__(self) -> str:
        query = f"?{urlencode(self.table_settings, safe='.')}" if self.table_settings else ""
        if self.scheme == "clickhouse":
            return f"clickhouse://{self.user}@{self.host}:{self.port}/{self.database}{query}"
        return f"{self.scheme}:///{self.path}{query}"

    @property
    def served_read_only(self) -> bool:
        """How `sloscope serve` opens this store: a DuckDB file for writing (serve's intake writes it), ClickHouse
        read-only (the Collector's clickhouseexporter writes its tables)."""
        return self.scheme != "duckdb"

    def table_names(self) -> dict[str, str]:
        """Each exporter table's default name -> the name this URL's settings give it."""
        return exporter_tables.table_names(dict(self.table_settings))


def parse_store_url(text: str) -> StoreURL:
    """A StoreURL, or StoreError saying what is wrong with `text`."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in SCHEMES:
        raise StoreError(f"--store {text!r}: expected duckdb:///PATH, chdb:///PATH or "
                         "clickhouse://USER@HOST:PORT/DATABASE")
    if scheme in ("duckdb", "chdb"):
        rest, _, query = rest.partition("?")
        if not rest.startswith("/") or rest == "/":
            raise StoreError(f"--store {text!r}: expected {scheme}:///PATH (three slashes, then the path)")
        if query and scheme == "duckdb":
            raise StoreError(f"--store {text!r}: a DuckDB store takes no settings")
        return StoreURL(scheme, Path(rest[1:]), table_settings=_table_settings(text, query))
    parts = urlsplit(text)
    if parts.password is not None:
        raise StoreError(f"--store: the URL holds a password; give it in --store-password-file or ${PASSWORD_ENV}")
    try:
        port = parts.port or HTTP_PORT
    except ValueError:
        raise StoreError(f"--store {text!r}: the port is not a number in 1..65535") from None
    database = parts.path.strip("/")
    if not parts.hostname or not database or "/" in database:
        raise StoreError(f"--store {text!r}: expected clickhouse://USER@HOST:PORT/DATABASE")
    return StoreURL(scheme, user=parts.username or "default", host=parts.hostname, port=port, database=database,
                    table_settings=_table_settings(text, parts.query))


def _table_settings(text: str, query: str) -> tuple[tuple[str, str], ...]:
    """The exporter's table settings a URL's query gives, checked as the store will use them."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise StoreError(f"--store {text!r}: expected ?SETTING=NAME&... after the URL") from None
    settings = dict(pairs)
    if len(settings) < len(pairs):
        raise StoreError(f"--store {text!r}: a setting is given twice")
    try:
        exporter_tables.table_names(settings)
    except ValueError as exc:
        raise StoreError(f"--store {text!r}: {exc}") from None
    return tuple(sorted(settings.items()))


def _password(password_file: Path | None) -> str:
    if password_file is not None:
        try:
            return Path(password_file).read_text().strip()
        except OSError as exc:
            raise StoreError(f"--store-password-file {password_file}: {exc.strerror or exc}") from None
    return os.environ.get(PASSWORD_ENV, "")


def open_store(text: str, *, read_only: bool = False, password_file: Path | None = None) -> StoreApi:
    """The store the URL names: a DuckDB Store or a ClickHouseStore, read_only for commands that only read."""
    return open_url(parse_store_url(text), read_only=read_only, password_file=password_file)


def open_url(url: StoreURL, *, read_only: bool = False, password_file: Path | None = None) -> StoreApi:
    """The store of a parsed URL, as open_store."""
    if url.scheme == "duckdb":
        return Store(url.path, read_only=read_only)
    names = url.table_names()
    if url.scheme == "chdb":
        if url.path.exists() and not url.path.is_dir():
            raise StoreError(f"{url}: not a directory (chDB keeps a database in a directory of its own)")
        if read_only and not (url.path / "metadata").is_dir():  # what chDB writes first; a reader writes nothing
            raise StoreError(f"{url}: no such database (ingest something first)")
        return ClickHouseStore(ChdbBackend(url.path, CHDB_DATABASE), str(url), read_only, names)
    backend = HttpBackend(url.host, url.port, url.user, _password(password_file), url.database)
    return ClickHouseStore(backend, str(url), read_only, names)


def add_store_arguments(parser) -> None:
    """--store, its alias --db, and --store-password-file."""
    parser.add_argument("--store", metavar="URL",
                        help=f"the store: duckdb:///PATH, chdb:///PATH or clickhouse://USER@HOST:PORT/DATABASE, a "
                        "ClickHouse one with ?traces_table_name=NAME&... where the exporter's settings renamed its "
                        f"tables (default: {DEFAULT_STORE})")
    parser.add_argument("--db", type=Path, help="DuckDB file: the same as --store duckdb:///DB (default: "
                        "$SLOSCOPE_DB, else var/sloscope.duckdb)")
    parser.add_argument("--store-password-file", type=Path, metavar="FILE",
                        help=f"the ClickHouse password (default: ${PASSWORD_ENV})")


def store_url(args) -> str:
    if getattr(args, "store", None) and getattr(args, "db", None):
        raise StoreError("--store and --db name the same thing: give one")
    if getattr(args, "store", None):
        return args.store
    return f"duckdb:///{args.db}" if getattr(args, "db", None) else DEFAULT_STORE


def open_from_args(args, *, read_only: bool = False) -> StoreApi:
    return open_store(store_url(args), read_only=read_only,
                      password_file=getattr(args, "store_password_file", None))


def recorded_spec(path: Path):
    """The SLO spec recorded in the DuckDB file at `path`, else the built-in one: also where the file is missing,
    cannot be opened (another process writes it) or holds no store (the webhook's audit alone)."""
    if not path.exists():
        return load_spec(None)
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return load_spec(None)
    try:
        return Reader(con).slo_spec()
    finally:
        con.close()
