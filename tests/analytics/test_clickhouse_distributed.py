"""The exporter's tables behind ClickHouse's Distributed engine (a sharded fleet's layout: a `*_local` table on every
shard, a Distributed table under the exporter's name), on a one-shard cluster of this chDB, and a Collector that
made only the tables its pipelines fill."""

import re
from contextlib import contextmanager
from datetime import datetime

import pytest

chdb_session = pytest.importorskip("chdb.session")

from sloscope.analytics.clickhouse_store import ChdbBackend, derived_columns  # noqa: E402
from sloscope.analytics.exporter_tables import EXP_HISTOGRAM, GAUGE, HISTOGRAM, READ_TABLES, SUM, TRACES  # noqa: E402
from sloscope.analytics.stores import CHDB_DATABASE, open_store  # noqa: E402
from sloscope.commands.cli import main  # noqa: E402
from tests.exporter_versions import create_tables  # noqa: E402
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces, write_lines  # noqa: E402

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000
EVERYTHING = {"since": datetime(2000, 1, 1), "until": datetime(2100, 1, 1)}
TABLES = (TRACES, GAUGE, SUM, HISTOGRAM, EXP_HISTOGRAM)
# The shard is this process: its replica's port is the tcp_port it would serve (chDB serves none).
CLUSTER = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <remote_servers>
    <fleet><shard><replica><host>localhost</host><port>9000</port></replica></shard></fleet>
  </remote_servers>
</clickhouse>
"""
RELATIONS = {"requests": ["trace_id"], "samples": ["node", "metric", "attributes", "ts"],
             "histograms": ["node", "metric", "attributes", "ts"]}


def _lines():
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S // 4, 50 + (i % 7) * 40, status=500 if i % 11 == 0 else 200,
                  tier=["standard"]) for i in range(60)]
    series = [counter("sloscope.tcp.retransmits", T0, [(T0 + k * 10 * S, 10 * k) for k in range(1, 6)]),
              gauge("hw.gpu.utilization", [(T0 + k * 5 * S, 0.1 * k) for k in range(1, 15)], attrs={"hw.id": "GPU-1"}),
              exp_histogram("sloscope.syscall.duration", T0, [(T0 + k * 10 * S, 4 * k, 0.5 * k, -20, [k, 3 * k])
                                                             for k in range(1, 5)])]
    return [traces(spans, node="n1"), metrics(series, node="n1"), metrics(series[:2], node="n2")]


def _relations(url: str) -> dict:
    with open_store(url, read_only=True) as store:
        return {name: store.frame(f"SELECT * FROM ({store.sql(name)})", EVERYTHING).sort(key)
                for name, key in RELATIONS.items()}


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """chDB sessions that know the cluster `fleet`: one shard, this process."""
    config = tmp_path / "cluster.xml"
    config.write_text(CLUSTER)
    session = chdb_session.Session
    monkeypatch.setattr(chdb_session, "Session", lambda path: session(f"{path}?config-file={config}"))


def _distributed_layout(directory) -> None:
    """The exporter's tables as `*_local` tables, each read by a Distributed table of the exporter's name."""
    local = re.compile(r"\b(" + "|".join(TABLES) + r")\b")
    create_tables(directory, named=lambda text: local.sub(r"\1_local", text))
    with _backend(directory) as backend:
        for table in TABLES:
            backend.execute(f"CREATE TABLE {table} AS {table}_local "
                            f"ENGINE = Distributed('fleet', currentDatabase(), '{table}_local', rand())")


@contextmanager
def _backend(directory):
    backend = ChdbBackend(directory, CHDB_DATABASE)
    try:
        yield backend
    finally:
        backend.close()


def _apply_printed_columns(directory, capsys, *options) -> None:
    capsys.readouterr()
    assert main(["clickhouse-columns", *options]) == 0
    with _backend(directory) as backend:
        for statement in capsys.readouterr().out.split("\n;\n"):
            if statement.strip():
                backend.execute(statement)


def _sloscope_columns(directory) -> dict[str, int]:
    with _backend(directory) as backend:
        rows = backend.arrow("SELECT table, count() AS n FROM system.columns WHERE database = currentDatabase() "
                             "AND name LIKE 'Sloscope%' GROUP BY table").to_pylist()
    return {row["table"]: row["n"] for row in rows}


def test_distributed_tables_read_as_the_plain_ones_however_their_columns_were_added(tmp_path, cluster, capsys):
    path = write_lines(tmp_path / "in.jsonl", _lines())
    assert main(["ingest", "--store", f"chdb:///{tmp_path}/plain", str(path)]) == 0
    expected = _relations(f"chdb:///{tmp_path}/plain")
    directory = tmp_path / "dist"
    _distributed_layout(directory)

    # ingest writes through the Distributed tables and leaves them without columns their shards lack
    capsys.readouterr()
    assert main(["ingest", "--store", f"chdb:///{directory}", str(path)]) == 0
    warned = capsys.readouterr().err
    assert "Distributed engine" in warned and "--local-suffix" in warned
    assert _sloscope_columns(directory) == {}
    with _backend(directory) as backend:  # a Distributed insert reaches the shards in the background
        for table in TABLES:
            backend.execute(f"SYSTEM FLUSH DISTRIBUTED {table}")

    # the columns on the Distributed tables alone (what a user who missed --local-suffix runs): computed as read
    _apply_printed_columns(directory, capsys)
    assert set(_sloscope_columns(directory)) == set(derived_columns())
    with open_store(f"chdb:///{directory}", read_only=True) as store:
        assert set(store._sources) == set(derived_columns())
    reread = _relations(f"chdb:///{directory}")

    # on the shards' tables too, with --local-suffix: read from the columns
    _apply_printed_columns(directory, capsys, "--local-suffix", "_local")
    assert set(_sloscope_columns(directory)) == set(derived_columns()) | {f"{t}_local" for t in derived_columns()}
    with open_store(f"chdb:///{directory}", read_only=True) as store:
        assert not store._sources
    shared = _relations(f"chdb:///{directory}")
    for name in RELATIONS:
        assert expected[name].height > 0
        assert reread[name].equals(expected[name]) and shared[name].equals(expected[name])


def test_a_collector_that_made_no_exponential_histogram_table_is_read_without_its_rows(tmp_path, capsys):
    """With `create_schema: false` the tables are the administrator's: a fleet whose producers send no exponential
    histograms may have none, and its spans and points are read all the same."""
    directory = tmp_path / "ch"
    create_tables(directory)
    path = write_lines(tmp_path / "in.jsonl", _lines()[:2])
    assert main(["ingest", "--store", f"chdb:///{directory}", str(path)]) == 0
    with _backend(directory) as backend:
        backend.execute(f"DROP TABLE {EXP_HISTOGRAM}")
        backend.execute(f"DROP TABLE {HISTOGRAM}")
    assert EXP_HISTOGRAM not in READ_TABLES
    capsys.readouterr()
    assert main(["rca", "--store", f"chdb:///{directory}", "--format", "json"]) == 0
    assert '"incidents"' in capsys.readouterr().out
    relations = _relations(f"chdb:///{directory}")
    assert relations["requests"].height == 60 and relations["samples"].height > 0
    assert relations["histograms"].height == 0
