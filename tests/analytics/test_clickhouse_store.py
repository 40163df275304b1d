"""The ClickHouse store (chDB in-process): store URLs, the exporter's tables, the tier rules and the cumulative
deltas computed in the engine, each held to what the DuckDB store does with the same input."""

import json
from datetime import datetime, timedelta

import polars as pl
import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("chdb")

from sloscope.analytics.attribution import Window, signal_steps  # noqa: E402
from sloscope.analytics.clickhouse_store import derived_columns  # noqa: E402
from sloscope.analytics.exporter_tables import EXP_HISTOGRAM, GAUGE, MAP_TYPE, SUM, TRACES, attribute_text  # noqa: E402
from sloscope.analytics.exporter_tables import renaming, table_names  # noqa: E402
from sloscope.analytics.slo import sli_windows, window_latencies  # noqa: E402
from sloscope.analytics.store import Store, StoreError  # noqa: E402
from sloscope.analytics.stores import PASSWORD_ENV, open_store, parse_store_url, _password  # noqa: E402
from sloscope.commands.cli import main  # noqa: E402
from sloscope.enrich.tiers import MAX_HEADER_LENGTH, TierResolver  # noqa: E402
from sloscope.slo_spec import load_spec  # noqa: E402
from tests.collector_exporter import rows  # noqa: E402
from tests.exporter_versions import create_tables  # noqa: E402
from tests.otlp_builders import attr, counter, exp_histogram, gauge, metrics, span, traces, write_lines  # noqa: E402
from tests.declared_specs import BOUNDS, QUEUE_TIME, TIERS  # noqa: E402
from tests.receiver_otlp import cumulative, explicit_histogram, prometheus_scrape  # noqa: E402
from tests.receiver_otlp import gauge as receiver_gauge  # noqa: E402

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000
EVERYTHING = {"since": datetime(2000, 1, 1), "until": datetime(2100, 1, 1)}  # the range of a relation read whole


# --- store URLs ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, scheme, path", [
    ("duckdb:///var/sloscope.duckdb", "duckdb", "var/sloscope.duckdb"),
    ("duckdb:////tmp/x.duckdb", "duckdb", "/tmp/x.duckdb"),
    ("chdb:///var/ch", "chdb", "var/ch"),
])
def test_file_urls_name_relative_paths_with_three_slashes_and_absolute_ones_with_four(text, scheme, path):
    url = parse_store_url(text)
    assert (url.scheme, str(url.path)) == (scheme, path)
    assert parse_store_url(str(url)) == url


def test_a_clickhouse_url_names_user_host_port_and_database():
    url = parse_store_url("clickhouse://reader@ch.example:9123/telemetry")
    assert (url.user, url.host, url.port, url.database) == ("reader", "ch.example", 9123, "telemetry")
    assert parse_store_url("clickhouse://ch.example/otel").port == 8123


@pytest.mark.parametrize("text, says", [
    ("var/x.duckdb", "expected duckdb:///PATH"),
    ("mysql://h/db", "expected duckdb:///PATH"),
    ("duckdb://x.duckdb", "three slashes"),
    ("clickhouse://u:secret@h:8123/otel", "holds a password"),
    ("clickhouse://u@h:99999/otel", "port"),
    ("clickhouse://u@h:8123/", "USER@HOST:PORT/DATABASE"),
    ("duckdb:///x.duckdb?traces_table_name=spans", "takes no settings"),
    ("clickhouse://u@h/otel?traces_table=spans", "unknown setting traces_table"),
    ("chdb:///ch?traces_table_name=spans;DROP%20TABLE%20x", "a table name is"),
    ("chdb:///ch?traces_table_name=a&traces_table_name=b", "given twice"),
    ("chdb:///ch?metrics_table_name=m&metrics_tables.sum.name=s", "not both"),
    ("chdb:///ch?metrics_tables.sum.name=otel_traces", "one name"),
])
def test_a_bad_url_is_refused_with_what_was_expected(text, says):
    with pytest.raises(StoreError, match=says):
        parse_store_url(text)


def test_a_url_names_the_tables_by_the_exporters_settings():
    url = parse_store_url("clickhouse://r@ch:8123/otel?traces_table_name=spans&metrics_tables.sum.name=sums")
    assert parse_store_url(str(url)) == url
    names = url.table_names()
    assert (names[TRACES], names[SUM], names[GAUGE]) == ("spans", "sums", GAUGE)
    older = table_names({"metrics_table_name": "fleet"})  # the exporter's prefix: fleet_gauge, fleet_sum, ...
    assert (older[TRACES], older[GAUGE], older[EXP_HISTOGRAM]) == (TRACES, "fleet_gauge", "fleet_exponential_histogram")


def test_a_store_ingested_under_other_names_reads_the_same_and_only_by_them(tmp_path, capsys):
    path = write_lines(tmp_path / "in.jsonl", _metric_lines() + [traces(
        [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50 + (i % 7) * 40, tier=["standard"]) for i in range(40)],
        node="n1")])
    other = f"chdb:///{tmp_path}/other?traces_table_name=spans&metrics_table_name=fleet"
    for url in (f"chdb:///{tmp_path}/default", other):
        assert main(["ingest", "--store", url, str(path)]) == 0
    spec, since, until = load_spec(None), datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 5)
    window = Window(since, datetime(2025, 11, 29, 10, 0, 30), datetime(2025, 11, 29, 10, 0, 40), until, 10.0)
    frames = []
    for url in (f"chdb:///{tmp_path}/default", other):
        with open_store(url, read_only=True) as store:
            frames.append((sli_windows(store, spec, since, until)["standard"],
                           signal_steps(store, window).drop("series").cast({pl.Categorical: pl.String})
                           .sort("node", "metric", "attributes", "step")))
            if url == other:
                made = _made(store)
    assert {"spans", "fleet_gauge", "fleet_sum", "fleet_exponential_histogram"} <= made
    assert not made & {TRACES, GAUGE, SUM, EXP_HISTOGRAM}
    assert frames[0][0]["requests"].sum() == 40 and frames[0][1].height > 0
    assert frames[0][0].equals(frames[1][0]) and frames[0][1].equals(frames[1][1])
    capsys.readouterr()
    assert main(["rca", "--store", other.partition("?")[0]]) == 2  # the default names are not there
    assert "no otel_traces, otel_metrics_gauge" in capsys.readouterr().err
    # Named otherwise where the tables have the default names: those are not the tables the settings name.
    assert main(["rca", "--store", f"chdb:///{tmp_path}/default?traces_table_name=spans"]) == 2
    assert "default?traces_table_name=spans: no spans table (" in capsys.readouterr().err


def _made(store) -> set[str]:
    """The tables the store's database holds, by the names they have."""
    return set(store.backend.arrow("SELECT name FROM system.tables WHERE database = currentDatabase()")["name"]
               .to_pylist())


def test_the_password_comes_from_its_file_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert _password(None) == "from-env"
    (tmp_path / "pw").write_text("from-file\n")
    assert _password(tmp_path / "pw") == "from-file"
    with pytest.raises(StoreError, match="--store-password-file"):
        _password(tmp_path / "missing")


def test_a_chdb_store_read_before_anything_was_loaded_is_a_clear_error(tmp_path, capsys):
    assert main(["rca", "--store", f"chdb:///{tmp_path}/none"]) == 2
    assert "no such database" in capsys.readouterr().err
    (tmp_path / "other").mkdir()  # a directory, but no database: a reader leaves it as it was
    assert main(["rca", "--store", f"chdb:///{tmp_path}/other"]) == 2
    assert "no such database" in capsys.readouterr().err and not any((tmp_path / "other").iterdir())
    (tmp_path / "file").write_text("x")
    for command in (["rca"], ["ingest", "/dev/null"]):
        assert main([command[0], "--store", f"chdb:///{tmp_path}/file", *command[1:]]) == 2
        err = capsys.readouterr().err
        assert "file: not a directory" in err and len(err.splitlines()) == 1


def test_times_beyond_what_clickhouse_holds_select_as_duckdb_selects(tmp_path, capsys):
    lines = [traces([span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50, tier=["standard"]) for i in range(40)],
                    node="n1")]
    duck, ch = _load_both(tmp_path, lines)
    duck.close(), ch.close()
    answers = []
    for store in (f"duckdb:///{tmp_path}/x.duckdb", f"chdb:///{tmp_path}/ch"):
        capsys.readouterr()
        assert main(["rca", "--store", store, "--since", "0999-01-01T00:00:00Z", "--until",
                     "2400-01-01T00:00:00Z", "--baseline", "100000w", "--format", "json"]) == 0
        answers.append(capsys.readouterr().out)
    assert json.loads(answers[0]) == json.loads(answers[1]) == {"incidents": []}


def test_text_parameters_reach_chdb_as_they_are(tmp_path):
    # Names come from any OTLP client: a tab, newline or backslash in one must not change the query's answer.
    values = ["gpu\tnode", "gpu\nnode", "gpu\\node", "q'uote\"d", "\\t", "a\rb"]
    with open_store(f"chdb:///{tmp_path}/p") as store:
        for value in values:
            assert store.rows("SELECT {v:String}, {a:Array(String)}", {"v": value, "a": [value]}) == [(value, [value])]


@pytest.mark.parametrize("command", [["rca"], ["ingest", "/dev/null"]])
def test_tables_made_with_the_exporters_json_option_are_refused_in_one_line(tmp_path, capsys, command):
    """The exporter's `json` option types attributes as JSON, which the queries (written for its default Map
    columns) cannot read: reading or writing says so, rather than failing in a query."""
    ddl = tmp_path / "json.sql"
    ddl.write_text("CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId String, SpanId String, "
                   "ServiceName LowCardinality(String), ResourceAttributes JSON, SpanAttributes JSON) "
                   "ENGINE = MergeTree ORDER BY (ServiceName, Timestamp)")
    create_tables(tmp_path / "ch", ddl)
    assert main([command[0], "--store", f"chdb:///{tmp_path}/ch", *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "otel_traces.ResourceAttributes, otel_traces.SpanAttributes of type JSON" in err and "json option" in err
    assert len(err.strip().splitlines()) == 1


# --- tiers: the query's rules are enrich/tiers.py's ----------------------------------------------------------

WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
HOSTILE = ["standard", "p99-latency-critical", " standard ", WHITESPACE + "standard" + WHITESPACE, "Standard",
           "platinum", "", " ", "stand ard", "x" * 10_000, " " * (MAX_HEADER_LENGTH - 8) + "standard",
           " " * (MAX_HEADER_LENGTH - 7) + "standard", "\u200bstandard", "standard\x00",
           ["p99-latency-critical"], ["standard", "p99-latency-critical"], [], [" standard\t"], [7], 7, 1.5, True,
           {"tier": "standard"}, None, "'); DROP TABLE otel_traces; --", '["standard"', "[\"standard\"]x"]


def _span_row(i: int, raw) -> dict:
    attrs = [] if raw is None else [("http.request.header.x-slo-tier", attribute_text(raw))]
    if i % 2 and raw is not None:  # Istio's spelling, given alone
        attrs = [("slo.tier", attribute_text(raw))]
    return {"Timestamp": T0 + i * S, "TraceId": f"{i:032x}", "SpanId": f"{i:016x}", "SpanKind": "Server",
            "ServiceName": "svc", "ResourceAttributes": [("k8s.node.name", "n1")], "SpanAttributes": attrs,
            "Duration": 1_000_000, "StatusCode": "Unset"}


def test_tier_rules_in_the_query_match_the_resolver_on_hostile_values(tmp_path):
    spec = load_spec(None)
    with open_store(f"chdb:///{tmp_path}/ch") as store:
        rows = [_span_row(i, raw) for i, raw in enumerate(HOSTILE)]
        schema = pa.schema([("Timestamp", pa.timestamp("ns")), ("TraceId", pa.string()), ("SpanId", pa.string()),
                            ("SpanKind", pa.string()), ("ServiceName", pa.string()), ("ResourceAttributes", MAP_TYPE),
                            ("SpanAttributes", MAP_TYPE), ("Duration", pa.uint64()), ("StatusCode", pa.string())])
        store.backend.insert(TRACES, pa.Table.from_pylist(rows, schema))
        found = dict(store.rows(f"SELECT span_id, tier FROM ({store.sql('requests')})",
                                {**store.tier_params(spec), **EVERYTHING}))
    resolver = TierResolver.from_spec(spec)
    expected = {f"{i:016x}": resolver.resolve(raw) for i, raw in enumerate(HOSTILE)}
    assert found == expected
    assert set(found.values()) == {"standard", "p99-latency-critical"}


def test_a_failed_insert_is_a_store_error_naming_the_store_and_table(tmp_path):
    """A table dropped under the store (or a grant refused, a server gone) is one clear line, not a traceback."""
    from tests.analytics.test_durability import _spans

    url = f"chdb:///{tmp_path}/ch"
    with open_store(url) as store:
        store.backend.execute(f"DROP TABLE {TRACES}")
        with pytest.raises(StoreError, match=f"{url}: insert into {TRACES} failed"):
            store.write(_spans(0))


# --- cumulative deltas, resets and histograms: the engine's are the store's --------------------------------------

def _metric_lines():
    """Cumulative counters with every kind of reset, delta counters, gauges and histograms on two nodes."""
    restart = T0 + 50 * S
    series = [
        counter("sloscope.tcp.retransmits", T0, [(T0 + k * 10 * S, 10 * k) for k in range(1, 5)]
                + [(T0 + 50 * S, 3, restart - S), (T0 + 60 * S, 9, restart - S)]  # restarted with a new start
                + [(T0 + 70 * S, 4, restart - S), (T0 + 80 * S, 8, restart - S)],  # went down without one
                attrs={"network.io.direction": "transmit"}),
        counter("sloscope.tcp.retransmits", 0, [(T0 + k * 10 * S, 5 * k, 0) for k in range(1, 6)],
                attrs={"network.io.direction": "receive"}),  # no start time: the first point has no baseline
        counter("system.disk.io_time", T0, [(T0 + k * 10 * S, k * 1.5) for k in range(1, 8)], temporality=1),
        gauge("hw.gpu.utilization", [(T0 + k * 5 * S, 0.1 * k) for k in range(1, 15)], attrs={"hw.id": "GPU-1"}),
        exp_histogram("sloscope.syscall.duration", T0, [(T0 + k * 10 * S, 4 * k, 0.5 * k, -20, [k, 3 * k])
                                                       for k in range(1, 5)]
                      + [(T0 + 50 * S, 2, 0.1, -20, [2, 0])]),  # went down: a reset
    ]
    return [metrics(series, node="n1"), metrics(series[:3], node="n2")]


def _load_both(tmp_path, lines):
    path = write_lines(tmp_path / "in.jsonl", lines)
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(path)]) == 0
    assert main(["ingest", "--store", f"chdb:///{tmp_path}/ch", str(path)]) == 0
    return Store(tmp_path / "x.duckdb", read_only=True), open_store(f"chdb:///{tmp_path}/ch", read_only=True)


def _sorted(frame: pl.DataFrame, key) -> pl.DataFrame:
    return frame.sort(key)


def assert_same(engine: pl.DataFrame, stored: pl.DataFrame) -> None:
    """The same columns, types and rows; floats to within an ulp or two (polars divides by 1e9 as x * 1e-9)."""
    assert engine.schema == stored.schema
    floats = [name for name, dtype in stored.schema.items() if dtype == pl.Float64]
    assert engine.drop(floats).equals(stored.drop(floats))
    for name in floats:
        assert engine[name].is_null().equals(stored[name].is_null())
        assert np.allclose(engine[name].drop_nulls().to_numpy(), stored[name].drop_nulls().to_numpy(), rtol=1e-12)


def test_cumulative_sums_and_histograms_become_the_same_deltas_in_the_engine(tmp_path):
    duck, ch = _load_both(tmp_path, _metric_lines())
    with duck, ch:
        key = ["node", "metric", "attributes", "ts"]
        columns = "ts, node, metric, attributes, value, interval_s"
        stored = _sorted(duck.frame(f"SELECT {columns} FROM samples"), key)
        engine = _sorted(ch.frame(f"SELECT {columns} FROM ({ch.sql('samples')})", EVERYTHING), key)
        # Per node: 8 cumulative points with resets, 4 of 5 without a start time, 7 delta; 14 gauges on n1.
        assert stored.height == 2 * (8 + 4 + 7) + 14
        transmit = stored.filter(pl.col("attributes").str.contains("transmit"), pl.col("node") == "n1")
        assert transmit["value"].to_list() == [10, 10, 10, 10, 3, 6, 4, 4]  # restarted: from the start; went down
        assert_same(engine, stored)
        columns = "ts, node, metric, attributes, interval_s, toInt64(count) AS count, sum"
        h_key = ["node", "metric", "ts"]
        stored = _sorted(duck.frame(f"SELECT {columns.replace('toInt64(count)', 'count::BIGINT')} FROM histograms"),
                         h_key)
        engine = _sorted(ch.frame(f"SELECT {columns} FROM ({ch.sql('histograms')})", EVERYTHING), h_key)
        assert stored["count"].to_list() == [4, 4, 4, 4, 2]
        assert_same(engine, stored)
        dense = "arrayMap(slot -> arraySum(arrayFilter((n, s) -> s = slot, bucket_counts, bucket_slots)), range(48))"
        engine = _sorted(ch.frame(f"SELECT node, metric, ts, {dense} AS buckets FROM ({ch.sql('histograms')})",
                                  EVERYTHING), h_key)
        stored = _sorted(duck.frame("SELECT node, metric, ts, buckets FROM histograms"), h_key)
        assert engine["buckets"].to_list() == stored["buckets"].to_list()  # resets and all, slot by slot


def test_a_counter_that_starts_again_at_each_points_predecessor_keeps_every_point(tmp_path):
    # Each point counts from where the last one ended (a restart every interval, as a delta would say it): the
    # value is the increase since its start, the predecessor's time.
    points = [(T0 + k * 10 * S, 2 + k, T0 + (k - 1) * 10 * S) for k in range(1, 7)]
    duck, ch = _load_both(tmp_path, [metrics([counter("sloscope.tcp.retransmits", T0, points)], node="n1")])
    with duck, ch:
        columns = "ts, node, metric, attributes, value, interval_s"
        stored = duck.frame(f"SELECT {columns} FROM samples").sort("ts")
        engine = ch.frame(f"SELECT {columns} FROM ({ch.sql('samples')})", EVERYTHING).sort("ts")
    assert stored["value"].to_list() == [3, 4, 5, 6, 7, 8] and stored["interval_s"].to_list() == [10.0] * 6
    assert_same(engine, stored)


def test_an_exporters_restart_marked_with_a_start_at_the_point_keeps_its_increase(tmp_path):
    # The Collector's prometheus receiver (metrics adjuster, before v0.139) marks a scraped counter's reset with a
    # start time at the point itself: unusable as an interval, but the value went down, so the counter restarted
    # after the previous point. A new start time with a value that did not go down (the Collector restarted, not
    # the exporter) stays unknown: its value is the exporter's whole life, not an interval's increase.
    points = [(T0 + 10 * S, 100, T0), (T0 + 20 * S, 130, T0), (T0 + 30 * S, 5, T0 + 30 * S),
              (T0 + 40 * S, 25, T0 + 30 * S), (T0 + 50 * S, 900, T0 + 50 * S), (T0 + 60 * S, 910, T0 + 50 * S)]
    duck, ch = _load_both(tmp_path, [metrics([counter("sloscope.tcp.retransmits", T0, points)], node="n1")])
    with duck, ch:
        columns = "ts, node, metric, attributes, value, interval_s"
        stored = duck.frame(f"SELECT {columns} FROM samples").sort("ts")
        engine = ch.frame(f"SELECT {columns} FROM ({ch.sql('samples')})", EVERYTHING).sort("ts")
    assert stored["value"].to_list() == [100, 30, 5, 20, 10]
    assert stored["interval_s"].to_list() == [10.0] * 5
    assert_same(engine, stored)


def test_both_engines_answer_the_analytics_queries_with_the_same_frames(tmp_path):
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50 + (i % 7) * 40, status=500 if i % 11 == 0 else 200,
                  tier=["standard"]) for i in range(300)]
    duck, ch = _load_both(tmp_path, _metric_lines() + [traces(spans, node="n1")])
    spec = load_spec(None)
    since, until = datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 5)
    window = Window(since, datetime(2025, 11, 29, 10, 0, 30), datetime(2025, 11, 29, 10, 0, 40), until, 10.0)
    with duck, ch:
        frames = [(sli_windows(s, spec, since, until)["standard"],
                   window_latencies(s, spec, spec.tiers["standard"], since, until),
                   signal_steps(s, window).sort("node", "metric", "attributes", "step")) for s in (duck, ch)]
    (duck_sli, duck_latency, duck_steps), (ch_sli, ch_latency, ch_steps) = frames
    assert duck_sli.height > 5 and duck_sli["failures"].sum() > 0
    assert ch_sli.schema == duck_sli.schema
    assert_same(ch_sli, duck_sli)
    assert duck_latency.height == duck_sli.height and ch_latency.schema == duck_latency.schema
    assert_same(ch_latency, duck_latency)
    # Each engine keys a series by its own fingerprint: the same series, different integers.
    assert ch_steps.drop("series").schema == duck_steps.drop("series").schema
    assert ch_steps.select("node", "metric", "attributes", "step").equals(
        duck_steps.select("node", "metric", "attributes", "step"))
    assert (ch_steps["value"] - duck_steps["value"]).abs().max() < 1e-9


@pytest.mark.parametrize("cut_s", [35, 55, 75])
def test_a_window_that_begins_inside_a_cumulative_series_takes_its_first_increase_from_the_point_before(
        tmp_path, cut_s):
    # The last point before the window is stored twice in chDB: its copies are one predecessor.
    lines = _metric_lines()
    duck, ch = _load_both(tmp_path, lines + lines[:1])
    since = datetime(2025, 11, 29, 10) + timedelta(seconds=cut_s)
    window = Window(since, datetime(2025, 11, 29, 10, 1), datetime(2025, 11, 29, 10, 1, 10),
                    datetime(2025, 11, 29, 10, 3), 10.0)
    with duck, ch:
        duck_steps, ch_steps = (signal_steps(s, window).sort("node", "metric", "attributes", "step")
                                for s in (duck, ch))
    cumulative = duck_steps.filter(pl.col("metric").is_in(["sloscope.tcp.retransmits", "sloscope.syscall.duration"]))
    assert cumulative.height >= 2 and duck_steps["step"].min() >= since
    assert ch_steps.select("node", "metric", "attributes", "step").equals(
        duck_steps.select("node", "metric", "attributes", "step"))
    assert (ch_steps["value"] - duck_steps["value"]).abs().max() < 1e-9


def test_a_histogram_reset_that_only_a_bucket_shows_is_found_in_the_collectors_compact_buckets(tmp_path):
    """The Collector writes an exponential histogram's buckets as its producer sent them: from the first bucket
    that holds something, with empty ones inside. A bucket that went down while the count grew is a reset, in
    whatever part of the point's buckets it lies, as the DuckDB store finds it."""
    points = [(T0 + 10 * S, 4, 1.0, -20, [1, 3]), (T0 + 20 * S, 8, 2.0, -20, [2, 6]),
              (T0 + 30 * S, 9, 2.5, -20, [0, 9]),  # the first bucket went from 2 to 0: a reset
              (T0 + 40 * S, 12, 3.0, -21, [1, 2, 9]), (T0 + 50 * S, 13, 3.5, -21, [1, 2, 10]),
              (T0 + 60 * S, 14, 4.0, -21, [3, 0, 11])]  # a bucket went from 2 to 0 inside the run: a reset
    line = metrics([exp_histogram("sloscope.syscall.duration", T0, points)], node="n1")
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(write_lines(tmp_path / "in.jsonl", [line]))]) == 0
    create_tables(tmp_path / "ch")
    window = Window(datetime(2025, 11, 29, 10), datetime(2025, 11, 29, 10, 0, 30), datetime(2025, 11, 29, 10, 0, 40),
                    datetime(2025, 11, 29, 10, 2), 10.0)
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as ch:
        for table, data in rows(line).items():
            ch.backend.insert(table, data)
        ch_steps = signal_steps(ch, window).sort("step")
    with Store(tmp_path / "x.duckdb", read_only=True) as duck:
        duck_steps = signal_steps(duck, window).sort("step")
    # each interval's mean: 1/4, 1/4, then 2.5/9 (a reset), 0.5/3, 0.5/1, then 4/14 (a reset)
    assert np.allclose(duck_steps["value"].to_numpy(), [0.25, 0.25, 2.5 / 9, 0.5 / 3, 0.5, 4 / 14])
    assert np.allclose(ch_steps["value"].to_numpy(), duck_steps["value"].to_numpy())


def test_a_counter_faster_than_once_a_second_keeps_its_rate_in_tables_of_whole_seconds(tmp_path):
    """The exporter's tables since v0.160 keep metric times in whole seconds: a counter sent every 0.6 s has two
    points in most seconds there. Every increase still counts once, as DuckDB counts it at full precision, and
    copies of the points (the file loaded twice) still count once."""
    points = [(T0 + k * 600_000_000 + 300_000_000, 6 * k) for k in range(1, 500)]  # 10 per second
    line = metrics([counter("sloscope.tcp.retransmits", T0, points, attrs={"network.io.direction": "transmit"})],
                   node="n1")
    create_tables(tmp_path / "ch")
    duck, ch = _load_both(tmp_path, [line, line])
    window = Window(datetime(2025, 11, 29, 10, 0), datetime(2025, 11, 29, 10, 3),
                    datetime(2025, 11, 29, 10, 4), datetime(2025, 11, 29, 10, 5), 10.0)
    with duck, ch:
        steps = [signal_steps(store, window).sort("step")["value"] for store in (duck, ch)]
    assert len(steps[0]) == len(steps[1]) >= 28
    assert np.allclose(steps[0][1:-1], 10.0)
    # Per whole second, its last point: a step's 10 increases of 1 s are those of 16 or 18 points (of 6 each), and
    # over the steps they add up to the counter's own increase.
    assert np.abs(steps[1][1:-1] - 10.0).max() <= 1.2 + 1e-9
    assert abs(steps[1][1:-1].mean() - 10.0) < 0.1


def _receivers_requests() -> list[dict]:
    """What the Collector's receivers send: a dcgm-exporter scrape (no node but its Hostname label, and one of
    DCGM's blank values), kubeletstats' two pods of one node (kept apart only by their resource), and hostmetrics'
    TCP connections (a cumulative sum that is not monotonic: a level), and its interface errors (a catalog
    counter: a counter, monotonic or not). One pod's CPU has a point past 2**63, out of its range."""
    times = [T0 + k * S for k in range(1, 7)]
    temperature = [(t, 2.0**48 if k == 3 else 60.0 + k) for k, t in enumerate(times)]
    dcgm = prometheus_scrape("10.0.0.7:9400", [receiver_gauge(
        "DCGM_FI_DEV_GPU_TEMP", "", temperature, {"gpu": "0", "UUID": "GPU-1", "Hostname": "n2"})], times=times)
    pods = [{"resourceMetrics": [{"resource": {"attributes": [
        attr("k8s.node.name", "n1"), attr("k8s.pod.name", pod), attr("k8s.namespace.name", "serving")]},
        "scopeMetrics": [{"scope": {"name": "kubeletstats"}, "metrics": [receiver_gauge(
            "k8s.pod.cpu.usage", "{cpu}", [(t, 1e19 if (k, pod) == (2, "embedder-0") else usage + 0.01 * k)
                                           for k, t in enumerate(times)])]}]}]}
        for pod, usage in (("embedder-0", 1.5), ("embedder-1", 3.0))]
    connections = metrics([cumulative("system.network.connections", "{connections}", T0, [
        (t, 100 + (-1) ** k * 10 * k) for k, t in enumerate(times)], {"protocol": "tcp", "state": "ESTABLISHED"},
        integer=True, monotonic=False),
        cumulative("system.network.errors", "{errors}", T0, [(t, 3 * k) for k, t in enumerate(times)],
                   {"device": "eth0", "direction": "receive"}, integer=True, monotonic=False)], node="n3")
    return [dcgm, *pods, connections]


# The metric tables' columns as sloscope 0.5.7 added them: no catalog rules.
EARLIER_COLUMNS = {
    "SloscopeNode": "coalesce(nullIf(ResourceAttributes['k8s.node.name'], ''), "
                    "nullIf(ResourceAttributes['host.name'], ''), 'unknown')",
    "SloscopeAttributes": "toJSONString(mapSort(Attributes))"}


STEPS_WINDOW = Window(datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 0, 3),
                      datetime(2025, 11, 29, 10, 0, 4), datetime(2025, 11, 29, 10, 1), 1.0)


def _add_columns_as_printed(directory, capsys, *options, settings="") -> None:
    """Run what `sloscope clickhouse-columns` prints, as clickhouse-client --multiquery would."""
    capsys.readouterr()
    url = f"chdb:///{directory}{settings}"
    assert main(["clickhouse-columns", *options, *(["--store", url] if settings else [])]) == 0
    with open_store(url, read_only=True) as store:
        for statement in capsys.readouterr().out.split("\n;\n"):
            if statement.strip():
                store.backend.execute(statement)


def _add_earlier_columns(directory) -> None:
    with open_store(f"chdb:///{directory}", read_only=True) as store:
        for table in (GAUGE, SUM, EXP_HISTOGRAM):
            for column, expression in EARLIER_COLUMNS.items():
                store.backend.execute(f"ALTER TABLE {table} ADD COLUMN {column} LowCardinality(String) "
                                      f"MATERIALIZED {expression}")


@pytest.mark.parametrize("tables", ["sloscope's", "the Collector's", "the Collector's with sloscope's columns",
                                    "the Collector's with an earlier release's columns",
                                    "the Collector's with an earlier release's columns, modified",
                                    "the Collector's under other names, with sloscope's columns"])
def test_points_the_collector_wrote_are_read_by_the_catalog_rules_as_the_decoders_read_them(tmp_path, capsys,
                                                                                          tables):
    """The decoders apply the catalog's rules to what they keep; the exporter writes the points as they came, so
    the queries apply the same rules: with sloscope's columns (made by ingest, or added to a Collector's tables
    with what `sloscope clickhouse-columns` prints), on a Collector's tables without them, and where an earlier
    release added them with other expressions (read as computed until `--modify` gives them this release's)."""
    requests = _receivers_requests()
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"),
                 str(write_lines(tmp_path / "in.jsonl", requests))]) == 1  # the point out of range: refused
    # The exporter's settings traces_table_name and metrics_table_name, as the store URL's query gives them.
    settings = "?traces_table_name=spans&metrics_table_name=fleet" if "other names" in tables else ""
    named = renaming(parse_store_url(f"chdb:///ch{settings}").table_names())
    if tables == "sloscope's":
        open_store(f"chdb:///{tmp_path}/ch").close()
    else:
        create_tables(tmp_path / "ch", named=named)
    if tables.endswith("with sloscope's columns"):
        _add_columns_as_printed(tmp_path / "ch", capsys, settings=settings)
    if "earlier release" in tables:
        _add_earlier_columns(tmp_path / "ch")
    if tables.endswith("modified"):
        _add_columns_as_printed(tmp_path / "ch", capsys, "--modify")
    with open_store(f"chdb:///{tmp_path}/ch{settings}", read_only=True) as ch:
        made = _made(ch)
        assert settings == "" or {"spans", "fleet_sum", "fleet_exponential_histogram"} <= made and not made & {
            TRACES, SUM, EXP_HISTOGRAM}
        for request in requests:
            for table, data in rows(request).items():
                ch.backend.insert(named(table), data)
        stale_or_lacking = tables in ("the Collector's", "the Collector's with an earlier release's columns")
        assert set(ch._sources) == (set(derived_columns()) if stale_or_lacking else set())
        warned = "added by an earlier release of sloscope, read as computed" in capsys.readouterr().err
        assert warned == tables.endswith("earlier release's columns")
        key = ["node", "metric", "attributes", "ts"]
        columns = "ts, node, metric, attributes, value, interval_s"
        engine = _sorted(ch.frame(f"SELECT {columns} FROM ({ch.sql('samples')})", EVERYTHING), key)
        engine_steps = signal_steps(ch, STEPS_WINDOW).sort("node", "metric", "attributes", "step")
    with Store(tmp_path / "x.duckdb", read_only=True) as duck:
        stored = _sorted(duck.frame(f"SELECT {columns} FROM samples"), key)
        stored_steps = signal_steps(duck, STEPS_WINDOW).sort("node", "metric", "attributes", "step")
    assert set(stored["node"]) == {"n1", "n2", "n3"}  # DCGM's on its Hostname
    assert stored.filter(pl.col("metric") == "k8s.pod.cpu.usage")["attributes"].n_unique() == 2
    assert stored.filter(pl.col("metric") == "k8s.pod.cpu.usage").height == 11  # the one out of range dropped
    assert stored.filter(pl.col("metric") == "DCGM_FI_DEV_GPU_TEMP").height == 5  # the blank one dropped
    assert stored.filter(pl.col("metric") == "system.network.connections")["interval_s"].is_null().all()
    errors = stored.filter(pl.col("metric") == "system.network.errors")
    assert errors["value"].to_list() == [0, 3, 3, 3, 3, 3] and errors["interval_s"].is_not_null().all()
    assert_same(engine.filter(pl.col("metric").is_in(list(set(stored["metric"])))), stored)
    # and what rca reads of them (the prometheus receiver's own series are on no node)
    assert set(stored_steps["node"]) == {"n1", "n2", "n3"}
    assert engine_steps.select("node", "metric", "attributes", "step").equals(
        stored_steps.select("node", "metric", "attributes", "step"))
    assert np.allclose(engine_steps["value"].to_numpy(), stored_steps["value"].to_numpy(), rtol=1e-12)


def test_writing_gives_an_earlier_releases_columns_this_releases_expressions(tmp_path):
    create_tables(tmp_path / "ch")
    _add_earlier_columns(tmp_path / "ch")
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as before:
        assert {table for table, _ in before._stale_columns()} == {GAUGE, SUM, EXP_HISTOGRAM}
    open_store(f"chdb:///{tmp_path}/ch").close()  # as ingest opens it
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as after:
        assert not after._stale_columns() and not after._sources


def test_the_printed_columns_name_a_cluster_quoted_and_refuse_what_is_not_a_cluster_name(capsys):
    assert main(["clickhouse-columns", "--on-cluster", "gpu-fleet", "--modify"]) == 0
    statements = [t for t in capsys.readouterr().out.split("\n;\n") if "ALTER TABLE" in t]
    assert statements and all("ALTER TABLE " in t and " ON CLUSTER 'gpu-fleet' " in t for t in statements)
    assert len([t for t in statements if " MODIFY COLUMN " in t]) * 2 == len(statements)
    with pytest.raises(SystemExit) as refused:
        main(["clickhouse-columns", "--on-cluster", "x' ADD COLUMN y"])
    assert refused.value.code == 2 and "is not a cluster name" in capsys.readouterr().err


def test_a_declared_explicit_histogram_the_collector_wrote_is_evidence_as_in_duckdb(tmp_path):
    """A Prometheus histogram an SLO spec declares reaches ClickHouse as the exporter writes explicit-bucket
    histograms (otel_metrics_histogram); rca reads its mean per step as DuckDB reads the same points, through a
    reset (the server restarted: counts went down, the start time unchanged), and one only a bucket shows."""
    counts = [[k, 2 * k, k, 0, 0, 0, k // 10] for k in range(1, 40)]
    counts[20:] = [[c - 20 if i < 3 else c for i, c in enumerate(row)] for row in counts[20:]]
    # and later a reset only a bucket shows: the first went down, the count did not
    counts[30:] = [[row[0], row[1] - 15, row[2] + 30, *row[3:]] for row in counts[30:]]
    points = [(T0 + k * 5 * S, 0.1 * sum(row) + 0.01 * k, BOUNDS, row) for k, row in enumerate(counts)]
    scrape = prometheus_scrape("10.4.2.31:8000", [explicit_histogram(
        "myllm:queue_time_seconds", T0 - 60 * S, points, {"model_name": "llama-3.1-8b"})], job="vllm")
    scrape["resourceMetrics"][0]["resource"]["attributes"].append(attr("k8s.node.name", "n1"))
    spec = tmp_path / "slo.yaml"
    spec.write_text(QUEUE_TIME)
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), "--slo", str(spec),
                 str(write_lines(tmp_path / "in.jsonl", [scrape]))]) == 0
    open_store(f"chdb:///{tmp_path}/ch").close()
    known = load_spec(spec).taxonomy
    window = Window(datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 2),
                    datetime(2025, 11, 29, 10, 2, 30), datetime(2025, 11, 29, 10, 5), 10.0)
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as ch:
        for table, data in rows(scrape).items():
            ch.backend.insert(table, data)
        engine = signal_steps(ch, window, known, evidence_only=True).sort("step")
    with Store(tmp_path / "x.duckdb", read_only=True) as duck:
        stored = signal_steps(duck, window, known, evidence_only=True).sort("step")
    assert set(stored["metric"]) == {"myllm:queue_time_seconds"} and stored.height >= 18
    assert engine.select("node", "metric", "attributes", "step").equals(
        stored.select("node", "metric", "attributes", "step"))
    assert np.allclose(engine["value"].to_numpy(), stored["value"].to_numpy(), rtol=1e-12)


def test_a_store_without_the_explicit_histogram_table_reads_as_without_its_rows(tmp_path):
    """sloscope before 0.5.8 made no otel_metrics_histogram: such a store still opens and reads."""
    duck, ch = _load_both(tmp_path, _metric_lines())
    window = Window(datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 0, 30),
                    datetime(2025, 11, 29, 10, 0, 40), datetime(2025, 11, 29, 10, 5), 10.0)
    with ch:
        before = signal_steps(ch, window).sort("node", "metric", "attributes", "step")
    with open_store(f"chdb:///{tmp_path}/ch") as store:
        store.backend.execute("DROP TABLE otel_metrics_histogram")
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as old:
        assert "system.one WHERE 0" in old._sources["otel_metrics_histogram"]
        after = signal_steps(old, window).sort("node", "metric", "attributes", "step")
    duck.close()
    assert before.height > 0 and after.equals(before)


def test_spans_in_the_exporters_earlier_spelling_are_the_same_requests(tmp_path):
    """The exporter's earlier releases wrote SPAN_KIND_SERVER and STATUS_CODE_ERROR where later ones write Server
    and Error; a table kept across an upgrade holds both, and both are requests (and failures)."""
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50 + (i % 7) * 40, error=i % 9 == 0,
                  tier=["standard"]) for i in range(200)]
    duck, ch = _load_both(tmp_path, [traces(spans, node="n1")])
    spec = load_spec(None)
    since, until = datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 5)
    with duck:
        stored = sli_windows(duck, spec, since, until)["standard"]
    ch.backend.execute("ALTER TABLE otel_traces UPDATE SpanKind = 'SPAN_KIND_SERVER', StatusCode = "
                       "if(StatusCode = 'Error', 'STATUS_CODE_ERROR', 'STATUS_CODE_UNSET') WHERE Timestamp < "
                       "fromUnixTimestamp64Nano(toInt64(%d)) SETTINGS mutations_sync = 1" % (T0 + 25 * S))
    with ch:
        assert ch.rows("SELECT uniqExact(SpanKind) FROM otel_traces")[0][0] == 2
        engine = sli_windows(ch, spec, since, until)["standard"]
        assert ch.rows(ch.sql("data_range")) == [(datetime(2025, 11, 29, 10), datetime(2025, 11, 29, 10, 0, 49, 750000))]
    assert stored["failures"].sum() == 23
    assert_same(engine, stored)


def test_the_evidence_steps_leave_out_only_what_no_cause_reads_in_both_engines(tmp_path):
    limit = gauge("hw.gpu.memory.limit", [(T0 + k * 5 * S, 8e10) for k in range(1, 15)], attrs={"hw.id": "GPU-1"})
    duck, ch = _load_both(tmp_path, _metric_lines() + [metrics([limit], node="n1")])
    window = Window(datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 0, 30),
                    datetime(2025, 11, 29, 10, 0, 40), datetime(2025, 11, 29, 10, 5), 10.0)
    with duck, ch:
        for store in (duck, ch):
            every, evidence = (set(signal_steps(store, window, evidence_only=only)["metric"]) for only in (False, True))
            assert "hw.gpu.memory.limit" in every and "hw.gpu.memory.limit" not in evidence
            assert every - evidence == {"hw.gpu.memory.limit"}
            assert "hw.gpu.utilization" in evidence and "sloscope.syscall.duration" in evidence


@pytest.mark.parametrize("dropped", ["all", "the last of each table's"])
def test_tables_without_sloscopes_columns_read_the_same(tmp_path, dropped):
    """The Collector's own tables lack the columns ingest adds, and tables an earlier release gave its columns lack
    those added since: the queries compute what is lacking as they read, beside the columns that are there."""
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50 + (i % 7) * 40, status=500 if i % 11 == 0 else 200,
                  tier=["standard"]) for i in range(60)]
    duck, ch = _load_both(tmp_path, _metric_lines() + [traces(spans, node="n1")])
    duck.close()
    queries = {"requests": ["trace_id"], "samples": ["node", "metric", "attributes", "ts"],
               "histograms": ["node", "metric", "attributes", "ts"]}
    with ch:
        assert not ch._sources  # ingest made them
        before = {name: ch.frame(f"SELECT * FROM ({ch.sql(name)})", EVERYTHING).sort(key)
                  for name, key in queries.items()}
    with open_store(f"chdb:///{tmp_path}/ch") as store:
        for table, columns in derived_columns().items():
            for column in list(columns) if dropped == "all" else list(columns)[-1:]:
                store.backend.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as bare:
        assert set(bare._sources) == set(derived_columns())
        for name, key in queries.items():
            assert before[name].height > 0
            assert_same(bare.frame(f"SELECT * FROM ({bare.sql(name)})", EVERYTHING).sort(key), before[name])


def test_ingest_records_its_counters_and_the_spec_in_the_clickhouse_store(tmp_path):
    slo = tmp_path / "slo.yaml"
    slo.write_text("default_tier: bulk\ntiers:\n  bulk:\n    latency: {percentile: 90, threshold_ms: 500}\n"
                   "    availability: 99\n")
    path = write_lines(tmp_path / "in.jsonl", [traces([span(f"{i:032x}", f"{i:016x}", T0 + i * S, 10,
                                                            tier="standard") for i in range(5)], node="n1")])
    assert main(["ingest", "--store", f"chdb:///{tmp_path}/ch", "--slo", str(slo), str(path)]) == 0
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as store:
        assert store.counters()["requests_loaded"] == 5
        assert store.counters()["tier_invalid"] == 5  # standard is not a tier of this spec
        assert list(store.slo_spec().tiers) == ["bulk"]
        assert json.loads(json.dumps(store.rows(store.sql("data_range"))[0], default=str))[0].startswith("2025-11-29")


def test_dcgm_fields_go_on_when_a_new_pod_takes_the_gpu_and_a_declared_one_is_read_as_the_catalogs(tmp_path):
    """dcgm-exporter's pod mapping labels a GPU's fields with its pod of the moment: the GPU's series goes on through
    a rollout, on both stores. A field the spec declares (the PCIe replay counter) is placed by its Hostname label
    and its blank sentinel dropped, as the catalog's DCGM fields are."""
    from tests.receiver_otlp import dcgm_labels

    def labels(k):
        pod = "vllm-7f9c-a" if k < 6 else "vllm-8d2e-b"  # a rollout halfway
        return {**dcgm_labels("n1"), "pod": pod, "namespace": "serving", "container": "vllm"}

    times = [T0 + k * 10 * S for k in range(12)]
    sm = [receiver_gauge("DCGM_FI_PROF_SM_ACTIVE", "1", [(t, 0.4 + 0.01 * k)], labels(k))
          for k, t in enumerate(times)]
    replays = [cumulative("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "", T0 - 60 * S,
                          [(t, 2.0**47 if k == 3 else float(5 * k))], labels(k)) for k, t in enumerate(times)]
    scrape = prometheus_scrape("10.4.2.31:9400", sm + replays)
    spec = tmp_path / "slo.yaml"
    spec.write_text(TIERS + "causes:\n  pcie_replays: {layer: hardware, physical: link, remediation: 'drain {node}'}\n"
                    "evidence:\n  - {metric: DCGM_FI_DEV_PCIE_REPLAY_COUNTER, cause: pcie_replays, harmful: up}\n")
    path = write_lines(tmp_path / "in.jsonl", [scrape])
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), "--slo", str(spec), str(path)]) in (0, 1)
    assert main(["ingest", "--store", f"chdb:///{tmp_path}/ch", "--slo", str(spec), str(path)]) in (0, 1)
    columns = "ts, node, metric, attributes, value"
    with Store(tmp_path / "x.duckdb", read_only=True) as duck, \
            open_store(f"chdb:///{tmp_path}/ch", read_only=True) as ch:
        stored = duck.frame(f"SELECT {columns} FROM samples").sort("metric", "ts")
        engine = ch.frame(f"SELECT {columns} FROM ({ch.sql('samples')}) WHERE metric LIKE 'DCGM%'",
                          EVERYTHING).sort("metric", "ts")
    assert set(stored["node"]) == {"n1"} and stored["attributes"].n_unique() == 1
    assert "pod" not in json.loads(stored["attributes"][0]) and json.loads(stored["attributes"][0])["UUID"]
    assert stored.filter(pl.col("metric") == "DCGM_FI_PROF_SM_ACTIVE").height == 12
    assert stored.filter(pl.col("metric") == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")["value"].max() < 2.0**47
    assert_same(engine, stored)


def test_a_node_whose_clock_runs_ahead_does_not_move_what_relative_times_count_back_from(tmp_path):
    """`rca --since 1h` counts back from the newest request that is not in the future (this host's clock and a
    skew allowance), on both stores: a year-ahead node's span would leave the hour empty."""
    from sloscope.analytics.rca import CLOCK_SKEW, newest_request

    now = datetime(2025, 11, 29, 10, 30)
    spans = [span(f"{i + 1:032x}", f"{i + 1:016x}", T0 + i * 60 * S, 100) for i in range(20)]
    ahead = traces([span("f" * 32, "f" * 16, T0 + 365 * 86_400 * S, 100)], node="skewed")
    duck, ch = _load_both(tmp_path, [traces(spans, node="n1"), ahead])
    with duck, ch:
        for store in (duck, ch):
            assert newest_request(store, now) == datetime(2025, 11, 29, 10, 19)
            assert newest_request(store, now - timedelta(days=1)) == datetime(2026, 11, 29, 10)  # all ahead
            assert newest_request(store, datetime(2026, 11, 29, 10) - CLOCK_SKEW) == datetime(2026, 11, 29, 10)
