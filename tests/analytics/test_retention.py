"""`sloscope retention`: rows older than the kept period go, recent ones stay, and the deletions are counted."""

import json
import threading
import time
from datetime import datetime, timedelta, timezone

from sloscope import exposition
from sloscope.analytics.retention import RetentionSchedule
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from tests.in_process import InProcessReceiver
from tests.otlp_builders import exp_histogram, gauge, metrics, span, traces, write_lines

S = 1_000_000_000
DAY = 86_400 * S


def _load(tmp_path):
    now = time.time_ns() // S * S
    old, recent = now - 8 * DAY, now - DAY
    lines = [traces([span(f"{i:032x}", f"{i:016x}", t, 10, tier="standard") for i, t in enumerate((old, recent))]),
             metrics([gauge("hw.gpu.utilization", [(old, 0.5), (recent, 0.6)], attrs={"hw.id": "GPU-1"}),
                      exp_histogram("sloscope.syscall.duration", old - S, [(old, 2, 0.1, -20, [2]),
                                                                            (recent, 5, 0.3, -20, [5])], temporality=1)])]
    path = write_lines(tmp_path / "in.jsonl", lines)
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(path)]) == 0


def _count(tmp_path, table):
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        return store.scalar(f"SELECT count(*) FROM {table}")


def test_rows_older_than_the_kept_period_go_and_recent_ones_stay(tmp_path):
    _load(tmp_path)
    assert [_count(tmp_path, t) for t in ("requests", "samples", "histograms")] == [2, 2, 2]
    assert main(["retention", "--store", f"duckdb:///{tmp_path}/x.duckdb", "--keep", "7d"]) == 0
    assert [_count(tmp_path, t) for t in ("requests", "samples", "histograms")] == [1, 1, 1]
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        counters = store.counters()
        assert store.scalar("SELECT value FROM samples") == 0.6
    assert counters["retention_deleted_requests"] == 1 and counters["retention_deleted_histograms"] == 1
    assert main(["retention", "--db", str(tmp_path / "x.duckdb"), "--keep", "2d"]) == 0
    assert _count(tmp_path, "requests") == 1  # a day old: kept


def test_retention_needs_a_duration_and_a_duckdb_store(tmp_path, capsys):
    _load(tmp_path)
    assert main(["retention", "--db", str(tmp_path / "x.duckdb"), "--keep", "a week"]) == 2
    assert "--keep" in capsys.readouterr().err
    assert _count(tmp_path, "requests") == 2
    assert main(["retention", "--db", str(tmp_path / "typo.duckdb"), "--keep", "7d"]) == 2
    assert "typo.duckdb: no such database" in capsys.readouterr().err
    assert not (tmp_path / "typo.duckdb").exists()


# --- serve --retention: the schedule on the writer's thread ------------------------------------------------------

def _old_and_recent_spans(first_id: int) -> bytes:
    now = time.time_ns() // S * S
    spans = [span(f"{first_id + i:032x}", f"{first_id + i:016x}", t, 10, tier="standard")
             for i, t in enumerate((now - 8 * DAY, now - DAY))]
    return json.dumps(traces(spans)).encode()


def test_serve_applies_retention_at_start_and_again_between_writes(tmp_path):
    _load(tmp_path)
    runs = threading.Semaphore(0)

    def clock():  # called by each run, on the writer's thread
        runs.release()
        return datetime.now(timezone.utc).replace(tzinfo=None)

    server = InProcessReceiver(tmp_path / "x.duckdb")
    schedule = RetentionSchedule(server.store, server.writer, timedelta(days=7), interval_s=0.05, clock=clock)
    try:
        schedule.start()
        assert runs.acquire(timeout=10)  # the run at start
        assert server.post("/v1/traces", _old_and_recent_spans(100), "application/json")[0] == 200
        for _ in range(3):  # runs after that write: its old span goes too
            assert runs.acquire(timeout=10)
        schedule.stop()
        kept = server.rows("SELECT span_id FROM requests ORDER BY span_id")
        counters = server.store.counters()
    finally:
        server.close()
    assert kept == [(1,), (101,)]  # the two recent spans; both old ones deleted
    assert counters["retention_deleted_requests"] == 2
    assert counters["retention_deleted_samples"] == 1 and counters["retention_deleted_histograms"] == 1
    assert counters["retention_runs"] >= 4


def test_a_failed_retention_run_is_counted_and_the_next_one_tries_again(tmp_path):
    _load(tmp_path)
    with Store(tmp_path / "x.duckdb") as store:
        store.con.execute("DROP TABLE histograms")  # the last delete of the transaction fails
        schedule = RetentionSchedule(store, writer=None, keep=timedelta(days=7))
        assert schedule.run_once() is None
        assert store.counters()["retention_failures"] == 1
        assert store.scalar("SELECT count(*) FROM requests") == 2  # rolled back with the failure


def test_serve_with_retention_starts_cleanly_every_time(tmp_path):
    # The run at start is on the writer's thread while serve still starts up: serve must not read its store from
    # the main thread meanwhile (one DuckDB connection, two threads: a failed run, or an aborted process).
    from tests.alerting_stack import free_port, wait_listening
    from tests.commands.test_serve_operable import _scrape, _serve, _stop

    _load(tmp_path)
    for attempt in range(3):
        port = free_port()
        proc = _serve(tmp_path / "x.duckdb", "--retention", "7d", http_port=port)
        try:
            wait_listening(port, proc, "sloscope serve")
            deadline = time.monotonic() + 20
            while not (scraped := _scrape(port)).get(("sloscope_ingest_retention_runs_total", ())):
                assert time.monotonic() < deadline, "no retention run at start"
                time.sleep(0.1)
        finally:
            stderr = _stop(proc)
        assert proc.returncode == 0, stderr
        assert scraped.get(("sloscope_ingest_retention_failures_total", ()), 0) == 0, stderr
        assert "Traceback" not in stderr
    assert _count(tmp_path, "requests") == 1


def _request_families(store, spec) -> dict:
    """Every sample of /metrics' request families: (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    from sloscope import metric_names
    from sloscope.alerts.store_metrics import StoreCollector

    text = exposition.render(StoreCollector(store.reading, spec)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            if f.name in (metric_names.REQUEST_DURATION, "sloscope_requests", "sloscope_request_errors") for s in f.samples}


def test_request_counters_never_go_down_when_retention_deletes(tmp_path):
    """Prometheus reads a counter that goes down as a reset and counts everything kept again (old incidents page
    again): what retention deletes stays counted, at every bucket, through a spec that adds a bound between runs."""
    import pytest

    from sloscope.analytics.retention import apply_retention

    tighter = "default_tier: standard\ntiers:\n  standard:\n    latency: {percentile: 95, threshold_ms: 300}\n" \
              "    availability: 99.0\n"
    now = datetime(2026, 1, 10)
    start = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()) * S
    lines = [traces([span(f"{n}{i + 1:031x}", f"{n}{i + 1:015x}", start + i * 3600 * S, [30, 180, 450, 2000][i % 4],
                          tier="standard", status=503 if i % 5 == 0 else 200) for i in range(24 * 9)], node=f"n{n}")
             for n in (1, 2)]
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(write_lines(tmp_path / "in.jsonl", lines))]) == 0
    with Store(tmp_path / "x.duckdb") as store:
        for keep_days, spec_text in ((6, None), (4, tighter), (2, tighter)):
            if spec_text:
                store.set_meta("slo_spec", spec_text)
            shown = _request_families(store, store.slo_spec())
            assert apply_retention(store, timedelta(days=keep_days), now)["requests"] > 0
            after = _request_families(store, store.slo_spec())
            assert after == pytest.approx(shown, rel=1e-12)
        assert store.scalar("SELECT count(*) FROM requests") == 2 * 48  # two nodes, the last two days
    errors = {k: v for k, v in after.items() if k[0] == "sloscope_request_errors_total"}
    assert sorted(errors.values()) == [44, 44] and len(shown) == 2 * (len(shown) // 2)


def test_a_scrape_during_a_retention_run_counts_each_request_once(tmp_path):
    """The request families read the kept and the retired counts in two queries: a retention run committed
    between them is seen by both or neither, never counted twice."""
    from contextlib import contextmanager

    from sloscope.alerts.store_metrics import StoreCollector
    from sloscope.analytics.retention import apply_retention

    _load(tmp_path)
    with Store(tmp_path / "x.duckdb") as store:
        @contextmanager
        def reading_with_a_run_between_its_queries():
            with store.reading() as reader:
                query = reader.rows

                def rows(sql, params=None):
                    found = query(sql, params)
                    if "retention deleted" not in sql and "per tier, service, node and latency bucket" in sql:
                        apply_retention(store, timedelta(days=7), datetime.now(timezone.utc).replace(tzinfo=None))
                    return found
                reader.rows = rows
                yield reader

        text = exposition.render(StoreCollector(reading_with_a_run_between_its_queries)).decode()
        assert store.scalar("SELECT count(*) FROM retired_requests") > 0  # the run deleted and counted
    totals = [line for line in text.splitlines() if line.startswith("sloscope_requests_total{")]
    assert totals and sum(float(line.rsplit(" ", 1)[1]) for line in totals) == 2
