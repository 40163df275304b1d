"""Token timings of an inference request, from its span's attributes as the serving engines write them
(docs/inference.md): time to first token (TTFT), time per output token (TPOT), time in the queue, prompt and
output tokens, and the model. Each is read from the first of its attribute names the span gives.

A time that is not a number of seconds, is negative or not finite, or (TTFT, queue time) exceeds the span's own
duration (TPOT and decode time too), and a token count that is not a non-negative integer, leaves that value out and counts the span as
`token_timings_invalid`; the span itself is kept. A request (SERVER span) that names a model or counts tokens but
gives no TTFT counts as `token_timings_absent`. The receiver's fast path (otlp_spans.c) reads the same values and
counts the same spans; it leaves to this path only a request with a token value it cannot convert exactly.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

# vLLM's llm_request spans (vllm/tracing.py) give seconds as doubles and the GenAI conventions' token counts, in
# their older names too; TGI's router records its times as Rust's Debug text of a Duration ("1.25ms").
TTFT_ATTRIBUTES = ("gen_ai.latency.time_to_first_token",)
QUEUE_ATTRIBUTES = ("gen_ai.latency.time_in_queue", "queue_time")
DECODE_ATTRIBUTES = ("gen_ai.latency.time_in_model_decode",)
TPOT_ATTRIBUTES = ("time_per_token",)
PROMPT_TOKEN_ATTRIBUTES = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_TOKEN_ATTRIBUTES = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
MODEL_ATTRIBUTES = ("gen_ai.response.model", "gen_ai.request.model")
TOKEN_ATTRIBUTES = frozenset({*TTFT_ATTRIBUTES, *QUEUE_ATTRIBUTES, *DECODE_ATTRIBUTES, *TPOT_ATTRIBUTES,
                              *PROMPT_TOKEN_ATTRIBUTES, *OUTPUT_TOKEN_ATTRIBUTES, *MODEL_ATTRIBUTES})
# A TTFT or queue time may pass the span's duration by clock rounding: the engine and the span time them apart.
SLACK_MS = 1.0
MAX_TOKENS = 2**31 - 1  # no context window comes near; what passes it is no token count
MAX_MODEL_LENGTH = 253
_DEBUG_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|µs|us|ms|s)")
_UNIT_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


class Tokens(NamedTuple):
    model: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    queue_ms: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None


NONE = Tokens()
INVALID, ABSENT = "token_timings_invalid", "token_timings_absent"


class _Invalid(Exception):
    pass


def token_timings(attrs: dict, duration_ms: float, request: bool) -> tuple[Tokens, str | None]:
    """The span's token timings, and the counter it counts into (INVALID, ABSENT or None). `attrs` holds the
    span's attributes (only TOKEN_ATTRIBUTES are read); `request`: it is a SERVER span."""
    invalid = False

    def read(keys: tuple[str, ...], reader):
        nonlocal invalid
        for key in keys:
            if key in attrs:
                try:
                    return reader(attrs[key])
                except _Invalid:
                    invalid = True
                    return None
        return None

    times = [_within(read(keys, _ms), duration_ms)
             for keys in (TTFT_ATTRIBUTES, QUEUE_ATTRIBUTES, TPOT_ATTRIBUTES, DECODE_ATTRIBUTES)]
    invalid |= any(t is _OVER for t in times)
    ttft, queue, tpot, decode = (None if t is _OVER else t for t in times)
    prompt = read(PROMPT_TOKEN_ATTRIBUTES, _count)
    output = read(OUTPUT_TOKEN_ATTRIBUTES, _count)
    if tpot is None and output is not None and output >= 2:
        # Per output token after the first, as the engines define it: the decode time, or the rest of the request
        if decode is not None:
            tpot = decode / (output - 1)
        elif ttft is not None:
            tpot = max(duration_ms - ttft, 0.0) / (output - 1)
    model = read(MODEL_ATTRIBUTES, _model)
    tokens = Tokens(model, ttft, tpot, queue, prompt, output)
    if invalid:
        return tokens, INVALID
    if request and ttft is None and (model is not None or prompt is not None or output is not None):
        return tokens, ABSENT
    return tokens, None


_OVER = object()  # a time past the span's duration


def _within(value: float | None, duration_ms: float):
    return _OVER if value is not None and value > duration_ms + SLACK_MS else value


def _ms(value) -> float:
    """Seconds as a number, or a Debug duration's text, in milliseconds."""
    if isinstance(value, str):
        match = _DEBUG_DURATION.fullmatch(value)
        if match is None:
            raise _Invalid
        ms = float(match[1]) * _UNIT_MS[match[2]]
    elif type(value) in (int, float):
        ms = value * 1e3
    else:
        raise _Invalid
    if not (math.isfinite(ms) and ms >= 0.0):
        raise _Invalid
    return ms


def _count(value) -> int:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not 0 <= value <= MAX_TOKENS:
        raise _Invalid
    return value


def _model(value) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid
    return value[:MAX_MODEL_LENGTH]
