"""Exactly once on ClickHouse: the exporter's tables keep whatever is inserted (a retried batch, a file loaded
again), so the queries read one row per span and per series and timestamp, and a fleet loaded twice has the
incidents of the fleet loaded once."""

import polars as pl
import pytest

pytest.importorskip("chdb")

from sloscope.analytics.attribution import signal_steps  # noqa: E402
from sloscope.analytics.ingest import Ingestor  # noqa: E402
from sloscope.analytics.rca import analyse  # noqa: E402
from sloscope.analytics.slo import sli_windows  # noqa: E402
from sloscope.analytics.stores import open_store  # noqa: E402
from sloscope.enrich.tiers import TierResolver  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from sloscope.slo_spec import load_spec  # noqa: E402
from tests.otlp_builders import span, traces, write_lines  # noqa: E402
from tests.store_parity import incident_summary  # noqa: E402
from tests.analytics.test_clickhouse_parity import _differences  # noqa: E402
from tests.analytics.test_clickhouse_store import EVERYTHING, STEPS_WINDOW, _metric_lines  # noqa: E402

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000
SERIES_AND_TIME = ["node", "metric", "attributes", "ts"]
RELATIONS = {"requests": ["span_id"], "samples": SERIES_AND_TIME, "histograms": SERIES_AND_TIME}


def _loaded(url: str, files, times: int, spec) -> None:
    with open_store(url) as store:
        for _ in range(times):
            Ingestor(store, TierResolver.from_spec(spec), jobs=1).ingest_files(files)


def _relation(store, name: str, key: list[str]) -> pl.DataFrame:
    return store.frame(f"SELECT * FROM ({store.sql(name)})", EVERYTHING).sort(key)


def _aggregates(store, spec) -> dict[str, pl.DataFrame]:
    """What the analysis reads without the relations: each window's SLI (which counts span keys) and the steps."""
    since, until = STEPS_WINDOW.baseline_start, STEPS_WINDOW.incident_end
    return {"sli_windows": sli_windows(store, spec, since, until)["standard"].sort("node", "window_start"),
            "signal_steps": signal_steps(store, STEPS_WINDOW).sort("node", "metric", "attributes", "step")}


def test_rows_stored_twice_are_read_once(tmp_path):
    spec = load_spec(None)
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S, 20 + i + (400 if i % 3 == 0 else 0), tier="standard",
                  status=500 if i % 5 == 0 else 200) for i in range(40)]
    files = [write_lines(tmp_path / "in.jsonl", _metric_lines() + [traces(spans, node="n1")])]
    read = []
    for times in (1, 2):  # one chDB database open at a time in a process
        _loaded(f"chdb:///{tmp_path}/ch{times}", files, times, spec)
        with open_store(f"chdb:///{tmp_path}/ch{times}", read_only=True) as store:
            read.append((store.scalar("SELECT count() FROM otel_traces"),
                         {**{name: _relation(store, name, key) for name, key in RELATIONS.items()},
                          **_aggregates(store, spec)}))
    (stored_once, once), (stored_twice, twice) = read
    assert stored_twice == 2 * stored_once == 80
    assert once["sli_windows"]["requests"].sum() == 40
    assert once["sli_windows"]["failures"].sum() == 8 and once["sli_windows"]["slow"].sum() == 14
    for name in once:
        assert once[name].height > 0
        assert twice[name].equals(once[name]), name


def test_a_fleet_loaded_twice_has_the_incidents_of_the_fleet_loaded_once(tmp_path):
    truth = simulate(SimulationConfig(out=tmp_path / "otlp", nodes=3, seed=1, fault="storage_queue", rate=4.0,
                                      duration_s=780))
    files = sorted((tmp_path / "otlp").glob("*.jsonl*"))
    spec = load_spec(None)
    results = []
    for times in (1, 2):
        _loaded(f"chdb:///{tmp_path}/ch{times}", files, times, spec)
        with open_store(f"chdb:///{tmp_path}/ch{times}", read_only=True) as store:
            results.append(analyse(store, spec))
    once, twice = results
    assert [i["node"] for i in once["incidents"]].count(truth.fault["node"]) >= 1
    # Numbers to their last printed digit: the engine adds the (deduplicated) floats of twice the rows in another
    # order, so a value on a rounding boundary may print one unit apart.
    assert incident_summary(twice) == incident_summary(once)
    assert not _differences(twice, once)
