"""Inference causes tell load from faults: a surge of arrivals that the engine's queue follows is
`inference_queue`, with the arrivals as evidence, and explains the GPU working harder; a GPU taken by a co-tenant
with the arrivals flat is the GPU's fault, never load; a full KV cache that preempts sequences is
`kv_cache_pressure`; long prompts prefilled beside decoding are `prefill_interference`."""

from __future__ import annotations

import pytest

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import parse_spec
from tests.inference_fleet import SPEC, Change, engine_metrics, requests
from tests.otlp_builders import write_lines

SURGE = Change(arrivals=3.0, queue_s=0.4, gpu_busy=0.4)
GPU_FAULT = Change(ttft=4.0, tpot=2.0, queue_s=0.3, gpu_busy=0.45)
KV_FULL = Change(tpot=2.5, kv_cache=0.43, preemptions_per_s=2.0)
LONG_PROMPTS = Change(prompt=8.0, tpot=2.5)


def _top(tmp_path, change: Change) -> tuple[dict, list[dict]]:
    spec = parse_spec(SPEC)
    with Store(tmp_path / "vllm.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(spec)).ingest_files(
            [write_lines(tmp_path / "vllm.jsonl", requests(change) + engine_metrics(change))])
        incidents = analyse(store, spec)["incidents"]
    assert incidents, "the change breaks a token objective"
    first = min(incidents, key=lambda i: i["start"])
    return first, first["causes"]


def _evidence(cause: dict) -> set[str]:
    return {ev["signal"] for ev in cause["evidence"]}


def test_a_surge_of_arrivals_is_load_and_explains_the_busier_gpu(tmp_path):
    incident, causes = _top(tmp_path, SURGE)
    assert causes[0]["cause"] == "inference_queue"
    assert "sloscope.inference.arrivals" in _evidence(causes[0])
    gpu = [c for c in causes if c["cause"] == "gpu_sm_contention"]
    assert not gpu or gpu[0]["score"] < causes[0]["score"] / 2


def test_a_gpu_taken_with_arrivals_flat_is_the_gpus_fault_not_load(tmp_path):
    _, causes = _top(tmp_path, GPU_FAULT)
    assert causes[0]["cause"] == "gpu_sm_contention"
    assert "inference_queue" not in {c["cause"] for c in causes}


@pytest.mark.parametrize("change, cause", [(KV_FULL, "kv_cache_pressure"), (LONG_PROMPTS, "prefill_interference")])
def test_the_engines_own_causes(tmp_path, change, cause):
    incident, causes = _top(tmp_path, change)
    assert incident["sli"]["kind"] == "tpot"
    assert causes[0]["cause"] == cause
    if cause == "kv_cache_pressure":  # the cache's level and the preemptions it forces
        assert {"vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"} <= _evidence(causes[0])


def test_clickhouse_tells_load_from_a_fault_alike(tmp_path):
    pytest.importorskip("chdb")
    from sloscope.analytics.stores import open_store
    spec = parse_spec(SPEC)
    for change, cause in ((SURGE, "inference_queue"), (GPU_FAULT, "gpu_sm_contention")):
        lines = write_lines(tmp_path / "vllm.jsonl", requests(change) + engine_metrics(change))
        with open_store(f"chdb:///{tmp_path}/ch-{cause}") as house:
            Ingestor(house, TierResolver.from_spec(spec)).ingest_files([lines])
            incidents = analyse(house, spec)["incidents"]
        first = min(incidents, key=lambda i: i["start"])
        assert first["causes"][0]["cause"] == cause
