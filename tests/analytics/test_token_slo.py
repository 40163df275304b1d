"""A tier's token objectives (TTFT, TPOT, queue time) judged as its latency is, from vLLM-shaped spans: a healthy
fleet whose answers vary tenfold in length breaks none of them, while its request durations vary as much; a slower
first token or slower decoding is an incident of that kind, on both stores."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.slo import find_incidents
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import parse_spec
from tests.inference_fleet import FAULT_AT, MINUTES, SPEC, T0, Change, requests
from tests.otlp_builders import write_lines


def _requests(ttft_factor: float = 1.0, tpot_factor: float = 1.0) -> list[dict]:
    return requests(Change(ttft=ttft_factor, tpot=tpot_factor))


def _ingest(store, tmp_path, lines: list[dict]) -> None:
    Ingestor(store, TierResolver.from_spec(parse_spec(SPEC))).ingest_files([write_lines(tmp_path / "vllm.jsonl",
                                                                                        lines)])


def _incidents(store) -> list:
    return find_incidents(store, parse_spec(SPEC), T0, T0 + timedelta(minutes=MINUTES))


def test_answers_of_tenfold_lengths_break_no_token_objective(tmp_path):
    with Store(tmp_path / "healthy.duckdb") as store:
        _ingest(store, tmp_path, _requests())
        durations = [d for d, in store.rows("SELECT duration_ms FROM requests")]
        assert max(durations) > 10 * min(durations)  # what a duration objective would judge: the answers' lengths
        assert _incidents(store) == []


@pytest.mark.parametrize("factors, kind", [((4.0, 1.0), "ttft"), ((1.0, 2.5), "tpot")])
def test_a_slower_first_token_or_decoding_is_an_incident_of_its_kind(tmp_path, factors, kind):
    with Store(tmp_path / "fault.duckdb") as store:
        _ingest(store, tmp_path, _requests(*factors))
        incidents = _incidents(store)
    assert [(i.tier, i.service, i.sli["kind"]) for i in incidents] == [("chat", "vllm", kind)]
    incident = incidents[0]
    objective = {"ttft": 400, "tpot": 40}[kind]
    assert incident.sli["objective_ms"] == objective and incident.sli["observed_ms"] > objective
    assert incident.sli["percentile"] == 95 and incident.sli["observed_slow_ratio"] > 0.5
    assert abs(incident.start - (T0 + FAULT_AT)) <= timedelta(seconds=30)


def test_a_tier_without_token_objectives_is_judged_as_before(tmp_path):
    plain = SPEC.replace("    ttft: {percentile: 95, threshold_ms: 400}\n", "").replace(
        "    tpot: {percentile: 95, threshold_ms: 40}\n", "").replace("    queue: {percentile: 99, threshold_ms: 300}\n",
                                                                  "")
    with Store(tmp_path / "plain.duckdb") as store:
        _ingest(store, tmp_path, _requests(4.0))
        assert find_incidents(store, parse_spec(plain), T0, T0 + timedelta(minutes=MINUTES)) == []


def test_clickhouse_finds_the_same_token_incidents(tmp_path):
    pytest.importorskip("chdb")
    lines = _requests(4.0)
    with Store(tmp_path / "duck.duckdb") as duck:
        _ingest(duck, tmp_path, lines)
        want = [(i.tier, i.service, i.node, i.start, i.sli["kind"], i.sli["observed_slow_ratio"])
                for i in _incidents(duck)]
    with open_store(f"chdb:///{tmp_path}/ch") as house:
        _ingest(house, tmp_path, lines)
        got = [(i.tier, i.service, i.node, i.start, i.sli["kind"], i.sli["observed_slow_ratio"])
               for i in _incidents(house)]
    assert got == want and want
