"""A store written by an older version is brought to the current schema when it is opened for writing, its rows
kept: version 1 had no requests.pod_ip, versions 1 and 2 kept the ids as hex text, versions 1 to 3 kept one
cumulative state per (node, metric, attributes) whatever its kind, versions 1 to 4 kept no count of the requests
retention deleted, versions 1 to 5 no trace graph, versions 1 to 6 no token timings."""

from __future__ import annotations

import duckdb
import pytest

from sloscope.analytics.store import SCHEMA_VERSION, Store, StoreError
from tests.otlp_builders import SPAN_ID, TRACE_ID

TRACE, SPAN = "f5b165224a58b791df6af1d8303e61cd", "04bb86c3d1c42710"
VERSION_2_REQUESTS = """CREATE TABLE requests (trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL,
    start_time TIMESTAMP NOT NULL, duration_ms DOUBLE NOT NULL, service VARCHAR NOT NULL, node VARCHAR NOT NULL,
    tier VARCHAR NOT NULL, pod VARCHAR, namespace VARCHAR, pod_ip VARCHAR, gpu_id VARCHAR, route VARCHAR,
    status_code SMALLINT, failed BOOLEAN NOT NULL)"""
VERSION_3_STATE = """CREATE TABLE cumulative_state (node VARCHAR NOT NULL, metric VARCHAR NOT NULL,
    attributes VARCHAR NOT NULL, start_ns BIGINT NOT NULL, time_ns BIGINT NOT NULL, value DOUBLE, count UBIGINT,
    sum DOUBLE, buckets UBIGINT[], PRIMARY KEY (node, metric, attributes))"""


def _older_store(db, version: int) -> None:
    with Store(db) as store:
        for column in ("model", "ttft_ms", "tpot_ms", "queue_ms", "prompt_tokens", "output_tokens"):
            store.con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        store.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
        if version == 6:
            return
        store.con.execute("DROP TABLE spans")
        store.con.execute("ALTER TABLE requests DROP COLUMN parent_id")
        store.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
        if version == 5:
            return
        store.con.execute("DROP TABLE retired_requests")
        if version == 4:
            return
        store.con.execute("DROP TABLE cumulative_state")
        store.con.execute(VERSION_3_STATE)
        store.con.execute("INSERT INTO cumulative_state VALUES ('n1', 'a.counter', '{}', 1, 2, 7.5, NULL, NULL, NULL), "
                          "('n1', 'a.histogram', '{}', 1, 2, NULL, 3, 4.5, [1, 2])")
        if version == 3:
            return
        store.con.execute("DROP TABLE requests")
        store.con.execute(VERSION_2_REQUESTS)
        store.con.execute("INSERT INTO requests (trace_id, span_id, start_time, duration_ms, service, node, tier, "
                          "pod_ip, failed) VALUES (?, ?, TIMESTAMP '2026-12-01 10:00:00', 1.0, 'svc', 'n1', "
                          "'standard', '10.0.0.7', false)", [TRACE, SPAN])
        if version == 1:
            store.con.execute("ALTER TABLE requests DROP COLUMN pod_ip")
        store.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_an_older_store_is_migrated_with_its_rows(tmp_path, version):
    db = tmp_path / f"v{version}.duckdb"
    _older_store(db, version)
    with pytest.raises(StoreError, match=f"schema version {version}, .* migrates it"):
        Store(db, read_only=True)  # a reader does not migrate: it says why it cannot read
    with Store(db) as store:
        assert store.meta("schema_version") == str(SCHEMA_VERSION) == "7"
        assert store.rows("SELECT count(*) FROM spans") == [(0,)]  # the trace graph's, new in 6
        columns = dict(store.rows("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'requests'"))
        assert columns["parent_id"] == "UBIGINT"
        assert [columns[c] for c in ("model", "ttft_ms", "tpot_ms", "queue_ms", "prompt_tokens", "output_tokens")] == [
            "VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "BIGINT", "BIGINT"]  # new in 7
        assert store.rows("SELECT count(*) FROM retired_requests") == [(0,)]
        if version >= 4:
            return
        assert store.rows("SELECT metric, kind, value, count, buckets FROM cumulative_state ORDER BY metric") == [
            ("a.counter", "sum", 7.5, None, None), ("a.histogram", "histogram", None, 3, [1, 2])]
        if version < 3:
            pod_ip = None if version == 1 else "10.0.0.7"
            assert store.rows(f"SELECT {TRACE_ID}, {SPAN_ID}, node, pod_ip FROM requests") == [
                (TRACE, SPAN, "n1", pod_ip)]
        types = dict(store.rows("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'requests'"))
        assert types["trace_hi"] == types["trace_lo"] == types["span_id"] == "UBIGINT" and "trace_id" not in types
    with Store(db) as store:  # migrated once: opening again changes nothing
        assert store.rows("SELECT count(*) FROM cumulative_state") == [(2,)]


def test_a_migration_that_fails_leaves_the_store_as_it_was(tmp_path):
    db = tmp_path / "v2.duckdb"
    _older_store(db, 2)
    con = duckdb.connect(str(db))  # no decoder ever stored such an id: a damaged or hand-edited store
    con.execute("UPDATE requests SET trace_id = 'not hex'")
    con.close()
    with pytest.raises(StoreError, match="cannot migrate from schema version 2 to 3"):
        Store(db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [("2",)]
    assert con.execute("SELECT trace_id, span_id FROM requests").fetchall() == [("not hex", SPAN)]
    con.close()
