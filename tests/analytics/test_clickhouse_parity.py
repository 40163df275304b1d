"""DuckDB and ClickHouse (chDB), loaded from the same OTLP files of a simulated fleet with a known fault (as
benchmarks/rca_accuracy.py builds them), find the same incidents with the same ranked causes."""

import math

import pytest

pytest.importorskip("chdb")

from sloscope.analytics.exporter_tables import attribute_text  # noqa: E402
from sloscope.analytics.ingest import Ingestor  # noqa: E402
from sloscope.analytics.rca import analyse  # noqa: E402
from sloscope.analytics.stores import open_store  # noqa: E402
from sloscope.enrich.tiers import TierResolver  # noqa: E402
from sloscope.simulator.fleet import SimulationConfig, simulate  # noqa: E402
from sloscope.slo_spec import load_spec  # noqa: E402
from tests.collector_exporter import rows_of_files  # noqa: E402
from tests.exporter_versions import create_tables  # noqa: E402
from tests.store_parity import incident_summary  # noqa: E402

NODES, DURATION_S, RATE = 3, 780, 4.0  # the simulator wants 10 min of baseline before the fault


def _analysed(url: str, files, spec) -> dict:
    with open_store(url) as store:
        Ingestor(store, TierResolver.from_spec(spec), jobs=1).ingest_files(files)
    with open_store(url, read_only=True) as store:
        return analyse(store, spec)


@pytest.mark.parametrize("cause, seed, collector_made_tables", [
    ("storage_queue", 1, False), ("gpu_thermal", 2, False), (None, 3, False),
    # tables a Collector of v0.160 or later made first: metric times in whole seconds, other sort keys
    ("gpu_interconnect", 5, True), ("disk_io", 6, True),
])
def test_both_engines_find_the_same_incidents_and_causes(tmp_path, cause, seed, collector_made_tables):
    truth = simulate(SimulationConfig(out=tmp_path / "otlp", nodes=NODES, seed=seed, fault=cause, rate=RATE,
                                      duration_s=DURATION_S))
    files = sorted((tmp_path / "otlp").glob("*.jsonl*"))
    spec = load_spec(None)
    if collector_made_tables:
        create_tables(tmp_path / "ch")
    duck = _analysed(f"duckdb:///{tmp_path}/db.duckdb", files, spec)
    ch = _analysed(f"chdb:///{tmp_path}/ch", files, spec)
    assert incident_summary(ch) == incident_summary(duck)
    if cause is not None:  # the scenario is one where the answer is known, so agreeing means something
        on_node = [i for i in duck["incidents"] if i["node"] == truth.fault["node"]]
        assert on_node and on_node[0]["causes"][0]["cause"] == cause
    _assert_same_document(ch, duck, whole_seconds=collector_made_tables)


def _assert_same_document(ch: dict, duck: dict, whole_seconds: bool) -> None:
    """The whole document: SLIs, scores, evidence and diagnoses. Where the tables keep metric times in whole seconds,
    each series' first increase and its node's first signal are known to the second only, so there the causes'
    scores are held to within 0.05 and the rest is not compared."""
    if not whole_seconds:
        assert not _differences(ch, _as_exported(duck))
        return
    for ours, theirs in zip(duck["incidents"], ch["incidents"]):
        assert [c["score"] for c in theirs["causes"]] == pytest.approx([c["score"] for c in ours["causes"]], abs=0.05)


def _differences(a, b, path: str = "") -> list[str]:
    """Where two documents differ, numbers to one unit of their last printed digit (3 decimals, or 4 significant
    digits): the engines add floats in their own order, so a value that lies on a rounding boundary (0.00047495)
    may print 0.0004749 from one and 0.000475 from the other."""
    if isinstance(a, float) or isinstance(b, float):
        close = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(
            a, b, rel_tol=1e-3, abs_tol=1.5e-3)
        return [] if close else [f"{path}: {a!r} against {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def _as_exported(result: dict) -> dict:
    """The rca document with evidence attributes as the exporter stores them: every value as text (an integer
    attribute, such as spdk.reactor.lcore, is its decimal digits)."""
    for incident in result["incidents"]:
        for cause in incident["causes"] + incident["diagnosis"].get("candidates", []):
            for evidence in cause["evidence"]:
                evidence["attributes"] = {k: attribute_text(v) for k, v in evidence["attributes"].items()}
    return result


@pytest.mark.parametrize("cause, seed, collector_made_tables", [("storage_queue", 7, False), ("gpu_thermal", 8, True)])
def test_a_fleet_the_collector_wrote_gives_the_incidents_and_causes_of_its_files(tmp_path, cause, seed,
                                                                              collector_made_tables):
    """The same simulated fleet's files, loaded into DuckDB by `sloscope ingest` and written to ClickHouse as the
    clickhouseexporter writes them (tests/collector_exporter.py): raw attributes, sloscope's own histogram
    layout, no catalog applied; into sloscope's tables, and into tables a Collector of v0.160 made (whole-second
    metric times, none of sloscope's columns)."""
    simulate(SimulationConfig(out=tmp_path / "otlp", nodes=NODES, seed=seed, fault=cause, rate=RATE,
                              duration_s=DURATION_S))
    files = sorted((tmp_path / "otlp").glob("*.jsonl*"))
    spec = load_spec(None)
    duck = _analysed(f"duckdb:///{tmp_path}/db.duckdb", files, spec)
    if collector_made_tables:
        create_tables(tmp_path / "ch")
    else:
        open_store(f"chdb:///{tmp_path}/ch").close()
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as store:
        assert bool(store._sources) == collector_made_tables
        for table, data in rows_of_files(files).items():
            store.backend.insert(table, data)
        ch = analyse(store, spec)
    assert incident_summary(duck) and incident_summary(ch) == incident_summary(duck)
    assert duck["incidents"][0]["causes"][0]["cause"] == cause
    _assert_same_document(ch, duck, whole_seconds=collector_made_tables)
