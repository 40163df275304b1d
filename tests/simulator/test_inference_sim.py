"""`simulate --inference`: vLLM-like replicas whose token-level spans and engine metrics, judged with the spec written
beside them, keep their objectives when healthy at any output length and, under a fault, open an incident whose
first cause is the fault's. Long prompts are left to benchmarks/rca_accuracy.py --inference: on runs this short
they break the TPOT objective only now and then, and rank prefill_interference first on some seeds only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator import inference
from sloscope.simulator.cli import main as simulate_main
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope.slo_spec import load_spec
from tests.sim_reading import START, attrs, read_lines

FAULT_AT_S = 600  # a 10 min baseline before the fault, as the analysis takes


def _incidents(out, **config) -> tuple[dict, list[dict]]:
    truth = simulate(SimulationConfig(out=out, nodes=2, start=START, rate=inference.DEFAULT_RATE, inference=True,
                                      compress=False, **config))
    spec = load_spec(out / inference.SPEC_FILE)
    with Store(out / "db.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(sorted(out.glob("*.jsonl")))
        return truth.to_dict(), sorted(analyse(store, spec)["incidents"], key=lambda i: i["start"])


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    return out, *_incidents(out, duration_s=300, seed=3)


def _first_causes(tmp_path, kind: str, seed: int = 1) -> tuple[dict, list[str]]:
    truth, incidents = _incidents(tmp_path, duration_s=FAULT_AT_S + 180, seed=seed, fault=kind,
                                  fault_at_s=FAULT_AT_S, fault_duration_s=180)
    assert incidents, "the fault breaks a token objective"
    first = incidents[0]
    assert first["node"] == truth["fault"]["node"]
    return first, [c["cause"] for c in first["causes"]]


def test_spans_carry_token_timings_tiers_and_tenfold_output_lengths(healthy):
    out, truth, _ = healthy
    spans = [attrs(sp["attributes"]) for line in read_lines(out / "traces.jsonl") for rs in line["resourceSpans"]
             for ss in rs["scopeSpans"] for sp in ss["spans"]]
    assert spans and truth["config"]["inference"]
    outputs = np.array([s["gen_ai.usage.completion_tokens"] for s in spans])
    assert np.percentile(outputs, 95) > 10 * np.percentile(outputs, 5)
    assert {s["http.request.header.x-slo-tier"][0] for s in spans} == {"chat", "batch"}
    for s in spans:
        assert s["gen_ai.latency.time_to_first_token"] >= s["gen_ai.latency.time_in_queue"] > 0
        assert isinstance(s["gen_ai.latency.time_in_model_decode"], float)
    assert (out / inference.SPEC_FILE).read_text() == inference.SPEC == json.loads(
        (out / "ground_truth.json").read_text())["slo"]["spec"]


def test_a_healthy_fleet_keeps_its_token_objectives(healthy):
    _, _, incidents = healthy
    assert incidents == []


def test_a_load_surge_is_inference_queue(tmp_path):
    incident, causes = _first_causes(tmp_path, "load_surge")
    assert incident["sli"]["kind"] in ("ttft", "queue")
    assert causes[0] == "inference_queue"


def test_a_kv_cache_that_shrinks_is_kv_cache_pressure(tmp_path):
    _, causes = _first_causes(tmp_path, "kv_cache_pressure")
    assert causes[0] == "kv_cache_pressure"


def test_cli_validates_inference_faults(tmp_path, capsys):
    assert simulate_main(["--out", str(tmp_path / "bad"), "--inference", "--fault", "disk_io"]) == 2
    assert "unknown fault 'disk_io'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        simulate_main(["--out", str(tmp_path / "bad"), "--inference", "--fault", "bogus"])
