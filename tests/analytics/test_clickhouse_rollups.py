"""The ClickHouse store's rollups (analytics/rollups.py): an analysis that reads them answers exactly as one of the
raw tables, whatever the range, after rows arrive late, and after a batch was cut short; a second analysis reads
them instead of computing them again; a store that cannot keep them reads the raw tables."""

import logging
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("chdb")

from sloscope.analytics.attribution import GROWTH_SUFFIX  # noqa: E402
from sloscope.analytics.ingest import Ingestor  # noqa: E402
from sloscope.analytics.rca import analyse  # noqa: E402
from sloscope.analytics.store import StoreError  # noqa: E402
from sloscope.analytics.stores import open_store  # noqa: E402
from sloscope.enrich.tiers import TierResolver  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from tests.exporter_versions import create_tables  # noqa: E402
from tests.rollup_reads import SPEC, headers, raw_only, sli, steps  # noqa: E402

# Recent: rollups are kept, and read, for the last 7 days only.
START = (datetime.now(timezone.utc) - timedelta(minutes=20)).replace(tzinfo=None, second=0, microsecond=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A chDB store of a 3-node fleet, 13 minutes with a storage fault."""
    out = tmp_path_factory.mktemp("rollups")
    simulate(SimulationConfig(out=out / "otlp", nodes=3, seed=4, fault="storage_queue", rate=4.0, duration_s=780,
                              start=START.isoformat() + "Z"))
    return _loaded(f"chdb:///{out}/ch", out / "otlp")


def _loaded(url: str, otlp) -> str:
    with open_store(url) as store:
        Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files(sorted(otlp.glob("*.jsonl*")))
    return url


def test_a_second_analysis_reads_the_rollups_and_answers_as_the_raw_tables(fleet):
    """The fleet is young: its windows begin at a node's first signal, inside a step that holds other nodes' earlier
    points, so their steps are read raw; the SLI windows are rolled up."""
    with open_store(fleet, read_only=True) as store:
        first = analyse(store, SPEC)
        batches = headers(store, "sloscope_sli_rollup"), headers(store, "sloscope_step_rollup")
        assert batches[0]
    with open_store(fleet, read_only=True) as store:
        assert analyse(store, SPEC) == first
        assert (headers(store, "sloscope_sli_rollup"), headers(store, "sloscope_step_rollup")) == batches
    with open_store(fleet, read_only=True) as store:
        assert analyse(raw_only(store), SPEC) == first
    assert first["incidents"]


def test_any_range_gives_the_raw_tables_rows(fleet):
    """Ranges that begin and end anywhere, inside a step or window or on the grid: those that cut one holding rows
    outside them read the raw tables, the others the rollups, and both give the raw rows."""
    rng = random.Random(7)
    with open_store(fleet, read_only=True) as store, open_store(fleet, read_only=True) as raw:
        raw_only(raw)
        ranges = [(START + timedelta(minutes=4), START + timedelta(minutes=9))]
        for _ in range(6):
            since = START + timedelta(seconds=rng.choice([0, 60, 130, 300]) + rng.choice([0, 0.5, 5, 7.25]))
            ranges.append((since, since + timedelta(seconds=rng.choice([60, 200, 420]) + rng.choice([0, 3.5, 10]))))
        for since, until in ranges:
            assert sli(store, since, until).equals(sli(raw, since, until))
            assert steps(store, since, until).equals(steps(raw, since, until))
            node = "gpu-node-1"
            assert steps(store, since, until, node).equals(steps(raw, since, until, node))
        assert headers(store, "sloscope_step_rollup")


def test_rows_that_arrive_late_are_counted(fleet):
    """Spans and points written after a chunk was rolled up (a Collector's retry, a late batch) change it."""
    since, until = START + timedelta(minutes=2), START + timedelta(minutes=8)
    late_from, late_to = START + timedelta(minutes=4, seconds=10), START + timedelta(minutes=4, seconds=40)
    with open_store(fleet) as store:
        before_sli, before_steps = sli(store, since, until), steps(store, since, until)
        store.execute("INSERT INTO otel_traces SELECT * REPLACE (concat(SpanId, 'late') AS SpanId, "
                      "Duration * 50 AS Duration) FROM otel_traces "
                      "WHERE Timestamp >= {a:DateTime64(6)} AND Timestamp < {b:DateTime64(6)}",
                      {"a": late_from, "b": late_to})
        store.execute("INSERT INTO otel_metrics_gauge SELECT * REPLACE (Value * 10 + 1 AS Value, "
                      "TimeUnix + toIntervalMillisecond(1) AS TimeUnix) FROM otel_metrics_gauge "
                      "WHERE TimeUnix >= {a:DateTime64(6)} AND TimeUnix < {b:DateTime64(6)}",
                      {"a": late_from, "b": late_to})
        after_sli, after_steps = sli(store, since, until), steps(store, since, until)
        assert not after_sli.equals(before_sli) and not after_steps.equals(before_steps)
        raw_only(store)
        assert after_sli.equals(sli(store, since, until))
        assert after_steps.equals(steps(store, since, until))


def test_a_batch_without_its_header_is_never_read(fleet):
    """Rows of a batch whose header is missing (a write cut short) are left aside, and the chunk computed again."""
    since, until = START + timedelta(minutes=1), START + timedelta(minutes=6)
    with open_store(fleet) as store:
        expected = sli(store, since, until)
        store.execute("DELETE FROM sloscope_sli_rollup WHERE header AND chunk_start = {c:DateTime64(6)}",
                      {"c": START + timedelta(minutes=3)})
        assert sli(store, since, until).equals(expected)
        assert store.scalar("SELECT count() FROM sloscope_sli_rollup WHERE header "
                            "AND chunk_start = {c:DateTime64(6)}", {"c": START + timedelta(minutes=3)})


def test_a_counter_silent_for_more_than_five_minutes_starts_afresh_wherever_the_range_begins(fleet, tmp_path):
    """A step's value does not depend on where the range begins, which the rollups' exactness rests on: a point
    more than 5 minutes after its series' last one is read as a first point, from a range that holds both or one
    that begins after the gap alike."""
    gap_from, gap_to = START + timedelta(minutes=3), START + timedelta(minutes=9, seconds=30)
    url = f"chdb:///{tmp_path}/gap"
    tables = ("otel_traces", "otel_metrics_sum", "otel_metrics_gauge", "otel_metrics_exponential_histogram")
    with open_store(fleet) as source:  # chDB opens one database directory at a time in a process
        rows = {table: source.backend.arrow(f"SELECT * FROM {table}") for table in tables}
    with open_store(url) as store:
        for table, data in rows.items():
            store.insert(table, data)
        store.execute("DELETE FROM otel_metrics_sum WHERE TimeUnix >= {a:DateTime64(6)} "
                      "AND TimeUnix < {b:DateTime64(6)}", {"a": gap_from, "b": gap_to})
        raw_only(store)
        wide = steps(store, START + timedelta(minutes=1), START + timedelta(minutes=12))
        narrow = steps(store, gap_to, START + timedelta(minutes=12))
        measured = ~pl.col("metric").cast(pl.String).str.ends_with(GROWTH_SUFFIX)  # growth reads steps before the range
        after_gap = wide.filter(measured & (pl.col("step") >= narrow["step"].min()))
        assert not narrow.is_empty() and after_gap.equals(narrow.filter(measured))


def test_a_store_that_cannot_keep_rollups_reads_the_raw_tables(fleet, monkeypatch, caplog):
    with open_store(fleet, read_only=True) as store:
        expected = analyse(raw_only(store), SPEC)
    with open_store(fleet, read_only=True) as store:
        refusals = []

        def refused(statement, params=None):
            refusals.append(statement)
            raise StoreError(f"{fleet}: statement failed: Not enough privileges")

        monkeypatch.setattr(store, "execute", refused)
        with caplog.at_level(logging.WARNING, "sloscope.rollups"):
            assert analyse(store, SPEC) == expected
            assert analyse(store, SPEC) == expected
        assert len([r for r in caplog.records if "Not enough privileges" in r.message]) == 1
        assert len(refusals) == 1  # not asked again for every query


def test_a_range_reaching_past_what_rollups_keep_reads_the_raw_tables(fleet):
    """Rollups are dropped a day's part at a time 8 days on: a range that begins before the last 7 days is read
    from the exporter's tables, and nothing is rolled up for it."""
    since, until = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=40), START + timedelta(hours=1)
    with open_store(fleet, read_only=True) as store:
        batches = headers(store, "sloscope_sli_rollup")
        ours = sli(store, since, until)
        assert headers(store, "sloscope_sli_rollup") == batches
        assert not ours.is_empty() and ours.equals(sli(raw_only(store), since, until))


def test_tables_a_collector_made_with_whole_seconds_are_rolled_up_alike(fleet, tmp_path):
    """The metric tables of a Collector of v0.160 or later keep times as DateTime: their points are fingerprinted
    and rolled up as those of DateTime64(9) tables."""
    create_tables(tmp_path / "ch")
    url = _loaded(f"chdb:///{tmp_path}/ch", Path(fleet.partition(":///")[2]).parent / "otlp")
    since, until = START + timedelta(minutes=4), START + timedelta(minutes=9)
    with open_store(url, read_only=True) as store, open_store(url, read_only=True) as raw:
        raw_only(raw)
        assert steps(store, since, until).equals(steps(raw, since, until))
        assert sli(store, since, until).equals(sli(raw, since, until))
        assert headers(store, "sloscope_step_rollup") and headers(store, "sloscope_sli_rollup")
