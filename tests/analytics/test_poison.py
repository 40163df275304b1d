"""Poison isolation: an item the store cannot keep is refused alone at decode, on every path (OTLP/JSON, protobuf,
gRPC, `sloscope ingest`), with a counted reason and a partial success; the rest of its request is kept, and no
input makes a store write fail."""

import copy
import json

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from sloscope.analytics.store import Store
from sloscope.receiver.otlp_common import TextCache
from sloscope.receiver.otlp_json import Decoder
from sloscope.commands.cli import main
from tests.otlp_builders import TRACE_ID, attr, exp_histogram, gauge, metrics, span, traces, write_lines
from tests.in_process import InProcessReceiver

T0 = 1_764_410_400_000_000_000
S = 10**9
HISTOGRAM = "sloscope.cpu.runqueue.delay"


@pytest.fixture
def server(tmp_path):
    s = InProcessReceiver(tmp_path / "p.duckdb")
    yield s
    s.close()


def _histogram_request(*mutations):
    """Two exponential-histogram points of one series (delta); each mutation edits the first point's JSON."""
    doc = metrics([exp_histogram(HISTOGRAM, T0 - S, [(T0, 3, 0.003, -14, [1, 2]), (T0 + S, 4, 0.004, -14, [2, 2])],
                                 temporality=1)])
    first = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["exponentialHistogram"]["dataPoints"][0]
    for mutate in mutations:
        mutate(first)
    return doc


def _post_json(server, path, doc):
    status, _, reply = server.post(path, json.dumps(doc).encode(), "application/json")
    return status, json.loads(reply) if status == 200 else reply


def test_the_reported_negative_zero_count_is_refused_alone_and_intake_goes_on(server):
    status, reply = _post_json(server, "/v1/metrics", _histogram_request(lambda p: p.update(zeroCount="-1")))
    assert status == 200
    assert reply["partialSuccess"]["rejectedDataPoints"] == "1"
    assert "points_invalid_buckets" in reply["partialSuccess"]["errorMessage"]
    later = _post_json(server, "/v1/metrics", metrics([gauge("hw.gpu.temperature", [(T0, 60.0)])]))
    assert later[0] == 200 and "partialSuccess" not in later[1]
    assert server.rows("SELECT count(*) FROM histograms") == [(1,)]
    assert server.rows("SELECT count(*) FROM samples") == [(1,)]
    assert server.writer.failed is None
    counters = server.store.counters()
    assert counters["points_invalid_buckets"] == 1 and counters["histograms_loaded"] == 1


POISON_POINTS = [
    (lambda p: p.update(count="-1"), "points_invalid_count"),
    (lambda p: p.update(count="5"), "points_invalid_count"),  # the buckets add up to 3
    (lambda p: p.update(count=str(2**63), zeroCount=str(2**63 - 3)), "points_invalid_count"),
    (lambda p: p.update(sum="NaN"), "points_invalid_sum"),
    (lambda p: p.update(sum="Infinity"), "points_invalid_sum"),
    (lambda p: p.update(min=2.0, max=1.0), "points_invalid_sum"),
    (lambda p: p["positive"].update(bucketCounts=["-1", "4"]), "points_invalid_buckets"),
    (lambda p: p.update(scale=21), "points_invalid_buckets"),
    (lambda p: p.update(timeUnixNano=str(2**63)), "points_invalid_time"),
    (lambda p: p.update(timeUnixNano="0"), "points_invalid_time"),
    (lambda p: p.update(startTimeUnixNano=str(T0 + 1)), "points_invalid_time"),
    (lambda p: p.update(attributes=[{"key": "deep", "value": {"kvlistValue": "x"}}]), "points_invalid_attribute"),
]


@pytest.mark.parametrize("mutate,reason", POISON_POINTS)
def test_a_poison_data_point_is_refused_alone_with_its_reason(server, mutate, reason):
    status, reply = _post_json(server, "/v1/metrics", _histogram_request(mutate))
    assert status == 200, reply
    assert reply["partialSuccess"]["rejectedDataPoints"] == "1"
    assert reason in reply["partialSuccess"]["errorMessage"]
    assert server.rows("SELECT count FROM histograms") == [(4,)]
    assert server.store.counters()[reason] == 1


def _span_request(*mutations):
    doc = traces([span(f"{i:032x}", f"{i:016x}", T0 + i * S, 100, tier="standard") for i in (1, 2)])
    for mutate in mutations:
        mutate(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0])
    return doc


POISON_SPANS = [
    (lambda s: s.update(traceId="abc"), "spans_invalid_id"),
    (lambda s: s.update(traceId=s["traceId"] + "\n"), "spans_invalid_id"),
    (lambda s: s.update(spanId=s["spanId"] + "\n"), "spans_invalid_id"),
    (lambda s: s.update(endTimeUnixNano=str(T0 - 1)), "spans_invalid_time"),
    (lambda s: s.update(startTimeUnixNano="0"), "spans_invalid_time"),
    (lambda s: s.update(endTimeUnixNano=str(2**63)), "spans_invalid_time"),
    (lambda s: s["attributes"].__setitem__(0, attr("http.response.status_code", 70000)), "spans_invalid_status_code"),
    (lambda s: s["attributes"].__setitem__(0, {"key": "http.response.status_code",
                                               "value": {"doubleValue": "Infinity"}}), "spans_invalid_status_code"),
    (lambda s: s["attributes"].append({"key": "k8s.pod.name", "value": {"boolValue": "yes"}}),
     "spans_invalid_attribute"),
    (lambda s: s.update(kind="server"), "spans_invalid"),
]


@pytest.mark.parametrize("mutate,reason", POISON_SPANS)
def test_a_poison_span_is_refused_alone_with_its_reason(server, mutate, reason):
    status, reply = _post_json(server, "/v1/traces", _span_request(mutate))
    assert status == 200, reply
    assert reply["partialSuccess"]["rejectedSpans"] == "1"
    assert reason in reply["partialSuccess"]["errorMessage"]
    assert server.rows(f"SELECT {TRACE_ID} FROM requests") == [(f"{2:032x}",)]
    assert server.store.counters()[reason] == 1


def test_a_request_with_nothing_good_is_a_400_and_costs_nothing(server):
    doc = _histogram_request(lambda p: p.update(sum="NaN"))
    points = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["exponentialHistogram"]["dataPoints"]
    points[1] = copy.deepcopy(points[0])
    status, reply = _post_json(server, "/v1/metrics", doc)
    assert status == 400 and b"points_invalid_sum" in reply
    assert server.receiver.counts["metrics_invalid"] == 1
    assert _post_json(server, "/v1/metrics", _histogram_request())[0] == 200
    assert server.rows("SELECT count(*) FROM histograms") == [(2,)]


def _proto_histograms(first_point_edit) -> metrics_service_pb2.ExportMetricsServiceRequest:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    block = request.resource_metrics.add()
    block.resource.attributes.add(key="host.name", value=AnyValue(string_value="gpu-node-1"))
    metric = block.scope_metrics.add().metrics.add(name=HISTOGRAM)
    metric.exponential_histogram.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    for i in range(2):
        point = metric.exponential_histogram.data_points.add(
            start_time_unix_nano=T0 - S + i * S, time_unix_nano=T0 + i * S, count=3, sum=0.003, scale=0, zero_count=0)
        point.positive.offset = -14
        point.positive.bucket_counts.extend([1, 2])
    first_point_edit(metric.exponential_histogram.data_points[0])
    return request


PROTO_POISON = [
    (lambda p: setattr(p, "count", 2**64 - 1), "points_invalid_count"),
    (lambda p: setattr(p, "zero_count", 1), "points_invalid_count"),
    (lambda p: setattr(p, "sum", float("nan")), "points_invalid_sum"),
    (lambda p: setattr(p, "max", float("-inf")), "points_invalid_sum"),
    (lambda p: p.positive.bucket_counts.__setitem__(0, 2**63), "points_invalid_buckets"),
    (lambda p: setattr(p, "scale", -11), "points_invalid_buckets"),
    (lambda p: setattr(p, "time_unix_nano", 2**64 - 1), "points_invalid_time"),
]


@pytest.mark.parametrize("edit,reason", PROTO_POISON)
def test_protobuf_over_http_refuses_the_same_points(server, edit, reason):
    status, _, reply = server.post("/v1/metrics", _proto_histograms(edit).SerializeToString())
    assert status == 200
    response = metrics_service_pb2.ExportMetricsServiceResponse.FromString(reply)
    assert response.partial_success.rejected_data_points == 1
    assert reason in response.partial_success.error_message
    assert server.rows("SELECT count(*) FROM histograms") == [(1,)]


def test_grpc_answers_a_partial_success(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        reply = metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(
            _proto_histograms(lambda p: setattr(p, "sum", float("inf"))), timeout=10)
    assert reply.partial_success.rejected_data_points == 1
    assert "points_invalid_sum" in reply.partial_success.error_message
    assert server.rows("SELECT count(*) FROM histograms") == [(1,)]


def test_a_cumulative_bucket_that_goes_down_is_a_reset_not_a_failed_write(server):
    """Each point is valid on its own; only against the stored state is a bucket seen to decrease, which the
    store takes as a reset (its delta would be negative) rather than failing the write."""
    for t, buckets in ((T0, [3, 0]), (T0 + S, [1, 4])):
        doc = metrics([exp_histogram(HISTOGRAM, T0 - S, [(t, sum(buckets), 0.001, -14, buckets)])])
        assert _post_json(server, "/v1/metrics", doc)[0] == 200
    assert server.rows("SELECT count, buckets[27:28] FROM histograms ORDER BY ts") == [(3, [3, 0]), (5, [1, 4])]
    assert server.writer.failed is None


def test_ingest_loads_the_rest_of_a_line_and_reports_what_it_refused(tmp_path, capsys):
    poisoned = _histogram_request(lambda p: p.update(zeroCount="-1"))
    path = write_lines(tmp_path / "m.jsonl", [poisoned, _span_request(lambda s: s.update(traceId="abc"))])
    assert main(["ingest", "--db", str(tmp_path / "i.duckdb"), str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:1: {HISTOGRAM}: negative bucket count; refused: 1 points_invalid_buckets" in err
    assert f"{path}:2: traceId: expected 32 hex digits" in err
    with Store(tmp_path / "i.duckdb", read_only=True) as store:
        assert store.rows("SELECT count(*) FROM histograms") == [(1,)]
        assert store.rows("SELECT count(*) FROM requests") == [(1,)]
        counters = store.counters()
    assert counters["points_invalid_buckets"] == 1 and counters["spans_invalid_id"] == 1
    assert "lines_rejected" not in counters


def test_the_attribute_cache_stays_within_its_bytes():
    decoder = Decoder(cache_bytes=20_000)
    points = [(T0 + i, float(i)) for i in range(2000)]
    doc = metrics([gauge("hw.gpu.temperature", [p], {"hw.id": f"GPU-{i:06d}"}) for i, p in enumerate(points)])
    batch = decoder.decode(doc)
    assert len(batch.points) == 2000 and batch.points.attributes[-1] == '{"hw.id":"GPU-001999"}'
    assert 0 < decoder.attribute_texts.bytes <= 20_000
    huge = [{"key": "k", "value": {"stringValue": "x" * (TextCache.MAX_ENTRY_BYTES + 1)}}]
    doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0]["attributes"] = huge
    expected = json.dumps({"k": huge[0]["value"]["stringValue"]}, separators=(",", ":"))
    assert decoder.decode(doc).points.attributes[0] == expected
    assert decoder.attribute_texts.get(json.dumps(huge, separators=(",", ":")).encode()) is None  # too big to keep
