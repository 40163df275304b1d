"""The trace fast path (receiver/otlp_spans.c) reads an inference request's token timings (receiver/token_timings.py)
as the general decoder does: for every request it takes, the same six columns to the bit and the same
token_timings_invalid / token_timings_absent counts. It takes what vLLM and the GenAI conventions write, and
spans that count as absent or invalid; it may leave to the general path only what that alone converts (TGI's
duration texts past a double's exact digits, bytes, structures, a double where the model belongs)."""

import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sloscope.analytics.frames import SPAN_COLUMNS, SPAN_SCHEMA, TOKEN_COLUMNS, Frames
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.receiver import otlp_spans, token_timings
from sloscope.receiver.server import FAST_PATH, GENERAL_PATH, Decoders, fast_decode
from sloscope.receiver.token_timings import (ABSENT, DECODE_ATTRIBUTES, INVALID, MODEL_ATTRIBUTES,
                                             OUTPUT_TOKEN_ATTRIBUTES, PROMPT_TOKEN_ATTRIBUTES, QUEUE_ATTRIBUTES,
                                             TOKEN_ATTRIBUTES, TPOT_ATTRIBUTES, TTFT_ATTRIBUTES)
from sloscope.records import Batch

pytestmark = pytest.mark.skipif(not otlp_spans.available(), reason="the extension was not built")

TIERS = frozenset({"standard", "p99-latency-critical"})
SERVER, CLIENT, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL
T0 = 1_764_410_400_000_000_000
MS = 10**6
TIME_KEYS = {*TTFT_ATTRIBUTES, *QUEUE_ATTRIBUTES, *TPOT_ATTRIBUTES, *DECODE_ATTRIBUTES}
FLOAT_COLUMNS = [c for c in TOKEN_COLUMNS if c.endswith("_ms")]


def value(v) -> AnyValue:
    if isinstance(v, AnyValue):
        return v
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=v)


def request_of(*spans: dict, blocks: int = 1) -> ExportTraceServiceRequest:
    """Spans given by what differs from a plain 600 ms SERVER span: kind, duration_ns, attrs (a dict, or a list of
    pairs where a key repeats); `blocks`: the spans spread over that many resources."""
    request = ExportTraceServiceRequest()
    scopes = []
    for b in range(blocks):
        block = request.resource_spans.add()
        block.resource.attributes.add(key="service.name", value=AnyValue(string_value=f"vllm-{b}"))
        scopes.append(block.scope_spans.add())
    for i, fields in enumerate(spans):
        attrs = fields.get("attrs", {})
        pairs = attrs.items() if isinstance(attrs, dict) else attrs
        start = T0 + i * 1000
        scopes[i % blocks].spans.append(Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name="llm_request",
            kind=fields.get("kind", SERVER), start_time_unix_nano=start,
            end_time_unix_nano=start + fields.get("duration_ns", 600 * MS),
            attributes=[KeyValue(key=k, value=value(v)) for k, v in pairs]))
    return request


def _rows(batch, counts):
    resolver = TierResolver(TIERS, "standard")
    resolve_tiers(batch.spans, resolver)
    counts = {k: n for k, n in counts.items() if k not in (FAST_PATH, GENERAL_PATH)}
    return Frames.of(batch).spans, {**counts, **resolver.counts}


def fast_rows(body: bytes):
    """(spans frame, counts) by the fast path with its decoding counts (otlp_spans.spans_and_counts, as the
    receiver's fast_decode is to take them), or None where it declines."""
    decoded = otlp_spans.spans_and_counts(body)
    if decoded is None:
        return None
    spans, counts = decoded
    return _rows(Batch(spans=spans), {**counts, FAST_PATH: 1})


def general_rows(body: bytes):
    return _rows(*Decoders().decode("traces", body, False))


def _bits(frame, column: str) -> list:
    return [None if x is None else struct.pack("<d", x) for x in frame[column].to_list()]


def same_as_general(request: ExportTraceServiceRequest, taken: bool | None = True):
    """(spans frame, counts) of the general decoder, which the fast path must give too, bit for bit, when it takes
    the request; taken: whether it must (None: it may decline)."""
    body = request.SerializeToString()
    general = general_rows(body)
    fast = fast_rows(body)
    if taken is not None:
        assert (fast is not None) == taken, "the fast path declined" if taken else "the fast path took it"
    if fast is not None:
        assert fast[0].equals(general[0]), (fast[0].select(TOKEN_COLUMNS), general[0].select(TOKEN_COLUMNS))
        for column in FLOAT_COLUMNS:  # equals() holds -0.0 and 0.0 alike
            assert _bits(fast[0], column) == _bits(general[0], column), column
        assert fast[1] == general[1]
    # The receiver's fast_decode as it is: it gives no decoding counts, so the table alone must not hide any.
    server = fast_decode("traces", body, False)
    if server is not None:
        frame, counts = _rows(*server)
        assert frame.equals(general[0]) and counts == general[1]
    return general


def tokens(request: ExportTraceServiceRequest, taken: bool | None = True):
    """The token columns' rows (dicts) and the counts, the fast path agreeing."""
    frame, counts = same_as_general(request, taken)
    return frame.select(TOKEN_COLUMNS).to_dicts(), {k: n for k, n in counts.items() if k in (INVALID, ABSENT)}


VLLM = {"gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct", "gen_ai.usage.prompt_tokens": 412,
        "gen_ai.usage.completion_tokens": 128, "gen_ai.latency.time_to_first_token": 0.0431,
        "gen_ai.latency.time_in_queue": 0.0027, "gen_ai.latency.time_in_model_decode": 0.5123,
        "gen_ai.latency.e2e": 0.6, "gen_ai.request.max_tokens": 512, "gen_ai.request.id": "cmpl-8f2e"}


# --- what the engines write is taken -------------------------------------------------------------------------


def test_vllm_llm_request_spans_take_the_fast_path_with_their_token_timings():
    rows, counts = tokens(request_of({"attrs": VLLM}, {"attrs": {**VLLM, "gen_ai.usage.completion_tokens": 1}}))
    assert not counts
    assert rows[0] == {"model": "meta-llama/Llama-3.1-8B-Instruct", "ttft_ms": 0.0431 * 1e3,
                       "tpot_ms": 0.5123 * 1e3 / 127, "queue_ms": 0.0027 * 1e3, "prompt_tokens": 412,
                       "output_tokens": 128}
    assert rows[1]["tpot_ms"] is None and rows[1]["output_tokens"] == 1  # no token after the first


def test_genai_convention_names_and_the_first_given_name_wins():
    genai = {"gen_ai.request.model": "gpt-oss-20b", "gen_ai.usage.input_tokens": 30,
             "gen_ai.usage.output_tokens": 11, "gen_ai.latency.time_to_first_token": 0.25}
    rows, counts = tokens(request_of(
        {"attrs": genai, "duration_ns": 1250 * MS},
        # the older names written first: the newer ones are still read first, as token_timings reads them
        {"attrs": [("gen_ai.usage.prompt_tokens", 7), ("gen_ai.usage.input_tokens", 5),
                   ("gen_ai.request.model", "requested"), ("gen_ai.response.model", "served"),
                   ("queue_time", 0.5), ("gen_ai.latency.time_in_queue", 0.125),
                   ("gen_ai.usage.completion_tokens", 3), ("gen_ai.usage.output_tokens", 2),
                   ("gen_ai.latency.time_to_first_token", 0.1)]},
        # a key given twice: the last value is the one read, as in the general path's dict
        {"attrs": [("gen_ai.usage.input_tokens", 1), ("gen_ai.usage.input_tokens", 2),
                   ("gen_ai.latency.time_to_first_token", 0.1)]}))
    assert not counts
    assert rows[0] == {"model": "gpt-oss-20b", "ttft_ms": 250.0, "tpot_ms": (1250.0 - 250.0) / 10,
                       "queue_ms": None, "prompt_tokens": 30, "output_tokens": 11}
    assert rows[1] == {"model": "served", "ttft_ms": 0.1 * 1e3, "tpot_ms": (600.0 - 0.1 * 1e3) / 1,
                       "queue_ms": 125.0, "prompt_tokens": 5, "output_tokens": 2}
    assert rows[2]["prompt_tokens"] == 2


def test_integer_times_integral_double_counts_and_an_explicit_tpot():
    rows, counts = tokens(request_of(
        {"attrs": {"gen_ai.latency.time_to_first_token": 0, "gen_ai.latency.time_in_queue": 1,
                   "gen_ai.usage.prompt_tokens": 12.0, "gen_ai.usage.completion_tokens": 4.0,
                   "time_per_token": 0.02, "gen_ai.latency.time_in_model_decode": 1}, "duration_ns": 2000 * MS},
        {"attrs": {"gen_ai.latency.time_to_first_token": -0.0, "gen_ai.usage.prompt_tokens": -0.0,
                   "gen_ai.usage.output_tokens": float(token_timings.MAX_TOKENS),
                   "gen_ai.latency.time_in_model_decode": 0.3}},
        {"attrs": {"gen_ai.latency.time_to_first_token": 2**31 - 1, "gen_ai.usage.output_tokens": 3},
         "duration_ns": (2**31 - 1) * 10**9}))
    assert not counts
    assert rows[0] == {"model": None, "ttft_ms": 0.0, "tpot_ms": 0.02 * 1e3, "queue_ms": 1000.0,
                       "prompt_tokens": 12, "output_tokens": 4}
    assert math.copysign(1, rows[1]["ttft_ms"]) == -1 and rows[1]["prompt_tokens"] == 0  # -0.0 kept, as Python
    assert rows[1]["tpot_ms"] == 0.3 * 1e3 / (token_timings.MAX_TOKENS - 1)
    assert rows[2]["ttft_ms"] == (2**31 - 1) * 1e3 and rows[2]["tpot_ms"] == 0.0


def test_rest_of_the_request_per_token_is_never_negative():
    # TTFT past the duration by less than the slack: the rest of the request is none, not negative
    rows, counts = tokens(request_of({"attrs": {"gen_ai.latency.time_to_first_token": 0.6005,
                                                "gen_ai.usage.output_tokens": 5}}))
    assert not counts and rows[0]["ttft_ms"] == 0.6005 * 1e3 and rows[0]["tpot_ms"] == 0.0


def test_a_request_without_ttft_is_counted_absent_and_other_kinds_are_not():
    rows, counts = tokens(request_of(
        {"attrs": {"gen_ai.response.model": "m"}},
        {"attrs": {"gen_ai.usage.output_tokens": 3}},
        {"attrs": {"gen_ai.latency.time_in_queue": 0.1}},  # no model, no counts: not an inference request
        {"attrs": {"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 3}, "kind": CLIENT},
        {"attrs": {"gen_ai.request.model": "m"}, "kind": INTERNAL},
        {"attrs": {"gen_ai.request.model": "m"}, "kind": 0}))  # unspecified: kept as INTERNAL
    assert counts == {ABSENT: 2}
    assert [r["model"] for r in rows] == ["m", None, None, "m", "m", "m"]


# --- what token_timings leaves out is counted, or left to the general path --------------------------------


@pytest.mark.parametrize("bad", [
    {"gen_ai.latency.time_to_first_token": 0.7},  # past the 600 ms span and its slack
    {"gen_ai.latency.time_in_queue": 0.6011},
    {"time_per_token": 0.61},
    {"gen_ai.latency.time_in_model_decode": 0.602},
    {"gen_ai.latency.time_to_first_token": -0.001},
    {"gen_ai.latency.time_to_first_token": -1},
    {"gen_ai.latency.time_to_first_token": math.nan},
    {"gen_ai.latency.time_to_first_token": math.inf},
    {"gen_ai.latency.time_in_queue": -math.inf},
    {"gen_ai.latency.time_to_first_token": 1e306},  # finite seconds, infinite milliseconds
    {"gen_ai.latency.time_to_first_token": 2**63 - 1},
    {"gen_ai.latency.time_to_first_token": True},
    {"gen_ai.latency.time_to_first_token": AnyValue()},
    {"gen_ai.latency.time_to_first_token": "fast"},
    {"gen_ai.latency.time_to_first_token": "1.ms"},
    {"gen_ai.latency.time_to_first_token": "1ms "},
    {"gen_ai.latency.time_to_first_token": "１ms"},  # a digit, but not one the pattern's [0-9] takes
    {"gen_ai.latency.time_to_first_token": "0.7s"},
    {"gen_ai.latency.time_to_first_token": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="1")]))},
    {"gen_ai.usage.prompt_tokens": -1},
    {"gen_ai.usage.prompt_tokens": 2**31},
    {"gen_ai.usage.prompt_tokens": 2**63 - 1},
    {"gen_ai.usage.prompt_tokens": -2**63},
    {"gen_ai.usage.output_tokens": 2.5},
    {"gen_ai.usage.output_tokens": 2.0**31},
    {"gen_ai.usage.output_tokens": math.nan},
    {"gen_ai.usage.output_tokens": math.inf},
    {"gen_ai.usage.output_tokens": "12"},
    {"gen_ai.usage.output_tokens": False},
    {"gen_ai.response.model": ""},
    {"gen_ai.response.model": 7},
    {"gen_ai.response.model": AnyValue()},
    {"gen_ai.response.model": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="m")]))},
    # the first given name is the one read, even where it is bad and the next good
    [("gen_ai.usage.input_tokens", AnyValue()), ("gen_ai.usage.prompt_tokens", 5)],
    [("gen_ai.response.model", ""), ("gen_ai.request.model", "m")],
])
def test_what_token_timings_leaves_out_is_counted_invalid_on_the_fast_path(bad):
    good = {"gen_ai.response.model": "m", "gen_ai.latency.time_to_first_token": 0.05,
            "gen_ai.usage.output_tokens": 9, "gen_ai.latency.time_in_model_decode": 0.4}
    pairs = [*{**good, **dict(bad)}.items()] if isinstance(bad, dict) else [*good.items(), *bad]
    for kind in (SERVER, CLIENT):
        rows, counts = tokens(request_of({"attrs": {"gen_ai.response.model": "plain"}, "kind": CLIENT},
                                         {"attrs": pairs, "kind": kind}))
        assert counts == {INVALID: 1}


def test_an_invalid_tpot_gives_way_to_the_computed_one():
    rows, counts = tokens(request_of({"attrs": {"time_per_token": 5, "gen_ai.latency.time_to_first_token": 0.1,
                                                "gen_ai.usage.output_tokens": 6}}))
    assert counts == {INVALID: 1} and rows[0]["tpot_ms"] == (600.0 - 0.1 * 1e3) / 5


def test_tgi_duration_texts():
    texts = [("1.25ms", 1.25, 1.0), ("12µs", 12, 1e-3), ("3us", 3, 1e-3), ("0.5s", 0.5, 1e3), ("7ns", 7, 1e-6),
             ("007ms", 7, 1.0), ("0.1000000000000000000000000ms", 0.1, 1.0), ("1.234567891s", 1.234567891, 1e3),
             ("100ms", 100, 1.0), ("9007199254740992ns", 9007199254740992, 1e-6), ("0.0s", 0, 1e3)]
    rows, counts = tokens(request_of(*({"attrs": {"queue_time": text, "gen_ai.usage.output_tokens": 2},
                                        "duration_ns": 10**16} for text, _, _ in texts)))
    assert counts == {ABSENT: len(texts)}
    assert [r["queue_ms"] for r in rows] == [float(number) * unit for _, number, unit in texts]
    # more digits than a double converts exactly in one division: the general path's, or the same values
    for text in ("0.12345678901234567890123ms", "99999999999999999999ns", "9007199254740993ns",
                 "123456789.123456789ns", "1.5e3ms"):
        tokens(request_of({"attrs": {"gen_ai.latency.time_in_queue": text}}), taken=None)


@pytest.mark.parametrize("model", [
    "é" * 300, "日本語モデル" * 60, "🦙" * 260, "x" * 252 + "🦙" * 3, "x" * 253, "x" * 254, "a" * 200 + "ü" * 60,
    "m" * 1000])
def test_a_long_model_name_is_cut_to_253_characters_not_bytes(model):
    rows, counts = tokens(request_of({"attrs": {"gen_ai.response.model": model,
                                                "gen_ai.latency.time_to_first_token": 0.01}},
                                     {"attrs": {"gen_ai.request.model": model}, "kind": CLIENT}))
    assert not counts and rows[0]["model"] == rows[1]["model"] == model[:token_timings.MAX_MODEL_LENGTH]


@pytest.mark.parametrize("odd", [
    AnyValue(bytes_value=b"\x01\x02"),  # the general path's text: hex
    AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="a", value=AnyValue(int_value=1))])),
    AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(int_value=2)])),
])
def test_what_only_the_general_path_turns_into_text_is_left_to_it(odd):
    for key in sorted(TOKEN_ATTRIBUTES):
        tokens(request_of({"attrs": [("gen_ai.latency.time_to_first_token", 0.01), (key, odd)]}), taken=False)
    for model in (math.nan, 0.5):  # a double where the model belongs: "nan" is a model there
        tokens(request_of({"attrs": {"gen_ai.response.model": model}}), taken=False)


def test_mixed_requests_pad_the_spans_without_token_timings_with_nulls():
    plain = {"attrs": {"http.route": "/v1/completions"}}
    spans = [plain, plain, {"attrs": VLLM}, plain, {"attrs": {"gen_ai.response.model": "m"}}, plain, plain,
             {"attrs": VLLM, "kind": CLIENT}, plain]
    rows, counts = tokens(request_of(*spans, blocks=3))
    assert counts == {ABSENT: 1}
    assert [r["model"] is not None for r in rows].count(True) == 3
    # and a request of plain spans gives the columns all null, in the schema's types
    frame, counts = same_as_general(request_of(plain, plain))
    assert INVALID not in counts and ABSENT not in counts
    assert frame.select(TOKEN_COLUMNS).null_count().row(0) == (2,) * 6
    assert {c: frame.schema[c] for c in TOKEN_COLUMNS} == {c: SPAN_SCHEMA[c] for c in TOKEN_COLUMNS}
    assert tuple(frame.columns) == SPAN_COLUMNS


def test_many_spans_each_with_token_timings():
    spans = [{"attrs": {**VLLM, "gen_ai.usage.completion_tokens": i, "gen_ai.latency.time_to_first_token": i * 1e-4,
                        "gen_ai.response.model": f"model-{i % 7}" * (i + 1)}, "kind": (SERVER, CLIENT)[i % 5 == 0]}
             for i in range(3000)]
    rows, counts = tokens(request_of(*spans, blocks=2))
    assert len(rows) == 3000 and counts == {}


def test_the_extension_reads_all_the_token_attributes_with_token_timings_bounds():
    from sloscope.receiver import _otlp_spans
    assert (_otlp_spans.SLACK_MS, _otlp_spans.MAX_TOKENS, _otlp_spans.MAX_MODEL_LENGTH) == (
        token_timings.SLACK_MS, token_timings.MAX_TOKENS, token_timings.MAX_MODEL_LENGTH)
    token_keys = otlp_spans.SLOT_KEYS[len(otlp_spans.BASE_KEYS):]
    assert sorted(k.decode() for k in token_keys) == sorted(TOKEN_ATTRIBUTES)
    assert len(otlp_spans.SLOT_KEYS) <= _otlp_spans.MAX_SLOTS
    # each group in token_timings' order of reading: the first given name wins there as here
    groups = (TTFT_ATTRIBUTES, QUEUE_ATTRIBUTES, TPOT_ATTRIBUTES, DECODE_ATTRIBUTES, PROMPT_TOKEN_ATTRIBUTES,
              OUTPUT_TOKEN_ATTRIBUTES, MODEL_ATTRIBUTES)
    assert otlp_spans.TOKEN_GROUPS == groups
    assert tuple(k.decode() for k in token_keys) == tuple(k for group in groups for k in group)


def test_a_key_more_in_a_group_needs_no_change_in_c(monkeypatch):
    """What token_timings.py may add (TGI's, SGLang's names) is a key more in SLOT_KEYS and a size more."""
    groups = (*otlp_spans.TOKEN_GROUPS[:1], (*QUEUE_ATTRIBUTES, "sglang.queue_time"), *otlp_spans.TOKEN_GROUPS[2:])
    monkeypatch.setattr(otlp_spans, "SLOT_KEYS", tuple(k.encode() for k in (
        *otlp_spans.BASE_KEYS, *(key for group in groups for key in group))))
    monkeypatch.setattr(otlp_spans, "TOKEN_GROUP_SIZES", tuple(map(len, groups)))
    body = request_of({"attrs": {"sglang.queue_time": 0.25, "gen_ai.response.model": "m",
                                 "gen_ai.latency.time_to_first_token": 0.3}}).SerializeToString()
    frame, counts = fast_rows(body)
    assert frame["queue_ms"].to_list() == [250.0] and INVALID not in counts and ABSENT not in counts


# --- any values, any kinds -----------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.builds(lambda v: AnyValue(int_value=v), st.one_of(
        st.sampled_from([0, 1, 2, 3, 600, -1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -2**63]),
        st.integers(-2**63, 2**63 - 1))),
    st.builds(lambda v: AnyValue(double_value=v), st.one_of(
        st.sampled_from([0.0, -0.0, 0.0431, 0.6, 0.601, 0.6011, 1e-9, 2.0, 2.5, 128.0, 1e300, math.nan, math.inf,
                         -math.inf, float(2**31 - 1), 2.0**31]),
        st.floats())))
TEXTS = st.builds(lambda v: AnyValue(string_value=v), st.one_of(
    st.sampled_from(["", "m", "meta-llama/Llama-3.1-8B-Instruct", "1.25ms", "12µs", "3us", "0.5s", "7ns", "1.ms",
                     "ms", "1.2.3ms", "é" * 300, "007ms", "600ms", "601.5ms", "0.1000000000000000000000000ms",
                     "99999999999999999999ns", "12"]),
    st.from_regex(r"[0-9]{1,20}(\.[0-9]{1,20})?(ns|µs|us|ms|s)", fullmatch=True),
    st.text(max_size=10)))
OTHERS = st.one_of(st.builds(lambda v: AnyValue(bool_value=v), st.booleans()), st.just(AnyValue()),
                   st.builds(lambda v: AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v)])),
                             st.sampled_from(["m", "1ms"])))
token_attributes = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v),
                                      st.sampled_from(sorted(TOKEN_ATTRIBUTES) + ["gen_ai.system"]),
                                      st.one_of(NUMBERS, NUMBERS, TEXTS, OTHERS)), max_size=8)


@st.composite
def inference_requests(draw):
    request = ExportTraceServiceRequest()
    for b in range(draw(st.integers(1, 2))):
        block = request.resource_spans.add()
        block.resource.attributes.add(key="service.name", value=AnyValue(string_value="vllm"))
        scope = block.scope_spans.add()
        for i in range(draw(st.integers(0, 5))):
            start = T0 + i
            scope.spans.append(Span(
                trace_id=b"\x01" * 16, span_id=bytes([b, i + 1]) * 4, name="llm_request",
                kind=draw(st.sampled_from([SERVER, SERVER, CLIENT, INTERNAL, 0])), start_time_unix_nano=start,
                end_time_unix_nano=start + draw(st.sampled_from([0, MS, 600 * MS, 601 * MS, 10**10 + 7])),
                attributes=draw(token_attributes)))
    return request


def _may_decline(request: ExportTraceServiceRequest) -> bool:
    """Whether a token attribute has what the fast path leaves to the general path: a duration text (only those
    past exact digits are), a double where the model belongs."""
    for block in request.resource_spans:
        for span in block.scope_spans[0].spans:
            for kv in span.attributes:
                kind = kv.value.WhichOneof("value")
                if kv.key in TIME_KEYS and kind == "string_value" and \
                        token_timings._DEBUG_DURATION.fullmatch(kv.value.string_value):
                    return True
                if kv.key in MODEL_ATTRIBUTES and kind == "double_value":
                    return True
    return False


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inference_requests())
def test_any_token_attributes_read_alike(request):
    same_as_general(request, taken=None if _may_decline(request) else True)
