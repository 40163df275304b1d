"""Hostile or broken OTLP (JSON, and protobuf values) never raises anything but DecodeError, what decodes is
well-formed, and no store write of what decodes ever fails."""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.analytics.frames import Frames

from sloscope.analytics.store import Store
from sloscope.receiver.otlp_json import DecodeError, Decoder, decode_line
from sloscope.receiver.server import Decoders
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.enrich.topology import GpuTopology
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces

T0 = 1_764_410_400_000_000_000
# Values at the edges of what the store keeps: negative, past 2**63 and 2**64, not finite, empty, a NUL.
EDGES = st.sampled_from([-1, "-1", 0, 2**63, str(2**63), str(2**64 - 1), 2**64, "NaN", "Infinity", "-Infinity",
                         1e308, -1e308, 0.5, "", "\x00", "--1", "\u00b2"])
json_values = st.recursive(
    EDGES | st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
VALID = [
    traces([span("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", T0, 100, tier=["standard"])]),
    # a CLIENT span: its parent and what it called are read too
    traces([{**span("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203332", T0, 50, kind=3,
                    extra={"peer.service": "cart", "upstream_cluster": "outbound|7070||cart.shop.svc.cluster.local",
                           "server.address": "cart.shop"}), "parentSpanId": "b7ad6b7169203331"}]),
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


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb") as s:
        yield s


def _stored(store, batch) -> None:
    """Write a decoded batch as serve and ingest do: a failure here is input that poisons the store."""
    resolve_tiers(batch.spans, TierResolver(frozenset({"standard"}), "standard"))
    frames = Frames.of(batch)
    frames.spans = GpuTopology().place(frames.spans)
    store.write(frames)


def _decode(doc, store=None):
    try:
        batch = decode_line(Decoder(), json.dumps(doc).encode())
    except DecodeError:
        return
    for cols in (batch.spans, batch.points, batch.histograms):
        lengths = {len(v) for v in cols.as_dict().values()}
        assert len(lengths) <= 1  # every column the same length: no half-decoded row
    if store is not None:
        _stored(store, batch)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data(), json_values)
def test_replacing_any_part_of_a_valid_request_never_crashes_nor_fails_the_store(store, valid, data, junk):
    path = data.draw(st.sampled_from(list(_paths(valid))))
    _decode(_replace(valid, path, junk), store)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_never_crashes(doc):
    _decode(doc)


uint64 = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63 - 1, 2**63])
doubles = st.floats() | st.sampled_from([float("nan"), float("inf"), -0.0])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=uint64, zero=uint64, buckets=st.lists(uint64, max_size=4), negative=st.lists(uint64, max_size=2),
       total=doubles, low=doubles, scale=st.integers(-2**31, 2**31 - 1) | st.integers(-12, 22),
       offset=st.integers(-2**31, 2**31 - 1) | st.integers(-50, 10), start=uint64, time=uint64,
       temporality=st.integers(0, 3), value=doubles)
def test_protobuf_values_never_fail_the_store(store, count, zero, buckets, negative, total, low, scale, offset, start,
                                              time, temporality, value):
    request = ExportMetricsServiceRequest()
    metric_list = request.resource_metrics.add().scope_metrics.add().metrics  # a resource naming no node
    histogram = metric_list.add(name="sloscope.cpu.runqueue.delay").exponential_histogram
    histogram.aggregation_temporality = temporality
    point = histogram.data_points.add(count=count, zero_count=zero, sum=total, min=low, scale=scale,
                                      start_time_unix_nano=start, time_unix_nano=time)
    point.positive.offset = offset
    point.positive.bucket_counts.extend(buckets)
    point.negative.bucket_counts.extend(negative)
    metric_list.add(name="hw.gpu.temperature").gauge.data_points.add(as_double=value, time_unix_nano=time)
    try:
        batch, _ = Decoders().decode("metrics", request.SerializeToString(), False)
    except DecodeError:
        return
    _stored(store, batch)


def _nested(depth):
    return '{"arrayValue": {"values": [' * depth + '{"stringValue": "x"}' + "]}}" * depth


def _with_attribute(value_text):
    doc = json.dumps(metrics([gauge("hw.gpu.temperature", [(T0, 60.0)])]))
    return doc.replace('"attributes": [{"key": "host.name"', '"attributes": [{"key": "deep", "value": '
                       + value_text + '}, {"key": "host.name"', 1).encode()


def test_deeply_nested_attribute_values_are_rejected():
    for depth, reason in ((50, "nested deeper"), (100_000, "nested deeper")):
        try:
            decode_line(Decoder(), _with_attribute(_nested(depth)))
        except DecodeError as exc:
            assert reason in str(exc)
        else:
            raise AssertionError(f"depth {depth} was accepted")
