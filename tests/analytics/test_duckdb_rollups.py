"""The DuckDB store's rollups (analytics/rollups.py): `sloscope ingest` makes them, a read-only analysis reads them
and answers exactly as one of the raw tables, whatever the range and after rows are added, changed in place or
deleted; a store without them reads the raw tables, and retention deletes them with the rows they came from."""

import logging
import random
from datetime import datetime, timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.retention import apply_retention
from sloscope.analytics.slo import sli_params
from sloscope.analytics.stores import open_store
from sloscope.commands.cli import main
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator.fleet import SimulationConfig, simulate
from tests.rollup_reads import SPEC, headers, raw_only, sli, steps

START = datetime(2026, 11, 2, 9, 0)  # the DuckDB store keeps rollups as long as their rows, however old
ROLLUP_READS = ("sli_rollup", "step_rollup")


@pytest.fixture(scope="module")
def otlp(tmp_path_factory):
    """A 3-node fleet, 13 minutes with a storage fault, as OTLP files."""
    out = tmp_path_factory.mktemp("duckdb-rollups") / "otlp"
    simulate(SimulationConfig(out=out, nodes=3, seed=4, fault="storage_queue", rate=4.0, duration_s=780,
                              start=START.isoformat() + "Z"))
    return sorted(out.glob("*.jsonl*"))


@pytest.fixture
def ingested(otlp, tmp_path):
    """The fleet loaded by `sloscope ingest`, which rolls up what it loads."""
    db = tmp_path / "fleet.duckdb"
    assert main(["ingest", "--db", str(db), *map(str, otlp)]) == 0
    return f"duckdb:///{db}"


def _spied(store) -> list[str]:
    """The rollup queries the store reads from now on, by name."""
    reads, real_frame = [], store.frame
    texts = {store.sql(name): name for name in ROLLUP_READS}

    def frame(query, params=None):
        reads.extend(name for text, name in texts.items() if text in query)
        return real_frame(query, params)

    store.frame = frame
    return reads


def _same(ours: pl.DataFrame, expected: pl.DataFrame) -> bool:
    """Equal, but for the last bits of a mean: DuckDB adds a step's points in the order its threads met them."""
    try:
        assert_frame_equal(ours, expected, check_exact=False, rel_tol=1e-12, abs_tol=0.0, categorical_as_str=True)
    except AssertionError:
        return False
    return True


def test_ingest_rolls_up_and_a_read_only_analysis_reads_the_rollups(ingested):
    """The fleet is young: an incident's window begins at its node's first signal, inside a step that holds other
    nodes' earlier points, so its steps are read raw; the SLI windows are rolled up."""
    with open_store(ingested, read_only=True) as store:
        assert headers(store, "sloscope_sli_rollup") >= 13 and headers(store, "sloscope_step_rollup") >= 13
        reads = _spied(store)
        rolled = analyse(store, SPEC)
        assert "sli_rollup" in reads
    with open_store(ingested, read_only=True) as store:
        assert analyse(raw_only(store), SPEC) == rolled
    assert rolled["incidents"] and rolled["incidents"][0]["causes"][0]["cause"] == "storage_queue"


def test_any_range_gives_the_raw_tables_rows(ingested):
    """Ranges that begin and end anywhere: those that cut a step or window holding rows outside them read the raw
    tables, the others the rollups, and both give the raw rows."""
    rng = random.Random(11)
    ranges = [(START + timedelta(minutes=4), START + timedelta(minutes=9))]
    for _ in range(8):
        since = START + timedelta(seconds=rng.choice([0, 60, 130, 300]) + rng.choice([0, 0.5, 5, 7.25]))
        ranges.append((since, since + timedelta(seconds=rng.choice([60, 200, 420]) + rng.choice([0, 3.5, 10]))))
    with open_store(ingested, read_only=True) as store, open_store(ingested, read_only=True) as raw:
        reads = _spied(store)
        raw_only(raw)
        for since, until in ranges:
            assert sli(store, since, until).equals(sli(raw, since, until)), (since, until)
            assert _same(steps(store, since, until), steps(raw, since, until)), (since, until)
            assert _same(steps(store, since, until, "gpu-node-1"), steps(raw, since, until, "gpu-node-1"))
    assert set(reads) == set(ROLLUP_READS)


def test_rows_added_changed_or_deleted_after_the_roll_up_are_counted(ingested):
    """What the writer does to stored rows: a late batch adds some, a late cumulative point recounts the value of
    the one after it, a span's node is corrected, retention deletes. Each changes the answer, which stays the raw
    tables' until rolled up again."""
    since, until = START + timedelta(minutes=2), START + timedelta(minutes=8)
    a, b = START + timedelta(minutes=4, seconds=10), START + timedelta(minutes=4, seconds=40)
    changes = [
        "INSERT INTO requests SELECT * REPLACE (span_id + 1 AS span_id, duration_ms * 50 AS duration_ms) "
        "FROM requests WHERE start_time >= $a AND start_time < $b",
        "UPDATE samples SET value = value * 10 + 1 WHERE ts >= $a AND ts < $b",
        "UPDATE requests SET node = 'gpu-node-2' WHERE node = 'gpu-node-1' AND start_time >= $a AND start_time < $b",
        "DELETE FROM histograms WHERE ts >= $a AND ts < $b",
    ]
    for change in changes:
        with open_store(ingested) as store:
            before = sli(store, since, until), steps(store, since, until)
            store.execute(change, {"a": a, "b": b})
        with open_store(ingested, read_only=True) as store, open_store(ingested, read_only=True) as raw:
            after = sli(store, since, until), steps(store, since, until)
            assert not (after[0].equals(before[0]) and _same(after[1], before[1])), change
            raw_only(raw)
            assert after[0].equals(sli(raw, since, until)) and _same(after[1], steps(raw, since, until)), change
    with open_store(ingested) as store:  # a writable store's fleet-wide query computes the changed chunks again
        batches = headers(store, "sloscope_step_rollup")
        again = sli(store, since, until), steps(store, since, until)
        # The changed minute's batch anew; the one it replaces is deleted by a fill a minute on.
        assert headers(store, "sloscope_step_rollup") == batches + 1
    with open_store(ingested, read_only=True) as store:
        reads = _spied(store)
        assert sli(store, since, until).equals(again[0]) and _same(steps(store, since, until), again[1])
        assert set(reads) == set(ROLLUP_READS)


def test_a_store_without_rollups_reads_the_raw_tables_and_a_writable_one_makes_them(otlp, tmp_path, caplog):
    url = f"duckdb:///{tmp_path}/plain.duckdb"
    with open_store(url) as store:  # what `sloscope serve`'s writer leaves: rows, no rollups
        Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files(otlp)
        assert not {"sloscope_sli_rollup", "sloscope_step_rollup"} & store.tables()
    with caplog.at_level(logging.WARNING, "sloscope.rollups"), open_store(url, read_only=True) as store:
        reads = _spied(store)
        plain = analyse(store, SPEC)
        assert not reads and not caplog.records
    with open_store(url) as store:
        assert analyse(store, SPEC) == plain
        assert headers(store, "sloscope_sli_rollup")  # (this young fleet's steps are read raw: see the first test)


def test_retention_deletes_the_rollups_of_what_it_deletes(ingested):
    cutoff = START + timedelta(minutes=5, seconds=30)
    with open_store(ingested) as store:
        apply_retention(store, timedelta(minutes=1), cutoff + timedelta(minutes=1))
        for table in ("sloscope_sli_rollup", "sloscope_step_rollup"):
            first = store.scalar(f"SELECT min(chunk_start) FROM {table}")
            assert first == START + timedelta(minutes=6), table  # the chunk the cutoff cuts goes too
    with open_store(ingested, read_only=True) as store, open_store(ingested, read_only=True) as raw:
        since, until = START, START + timedelta(minutes=13)
        assert sli(store, since, until).equals(sli(raw_only(raw), since, until))
        assert _same(steps(store, since, until), steps(raw, since, until))


def test_rows_not_rolled_up_yet_are_read_raw_without_fingerprinting_them(otlp, tmp_path):
    """As where `sloscope serve` wrote after an ingest: a read-only analysis cannot fill the newer chunks, so it
    reads their range from the raw tables and spends nothing on fingerprints; the older range still reads the
    rollups."""
    url = f"duckdb:///{tmp_path}/partly.duckdb"
    older = (START, START + timedelta(minutes=6))
    with open_store(url) as store:
        Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files(otlp)
        store.roll_up("sli_windows", sli_params(store, SPEC, *older))
    with open_store(url, read_only=True) as store, open_store(url, read_only=True) as raw:
        fingerprints, real_frame = [], store.frame

        def frame(query, params=None):
            fingerprints.extend([query] if query == store.sql("span_slices") else [])
            return real_frame(query, params)

        store.frame = frame
        reads = _spied(store)
        whole = (START, START + timedelta(minutes=13))
        assert sli(store, *whole).equals(sli(raw_only(raw), *whole))
        assert not reads and not fingerprints
        assert sli(store, *older).equals(sli(raw, *older))
        assert reads == ["sli_rollup"] and len(fingerprints) == 1
