"""Locality computed in the store: fleet_movement.sql judges every node's series as series_scores judges them, on
DuckDB and on ClickHouse, so that an incident's analysis reads only its own node step by step."""

import math
import random
from datetime import datetime, timedelta

import pytest

from sloscope.analytics.attribution import Fleet, Window, fleet_movement, series_scores, signal_steps
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.stores import open_store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import load_spec
from tests.otlp_builders import gauge, metrics, write_lines
from tests.analytics.test_attribution import FAULT_AT, MINUTES, NODES, T0, S, _requests, _signals

GPU_MEMORY = "hw.gpu.memory.usage"  # read as growth (the leak signature) as well as a level


def _gpu_memory(node: str, rng: random.Random) -> dict:
    """Flat on most nodes; leaking on n2 from the fault; on n3 starting from zero (a growth from zero has no value),
    and so rising by a large relative step."""
    points = []
    for s in range(MINUTES * 60):
        level = 4e9 + rng.gauss(0, 1e6)
        if node == "n2" and s >= FAULT_AT - 30:
            level += (s - FAULT_AT + 30) * 2e7
        if node == "n3":
            level = 0.0 if s < FAULT_AT - 120 else 1e9 + s * 1e6
        points.append((T0 + s * S, level))
    return metrics([gauge(GPU_MEMORY, points, {"hw.id": f"GPU-{node}"})], node=node)


def _quartile_probe(node: str, observed: float) -> dict:
    """A series whose verdict turns on how its quartiles are taken: seven baseline steps before the first window's
    analysis start, with a median of 30 and, at the nearest rank, quartiles of 10 and 90 (a scale of 59; 1 and 50
    at the rank below, 1 and 90 or 10 and 50 with one of them there), then `observed`."""
    analysis_start = FAULT_AT - 60
    points = [(T0 + (analysis_start - 35 + 5 * k) * S, v) for k, v in enumerate([0, 1, 10, 30, 50, 90, 100])]
    points += [(T0 + s * S, observed) for s in range(analysis_start, MINUTES * 60, 5)]
    return metrics([gauge("DCGM_FI_DEV_GPU_TEMP", points, {"gpu": "0"})], node=node)


def _growth_probe() -> dict:
    """GPU memory on n4 that is flat, then from the first window's analysis start grows by 0.95 % a minute
    (exponentially: the same at every step), just short of the growth noise floor of 1 %; its growth read over
    one step more would pass it."""
    rate = math.log(1.0095) / 60
    start = FAULT_AT - 60
    points = [(T0 + s * S, 4e9 * math.exp(rate * max(0, s - start))) for s in range(MINUTES * 60)]
    return metrics([gauge(GPU_MEMORY, points, {"hw.id": "GPU-probe"})], node="n4")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    rng = random.Random(11)
    lines = []
    for k, node in enumerate(NODES):
        lines += [_signals(node, rng, fault=node == "n1"), _gpu_memory(node, rng),
                  _requests(node, rng, fault=node == "n1", base=k * 1_000_000)]
    return tmp, [write_lines(tmp / "fleet.jsonl", lines + [_quartile_probe("n3", 220.0), _quartile_probe("n4", 180.0), _growth_probe()])]


def _windows() -> list[Window]:
    fault = datetime(2025, 11, 29, 10, 0) + timedelta(seconds=FAULT_AT)
    return [Window.around(fault, fault + timedelta(minutes=2), 10.0),
            Window.around(fault - timedelta(minutes=1), fault + timedelta(minutes=3), 10.0, baseline=timedelta(minutes=6)),
            Window.around(fault + timedelta(seconds=35), fault + timedelta(minutes=1), 5.0)]


@pytest.mark.parametrize("engine", ["duckdb", "chdb"])
def test_the_store_judges_the_fleet_as_series_scores_do(files, engine):
    if engine == "chdb":
        pytest.importorskip("chdb")
    tmp, lines = files
    url = f"{engine}:///{tmp}/{engine}"
    spec = load_spec(None)
    with open_store(url) as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(lines)
    with open_store(url, read_only=True) as store:
        for window in _windows():
            steps = signal_steps(store, window, spec.taxonomy, evidence_only=True)
            expected = Fleet.of(series_scores(steps, window, known=spec.taxonomy))
            assert fleet_movement(store, window, spec.taxonomy) == expected, window
        # What the comparison covers: the fleet-wide temperature, n2's leak as growth, a growth from zero, growth
        # just short of its floor on n4, and quartiles at the nearest rank: 3.2 scales on n3 moved, 2.5 on n4 did not.
        fleet = fleet_movement(store, _windows()[0], spec.taxonomy)
        assert fleet.nodes == len(NODES)
        assert fleet.moved["hw.gpu.temperature"] == len(NODES)
        assert fleet.moved[GPU_MEMORY + ":growth_per_min"] >= 1
        assert fleet.moved["DCGM_FI_DEV_GPU_TEMP"] == 1


def test_an_incident_reads_only_its_own_node_step_by_step(files):
    tmp, lines = files
    spec = load_spec(None)
    with open_store(f"duckdb:///{tmp}/spied") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(lines)
        asked = []
        real_frame = store.frame

        def frame(query, params=None):
            result = real_frame(query, params)
            if query in (store.sql("signal_steps"), store.sql("step_rollup")):  # raw, or the fleet's rollup
                asked.append((params["node"], result["node_key"].n_unique()))
            return result

        store.frame = frame
        incidents = analyse(store, spec)["incidents"]
    assert {i["node"] for i in incidents} == {"n1"}
    assert asked and all(node == "n1" and nodes == 1 for node, nodes in asked)
    # n1's cause still outranks the fleet-wide temperature, which the other nodes show too.
    causes = {c["cause"]: c for c in incidents[0]["causes"]}
    assert "gpu_thermal" not in causes or causes["gpu_thermal"]["score_parts"]["locality"] == 0.0
