"""`sloscope ingest`, `sloscope rca`, `sloscope retention` and `sloscope clickhouse-columns`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from sloscope import json_answers
from sloscope.enrich.tiers import TierResolver
from sloscope.arguments import above_zero
from sloscope.slo_spec import SpecError
from sloscope.times import rfc3339

from sloscope.analytics import exporter_tables
from sloscope.analytics.clickhouse_store import derived_column_statements, modifying, sql_literal
from sloscope.analytics.errors import StoreError
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import NO_REQUESTS, Query, format_table, graph_answer, roll_up
from sloscope.analytics.retention import DUCKDB_ONLY, apply_retention, kept_period, utc_now
from sloscope.analytics.stores import add_store_arguments, open_from_args, parse_store_url, store_url

EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def register(subparsers) -> None:
    ingest = subparsers.add_parser(
        "ingest",
        help="load OTLP files into the store (DuckDB, or ClickHouse tables as the clickhouseexporter writes them)",
        description="Load the OpenTelemetry Collector file exporter's files into the store: format: json (one "
        "Export{Traces,Metrics,Logs}ServiceRequest per line) or format: proto (each request in protobuf after its "
        "4-byte length, traces, metrics and logs told apart by their items); gzip and the exporter's zstd "
        "compression recognised. Malformed lines and requests "
        "are reported as FILE:LINE: reason (a request's number for length-prefixed ones), counted and skipped; the "
        "rest loads. Loading the same data twice "
        "adds nothing. It then rolls up what analyses read (the SLI windows and the fleet's signal steps, per "
        "minute, in sloscope_sli_rollup and sloscope_step_rollup), so that rca and serve need not compute them. "
        "Exit status: 0 all loaded, 1 some lines rejected, 2 usage or spec error (a named file that "
        "does not exist or is a directory, found before the store is opened).")
    ingest.add_argument("files", nargs="+", type=Path, metavar="FILE")
    add_store_arguments(ingest)
    ingest.add_argument("--slo", type=Path, metavar="SLO.yaml",
                        help="SLO spec whose tiers are the allow-list for the untrusted x-slo-tier header "
                        "(default: the spec last used with this database, else the built-in spec)")
    ingest.add_argument("--batch-rows", type=above_zero(int), default=250_000,
                        help="rows per transaction (default: %(default)s)")
    ingest.set_defaults(func=run_ingest)

    rca = subparsers.add_parser(
        "rca", help="find SLO violations per tier and rank their physical causes",
        description="Find SLO violations per tier, merge them into incidents per (tier, service, node), and "
        "rank each incident's physical-layer causes with evidence (docs/cli-json.md, docs/taxonomy.md).")
    add_store_arguments(rca)
    rca.add_argument("--slo", type=Path, metavar="SLO.yaml",
                     help="SLO spec (default: the spec last used with this database, else the built-in spec)")
    add_range_arguments(rca)
    rca.add_argument("--at", metavar="TIME",
                     help="explain a moment instead of incidents: (node, cause) pairs ranked for the minute from "
                     "TIME (RFC 3339, or a duration back from the newest request), no SLI breach required")
    rca.add_argument("--node", help="with --at: only this node")
    rca.add_argument("--format", choices=["json", "table"],
                     help="json (docs/cli-json.md) or table for people (default: table on a terminal, else json)")
    rca.add_argument("--top", type=int, default=5, help="causes shown per incident (default: %(default)s)")
    rca.add_argument("--baseline", default="10m", metavar="DURATION",
                     help="how much history before an incident counts as normal (default: %(default)s)")
    rca.add_argument("--lookback", default="1m", metavar="DURATION",
                     help="the baseline ends this long before the incident; causes' onsets are searched from "
                     "there (default: %(default)s)")
    rca.set_defaults(func=run_rca)

    shown = subparsers.add_parser(
        "graph", help="the service graph: services with their pods and nodes, the calls between them",
        description="The service graph read from the stored traces (docs/traces.md), as JSON: nodes are services "
        "with their pods, nodes, requests per second, mean latency and error ratio; edges are calls with calls per "
        "second, mean latency, error ratio and the mean network gap (the CLIENT span less the SERVER span it "
        "reached). Over --since/--until, or the minute from --at; by default the 5 minutes up to the newest "
        "request. GET /graph on serve answers the same.")
    add_store_arguments(shown)
    add_range_arguments(shown)
    shown.add_argument("--at", metavar="TIME", help="the minute from TIME (RFC 3339, or a duration back from the "
                       "newest request) instead of a range")
    shown.set_defaults(func=run_graph)

    retention = subparsers.add_parser(
        "retention", help="delete stored rows older than a kept period (DuckDB stores)",
        description="Delete requests, samples and histograms older than --keep before now, in one transaction. "
        "ClickHouse stores expire rows with the clickhouseexporter's ttl setting instead.")
    add_store_arguments(retention)
    retention.add_argument("--keep", required=True, metavar="DURATION",
                           help="how much to keep, with its unit, e.g. 7d or 12h (a bare number is refused)")
    retention.set_defaults(func=run_retention)

    columns = subparsers.add_parser(
        "clickhouse-columns",
        help="print the statements that add sloscope's columns to the clickhouseexporter's tables",
        description="Print the ALTER TABLE statements that add sloscope's columns to the tables a Collector's "
        "clickhouseexporter made (each span's service, route, node, status, tier header and key; each metric "
        "point's node and attributes by its catalog signal's rule, and whether it is kept), for clickhouse-client "
        "--multiquery. ClickHouse then computes each value once, as its row is inserted. `sloscope ingest "
        "--store` adds them itself; without them every query computes the same values as it reads.")
    columns.add_argument("--on-cluster", metavar="CLUSTER", type=_cluster_name,
                         help="add ON CLUSTER CLUSTER to each statement")
    columns.add_argument("--local-suffix", metavar="SUFFIX", type=_table_suffix,
                         help="the tables are Distributed, each reading a table of its name and SUFFIX (e.g. "
                         "_local) on every shard: give each column to that table first, then to the Distributed "
                         "one, with the same expression (a Distributed table's column that its shards' tables lack "
                         "fails every query that names it)")
    columns.add_argument("--store", metavar="URL",
                         help="name the tables as this ClickHouse store URL's query does (the exporter's "
                         "traces_table_name, metrics_tables.*.name or metrics_table_name); nothing is connected")
    columns.add_argument("--modify", action="store_true",
                         help="also MODIFY each column, for tables given them by an earlier release whose "
                         "expressions differ (rows inserted from then on take the new ones)")
    columns.set_defaults(func=run_clickhouse_columns)


def add_range_arguments(parser) -> None:
    """--since and --until of the analysed range (rca, report)."""
    parser.add_argument("--since", metavar="TIME",
                        help="RFC 3339 time or a duration back from the newest request (e.g. 1h); default: the "
                        "oldest stored request")
    parser.add_argument("--until", metavar="TIME",
                        help="RFC 3339 time or a duration back from the newest request; default: just after the "
                        "newest stored request")


class InputError(ValueError):
    """A file named on the command line that cannot be an input: a usage error."""


def _check_inputs(paths: list[Path]) -> None:
    """Refuse a named input that is missing or a directory before anything is created or written (a file that
    cannot be read further on is reported as rejected lines instead, and the others load)."""
    for path in paths:
        if path.is_dir():
            raise InputError(f"{path}: a directory; name the files in it (e.g. {path}/*.jsonl.gz)")
        if not path.exists():
            raise InputError(f"{path}: no such file")


def run_ingest(args) -> int:
    try:
        _check_inputs(args.files)
        store = open_from_args(args)
        spec = store.spec(args.slo)
    except (SpecError, StoreError, InputError) as exc:
        print(f"sloscope ingest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with store:
            report = Ingestor(store, TierResolver.from_spec(spec), batch_rows=args.batch_rows,
                              declared=spec.taxonomy.declared_metrics).ingest_files(args.files)
            roll_up(store, spec)
    except StoreError as exc:
        print(f"sloscope ingest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in report.rejected:
        print(line, file=sys.stderr)
    if report.lines_with_refusals > len(report.rejected):
        print(f"... and {report.lines_with_refusals - len(report.rejected)} more rejected lines", file=sys.stderr)
    c = report.counts
    rate = report.rows_loaded / report.seconds if report.seconds else 0.0
    print(f"ingested {report.lines} lines into {store.path} in {report.seconds:.1f}s ({rate:,.0f} rows/s): "
          f"{c['requests_loaded']} requests, {c['samples_loaded']} samples, {c['histograms_loaded']} histograms; "
          f"duplicates skipped: {c['requests_duplicate'] + c['samples_duplicate'] + c['histograms_duplicate']}; "
          f"tier header defaulted: {c['tier_invalid']} invalid, {c['tier_missing']} missing; "
          f"lines rejected: {report.rejected_count}, partly refused: {report.partly_refused_count}", file=sys.stderr)
    return EXIT_REJECTED if report.lines_with_refusals else EXIT_OK


def run_rca(args) -> int:
    query = Query(args.since or "", args.until or "", args.at or "", args.node or "", args.top, args.baseline,
                  args.lookback)
    try:
        store = open_from_args(args, read_only=True)
        spec = store.spec(args.slo)
        with store:
            result = query.answer(store, spec)
            empty = not result["incidents"] and "moment" not in result and not query.holds_requests(store)
    except (SpecError, StoreError, ValueError) as exc:
        print(f"sloscope rca: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if empty:  # not "no SLO violations": nothing was there to judge
        print(f"sloscope rca: {store.path} {NO_REQUESTS}", file=sys.stderr)
    fmt = args.format or ("table" if sys.stdout.isatty() else "json")
    print(format_table(result, empty) if fmt == "table" else json_answers.dumps(result, indent=2))
    return EXIT_OK


def run_graph(args) -> int:
    try:
        with open_from_args(args, read_only=True) as store:
            result = graph_answer(store, args.since or "", args.until or "", args.at or "")
    except (StoreError, ValueError) as exc:
        print(f"sloscope graph: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json_answers.dumps(result, indent=2))
    return EXIT_OK


def run_retention(args) -> int:
    try:
        keep = kept_period(args.keep, "--keep")
        url = parse_store_url(store_url(args))
        # Refused before opening: opening for writing would make an empty database, or chDB's directory.
        if url.scheme != "duckdb":
            raise StoreError(f"{url}: {DUCKDB_ONLY}")
        if not url.path.exists():
            raise StoreError(f"{url.path}: no such database")
        now = utc_now()
        with open_from_args(args) as store:
            deleted = apply_retention(store, keep, now)
    except (ValueError, StoreError) as exc:  # a bad duration is a ValueError
        print(f"sloscope retention: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"deleted rows older than {rfc3339(now - keep)} (kept {args.keep.strip()} before now): "
          + ", ".join(f"{n} {t}" for t, n in deleted.items()), file=sys.stderr)
    return EXIT_OK


def _cluster_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w-]*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a cluster name (letters, digits, _ and -)")
    return text


def _table_suffix(text: str) -> str:
    if not re.fullmatch(r"\w{1,50}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a table name's suffix (letters, digits and _)")
    return text


def run_clickhouse_columns(args) -> int:
    try:
        url = parse_store_url(args.store) if args.store else None
        if url is not None and url.scheme == "duckdb":
            raise StoreError(f"--store {args.store}: the columns are for a ClickHouse store (chdb:// or "
                             "clickhouse://)")
        named = exporter_tables.renaming(url.table_names() if url else {})
    except StoreError as exc:
        print(f"sloscope clickhouse-columns: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("-- sloscope's columns on the clickhouseexporter's tables (analytics/sql/clickhouse/derived_columns.sql)")
    for statement in derived_column_statements():
        statement = named("\n".join(line for line in statement.strip().splitlines() if not line.startswith("--")))
        # --modify: a column an earlier release did not add must be added before it can be modified
        for text in (statement, modifying(statement)) if args.modify else (statement,):
            for suffix in (args.local_suffix, "") if args.local_suffix else ("",):
                cluster = f"ON CLUSTER {sql_literal(args.on_cluster)} " if args.on_cluster else ""
                print(re.sub(r"^ALTER TABLE (\w+) ", lambda m: f"ALTER TABLE {m.group(1)}{suffix} {cluster}", text)
                      + "\n;")
    return EXIT_OK
