"""The receiver's lean view of trace requests must read exactly what the real message types say."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collectors import otlp_lean, otlp_proto
from collectors.otlp_common import SPAN_ATTRIBUTES

KEYS = sorted(SPAN_ATTRIBUTES) + ["http.request.method", "url.full", "user_agent.original", "x"]

any_values = st.one_of(
    st.builds(lambda v: AnyValue(string_value=v), st.text(max_size=300)),
    st.builds(lambda v: AnyValue(int_value=v), st.integers(-2**63, 2**63 - 1)),
    st.builds(lambda v: AnyValue(bool_value=v), st.booleans()),
    st.builds(lambda v: AnyValue(double_value=v), st.floats(allow_nan=False)),
    st.builds(lambda v: AnyValue(bytes_value=v), st.binary(max_size=40)),
)
key_values = st.builds(lambda k, v: KeyValue(key=k, value=v), st.sampled_from(KEYS), any_values)


def reference_attributes(span) -> dict:
    """What the real message says, read the plain way."""
    return {kv.key: otlp_proto.any_value(kv.value) for kv in span.attributes if kv.key in SPAN_ATTRIBUTES}


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(key_values, max_size=8), min_size=1, max_size=6), st.sampled_from([0, 1, 2]))
def test_selected_attributes_match_the_real_message(attribute_sets, status):
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.add(key="host.name", value=AnyValue(string_value="gpu-node-1"))
    spans = block.scope_spans.add().spans
    for i, attrs in enumerate(attribute_sets):
        spans.add(trace_id=bytes(15) + bytes([i + 1]), span_id=bytes(7) + bytes([i + 1]), kind=Span.SPAN_KIND_SERVER,
                  start_time_unix_nano=10, end_time_unix_nano=20, attributes=attrs,
                  status=Status(code=status, message="boom" if status == 2 else ""))
    reader = otlp_lean.AttributeReader(SPAN_ATTRIBUTES, otlp_proto.any_value)
    lean = otlp_lean.LeanTraceRequest.FromString(request.SerializeToString())
    for _ in range(2):  # the second time from what the reader has seen
        for real, view in zip(request.resource_spans[0].scope_spans[0].spans, lean.resource_spans[0].scope_spans[0].spans):
            expected, got = reference_attributes(real), reader.selected(view.attributes)
            assert expected.keys() == got.keys() and all(same(expected[k], got[k]) for k in expected)
            assert otlp_lean.status_code(view.status) == real.status.code


def test_a_key_value_encoded_value_first_is_still_read():
    value = AnyValue(string_value="p99-latency-critical").SerializeToString()
    key = b"http.request.header.x-slo-tier"
    value_first = bytes([0x12, len(value)]) + value + bytes([0x0A, len(key)]) + key
    assert KeyValue.FromString(value_first).key == key.decode()  # a valid encoding, if unusual
    reader = otlp_lean.AttributeReader(SPAN_ATTRIBUTES, otlp_proto.any_value)
    assert reader.selected([value_first]) == {"http.request.header.x-slo-tier": "p99-latency-critical"}


def test_a_key_given_twice_counts_as_the_last_one():
    """Protobuf's rule for a repeated scalar field: the last wins, so the first key alone must not decide."""
    kept, dropped = b"http.route", b"url.full"
    value = AnyValue(string_value="/v1/completions").SerializeToString()
    twice = bytes([0x0A, len(dropped)]) + dropped + bytes([0x12, len(value)]) + value + bytes([0x0A, len(kept)]) + kept
    assert KeyValue.FromString(twice).key == "http.route"
    reader = otlp_lean.AttributeReader(SPAN_ATTRIBUTES, otlp_proto.any_value)
    assert reader.selected([twice]) == {"http.route": "/v1/completions"}


def test_the_reader_stays_bounded_under_unique_values():
    reader = otlp_lean.AttributeReader(SPAN_ATTRIBUTES, otlp_proto.any_value)
    for i in range(otlp_lean._CACHE_LIMIT + 100):
        item = KeyValue(key="http.route", value=AnyValue(string_value=f"/r/{i}")).SerializeToString()
        assert reader.selected([item]) == {"http.route": f"/r/{i}"}
    assert len(reader._seen) <= otlp_lean._CACHE_LIMIT
