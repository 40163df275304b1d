"""Hostile or broken OTLP/JSON never raises anything but DecodeError, and what decodes is well-formed."""

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.otlp_json import DecodeError, Decoder, decode_line
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces

T0 = 1_764_410_400_000_000_000
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
VALID = [
    traces([span("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", T0, 100, tier=["standard"])]),
    metrics([gauge("hw.gpu.temperature", [(T0, 60.0)], {"hw.id": "GPU-1"}),
             counter("sloscope.tcp.retransmits", T0 - 1, [(T0, 5)]),
             exp_histogram("sloscope.cpu.runqueue.delay", T0 - 1, [(T0, 3, 0.001, -14, [1, 2])])]),
]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _replace(doc, path, value):
    if not path:
        return value
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _decode(doc):
    try:
        batch = decode_line(Decoder(), json.dumps(doc).encode())
    except DecodeError:
        return
    for cols in (batch.spans, batch.points, batch.histograms):
        lengths = {len(v) for v in cols.as_dict().values()}
        assert len(lengths) <= 1  # every column the same length: no half-decoded row


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data(), json_values)
def test_replacing_any_part_of_a_valid_request_never_crashes(valid, data, junk):
    path = data.draw(st.sampled_from(list(_paths(valid))))
    _decode(_replace(valid, path, junk))


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_never_crashes(doc):
    _decode(doc)


def _nested(depth):
    return '{"arrayValue": {"values": [' * depth + '{"stringValue": "x"}' + "]}}" * depth


def _with_attribute(value_text):
    doc = json.dumps(metrics([gauge("hw.gpu.temperature", [(T0, 60.0)])]))
    return doc.replace('"attributes": [{"key": "host.name"', '"attributes": [{"key": "deep", "value": '
                       + value_text + '}, {"key": "host.name"', 1).encode()


def test_deeply_nested_attribute_values_are_rejected():
    for depth, reason in ((50, "nested deeper"), (100_000, "not valid JSON")):
        try:
            decode_line(Decoder(), _with_attribute(_nested(depth)))
        except DecodeError as exc:
            assert reason in str(exc)
        else:
            raise AssertionError(f"depth {depth} was accepted")
