"""An inference request's token timings, read from its span as vLLM, the GenAI conventions and TGI write them
(receiver/token_timings.py), through the general decoders: what is kept per request, what is left out and counted,
and that the request itself is always kept."""

from __future__ import annotations

import json

import pytest

from sloscope.receiver.otlp_json import Decoder
from sloscope.receiver.token_timings import ABSENT, INVALID, SLACK_MS, Tokens, token_timings
from tests.otlp_builders import span, traces

T0 = 1_780_000_000_000_000_000
VLLM = {"gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct", "gen_ai.request.id": "cmpl-1",
        "gen_ai.usage.prompt_tokens": 812, "gen_ai.usage.completion_tokens": 201,
        "gen_ai.latency.time_in_queue": 0.012, "gen_ai.latency.time_to_first_token": 0.25,
        "gen_ai.latency.time_in_model_prefill": 0.2, "gen_ai.latency.time_in_model_decode": 4.0,
        "gen_ai.latency.e2e": 4.3}


def _decode(spans: list) -> tuple[dict, dict]:
    decoder = Decoder()
    batch = decoder.decode(json.loads(json.dumps(traces(spans, service="vllm"))))
    columns = batch.spans
    rows = {sid: {name: getattr(columns, name)[k] for name in Tokens._fields}
            for k, sid in enumerate(columns.span_id)}
    return rows, dict(decoder.skipped)


def _span(n: int, duration_ms: float, attrs: dict, kind: int = 2) -> dict:
    return span("ab" * 16, f"{n:016x}", T0, duration_ms, kind=kind, extra=attrs)


def test_a_vllm_request_gives_its_timings_in_milliseconds():
    rows, counts = _decode([_span(1, 4300.0, VLLM)])
    assert rows[f"{1:016x}"] == {"model": "meta-llama/Llama-3.1-8B-Instruct", "ttft_ms": 250.0,
                                 "tpot_ms": 4000.0 / 200, "queue_ms": 12.0, "prompt_tokens": 812,
                                 "output_tokens": 201}
    assert INVALID not in counts and ABSENT not in counts


def test_the_genai_names_and_the_rest_of_the_request_give_tpot_without_a_decode_time():
    attrs = {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 11,
             "gen_ai.latency.time_to_first_token": 0.5}
    rows, _ = _decode([_span(1, 1500.0, attrs)])
    assert rows[f"{1:016x}"] == {"model": "m", "ttft_ms": 500.0, "tpot_ms": 100.0, "queue_ms": None,
                                 "prompt_tokens": 10, "output_tokens": 11}


def test_tgi_debug_durations_are_read():
    attrs = {"queue_time": "1.5ms", "time_per_token": "850µs", "gen_ai.latency.time_to_first_token": "2.25s"}
    rows, counts = _decode([_span(1, 3000.0, attrs)])
    row = rows[f"{1:016x}"]
    assert (row["queue_ms"], row["tpot_ms"], row["ttft_ms"]) == (1.5, pytest.approx(0.85), 2250.0)
    assert INVALID not in counts


@pytest.mark.parametrize("attrs", [
    {"gen_ai.latency.time_to_first_token": -0.1},
    {"gen_ai.latency.time_to_first_token": 9.0},  # past the 4.3 s span
    {"gen_ai.latency.time_to_first_token": "0.25"},  # a number as text: no unit says what it counts
    {"gen_ai.latency.time_to_first_token": True},
    {"gen_ai.usage.completion_tokens": -3},
    {"gen_ai.usage.completion_tokens": 2.5},
    {"gen_ai.response.model": ""},
])
def test_an_invalid_value_is_left_out_and_counted_and_the_request_kept(attrs):
    rows, counts = _decode([_span(1, 4300.0, {**VLLM, **attrs}), _span(2, 4300.0, VLLM)])
    assert counts[INVALID] == 1
    assert len(rows) == 2 and rows[f"{2:016x}"]["ttft_ms"] == 250.0
    left_out = [k for k, v in rows[f"{1:016x}"].items() if v is None]
    assert left_out and all(rows[f"{2:016x}"][k] is not None for k in left_out)


def test_not_finite_times_are_invalid():
    for value in (float("inf"), float("nan")):
        tokens, counter = token_timings({"gen_ai.latency.time_to_first_token": value}, 1000.0, True)
        assert tokens.ttft_ms is None and counter == INVALID


def test_clock_rounding_within_the_slack_is_kept():
    tokens, counter = token_timings({"gen_ai.latency.time_to_first_token": 1.0005}, 1000.0, True)
    assert tokens.ttft_ms == pytest.approx(1000.5) and SLACK_MS >= 0.5 and counter is None


def test_an_inference_request_without_ttft_is_counted_absent_but_not_a_client_call():
    attrs = {"gen_ai.request.model": "m", "gen_ai.usage.output_tokens": 5}
    _, counts = _decode([_span(1, 100.0, attrs), _span(2, 100.0, attrs, kind=3)])
    assert counts[ABSENT] == 1


def test_a_span_without_token_attributes_has_none_and_counts_nothing():
    rows, counts = _decode([_span(1, 100.0, {})])
    assert set(rows[f"{1:016x}"].values()) == {None} and INVALID not in counts and ABSENT not in counts


def test_a_long_model_name_is_cut_to_253_characters():
    rows, _ = _decode([_span(1, 4300.0, {**VLLM, "gen_ai.response.model": "é" * 300})])
    assert rows[f"{1:016x}"]["model"] == "é" * 253
