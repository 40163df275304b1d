"""A tier whose token objective breaks over the last minute is hot, with that objective as its reason, as a tier
whose latency breaks is; long answers on a healthy engine heat nothing."""

from __future__ import annotations

from datetime import timedelta

from sloscope.analytics.store import Store
from sloscope.sampling.policy import evaluate_once
from sloscope.slo_spec import parse_spec
from tests.analytics.test_token_slo import _ingest, _requests
from tests.inference_fleet import MINUTES, SPEC, T0

NOW = (T0 + timedelta(minutes=MINUTES) - T0.replace(year=1970, month=1, day=1, hour=0)).total_seconds()


def _reasons(tmp_path, **factors) -> list[str]:
    with Store(tmp_path / "vllm.duckdb") as store:
        _ingest(store, tmp_path, _requests(**factors))
        doc = evaluate_once(store, parse_spec(SPEC), now=NOW)
    return doc["tiers"]["chat"]["hot_state"]["reasons"] if doc["tiers"]["chat"]["hot"] else []


def test_a_slow_first_token_heats_its_tier(tmp_path):
    assert {"ttft", "incident"} <= set(_reasons(tmp_path, ttft_factor=4.0))


def test_slow_decoding_heats_its_tier(tmp_path):
    assert "tpot" in _reasons(tmp_path, tpot_factor=2.5)


def test_a_healthy_engine_of_long_answers_is_not_hot(tmp_path):
    assert _reasons(tmp_path) == []
