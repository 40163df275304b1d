"""What a request holds is counted before it is decoded (receiver/request_items.py): by the C walk and by its
Python twin alike, in protobuf and in JSON; past a limit, the request is a 413 / RESOURCE_EXHAUSTED, counted, and
within them, what decoding holds is reserved against the in-flight budget."""

import json

import grpc
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from sloscope.receiver import otlp_spans, request_items
from sloscope.receiver.limits import Limits
from sloscope.receiver.request_items import Counts, TooManyItems, counted
from sloscope.receiver.wire import encoded_varint
from tests.conftest import need
from tests.in_process import InProcessReceiver
from tests.otlp_builders import exp_histogram, metrics, span, traces

T0 = 1_764_410_400_000_000_000
TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
UNBOUNDED = Limits(max_request_items=2**40, max_request_attributes=2**40, max_request_buckets=2**40)


def field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + encoded_varint(len(payload)) + payload


def kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


NESTED = AnyValue(kvlist_value=KeyValueList(values=[
    kv("a", AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="x")]))),
    kv("b", AnyValue(bool_value=True))]))


def spans_request() -> bytes:
    """1 resource, 1 scope, 2 spans, 1 event and 1 link: 6 items; 12 attributes: the resource's 2, the scope's 1,
    the span's 3 and the 4 values nested in one of them (2 key-values, 2 array values), the event's and link's."""
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.extend([kv("service.name", AnyValue(string_value="s")),
                                      kv("host.name", AnyValue(string_value="n"))])
    scope = block.scope_spans.add()
    scope.scope.attributes.append(kv("lib", AnyValue(string_value="v")))
    first = scope.spans.add(trace_id=bytes(range(16)), span_id=bytes(range(8)), start_time_unix_nano=T0,
                            end_time_unix_nano=T0 + 1)
    first.attributes.extend([kv("http.route", AnyValue(string_value="/")), kv("nested", NESTED),
                             kv("n", AnyValue(int_value=3))])
    first.events.add(name="e").attributes.append(kv("k", AnyValue(string_value="v")))
    first.links.add(trace_id=bytes(16), span_id=bytes(8)).attributes.append(kv("k", AnyValue(string_value="v")))
    scope.spans.add(trace_id=bytes(range(16)), span_id=bytes(8))
    return request.SerializeToString()


def metrics_request() -> bytes:
    """Every metric type: 1 resource, 1 scope, 5 metrics, 6 points and 1 exemplar are 14 items; 3 bucket counts
    and 2 bounds, 3 + 1 exponential buckets and 2 quantiles are 11 buckets."""
    doc = {"resourceMetrics": [{"resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "n"}}]},
                                "scopeMetrics": [{"metrics": [
        {"name": "g", "gauge": {"dataPoints": [
            {"timeUnixNano": str(T0), "asDouble": 1.0, "attributes": [{"key": "a", "value": {"intValue": "1"}}],
             "exemplars": [{"asDouble": 1.0, "filteredAttributes": [{"key": "f", "value": {"boolValue": True}}]}]},
            {"timeUnixNano": str(T0), "asInt": "2"}]}},
        {"name": "s", "sum": {"aggregationTemporality": 2, "dataPoints": [{"timeUnixNano": str(T0), "asInt": "1"}]}},
        {"name": "h", "histogram": {"aggregationTemporality": 2, "dataPoints": [
            {"timeUnixNano": str(T0), "count": "3", "sum": 1.0, "bucketCounts": ["1", "1", "1"],
             "explicitBounds": [1.0, 2.0]}]}},
        {"name": "e", "exponentialHistogram": {"aggregationTemporality": 2, "dataPoints": [
            {"timeUnixNano": str(T0), "count": "700", "positive": {"bucketCounts": ["1", "300", "0"]},
             "negative": {"offset": -2, "bucketCounts": ["400"]}}]}},
        {"name": "q", "summary": {"dataPoints": [
            {"timeUnixNano": str(T0), "quantileValues": [{"quantile": 0.5, "value": 1.0}, {"quantile": 1.0}]}]},
         "metadata": [{"key": "m", "value": {"stringValue": "x"}}]}]}]}]}
    return ParseDict(doc, ExportMetricsServiceRequest()).SerializeToString()


def logs_request() -> bytes:
    """1 resource, 1 scope, 2 records; a body of 4 nested values and 2 attributes."""
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    record = scope.log_records.add(time_unix_nano=T0)
    record.body.CopyFrom(NESTED)
    record.attributes.extend([kv("k", AnyValue(string_value="v")), kv("l", AnyValue(double_value=1.0))])
    scope.log_records.add(time_unix_nano=T0)
    return request.SerializeToString()


def unpacked_buckets() -> bytes:
    """An exponential histogram point whose bucket counts are each written alone (parsers take both forms)."""
    buckets = b"".join(b"\x10" + encoded_varint(n) for n in (1, 200, 3))
    point = b"\x19" + T0.to_bytes(8, "little") + field(8, buckets)
    return field(1, field(2, field(2, field(1, b"sloscope.tcp.rtt") + field(10, field(1, point)))))


def with_group(body: bytes) -> bytes:
    """An unknown group (the parser keeps it as unknown bytes) before the request's own fields."""
    return b"\x7b" + b"\x08\x01" + b"\x7c" + body  # field 15: start group, a varint, end group


REQUESTS = [("traces", spans_request(), Counts(6, 12, 0)),
            ("metrics", metrics_request(), Counts(14, 4, 11)),
            ("logs", logs_request(), Counts(4, 6, 0)),
            ("metrics", unpacked_buckets(), Counts(4, 0, 3)),
            ("traces", with_group(spans_request()), Counts(6, 12, 0))]


@pytest.fixture(params=["c", "python"])
def walk(request, monkeypatch):
    """Each test once with otlp_spans.c's count() and once with the walk in Python that stands in for it."""
    if request.param == "c":
        need(otlp_spans.available(), "the C extension is not built")
    if request.param == "python":
        monkeypatch.setattr(otlp_spans, "available", lambda: False)
    return request.param


@pytest.mark.parametrize("signal, body, expected", REQUESTS, ids=["spans", "metrics", "logs", "unpacked", "group"])
def test_a_protobuf_request_s_items_attributes_and_buckets_are_counted(walk, signal, body, expected):
    assert counted(signal, body, False, UNBOUNDED) == expected


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_request_cut_off_is_counted_up_to_where_it_stops_being_wire_format_by_both_walks(monkeypatch, cut):
    need(otlp_spans.available(), "the C extension is not built")
    body = spans_request()[:-cut]
    by_c = counted("traces", body, False, UNBOUNDED)
    monkeypatch.setattr(otlp_spans, "available", lambda: False)
    assert counted("traces", body, False, UNBOUNDED) == by_c


@pytest.mark.parametrize("limit, message", [
    (Limits(max_request_items=5), "more than 5 items (resources, scopes, spans, span events and links, metrics, "
                                  "data points, exemplars, log records) in one request (--max-request-items)"),
    (Limits(max_request_attributes=10), "more than 10 attributes (key-values, and values in arrays) in one request "
                                        "(--max-request-attributes)"),
])
def test_past_a_limit_the_request_is_refused_naming_the_limit_and_its_flag(walk, limit, message):
    with pytest.raises(TooManyItems, match=message.replace("(", r"\(").replace(")", r"\)")):
        counted("traces", spans_request(), False, limit)


def test_buckets_past_their_limit_refuse_the_request(walk):
    with pytest.raises(TooManyItems, match=r"more than 10 histogram buckets .*\(--max-request-buckets\)"):
        counted("metrics", metrics_request(), False, Limits(max_request_buckets=10))


def test_the_walk_stops_at_the_limit_rather_than_at_the_end_of_a_bomb(walk):
    bomb = field(1, field(2, b"\x12\x00" * 1_000_000))
    maxima = Limits(max_request_items=1000)
    with pytest.raises(TooManyItems):
        counted("traces", bomb, False, maxima)
    if walk == "c":
        assert otlp_spans.count_items(bomb, 0, (1000, 1000, 1000))[0] == 1001


def values_in(doc) -> int:
    """The JSON values of a document: each object, list and scalar."""
    inner = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else ()
    return 1 + sum(values_in(value) for value in inner)


def test_json_counts_attributes_and_buckets_exactly_and_items_as_values():
    doc = metrics([exp_histogram("sloscope.tcp.rtt", T0, [(T0, 6, 3.0, 0, [1, 2, 3])],
                                 attrs={"a": "b", "c": 1})])
    body = json.dumps(doc).encode()
    counts = counted("metrics", body, True, UNBOUNDED)
    assert counts.attributes == 3 and counts.buckets == 3  # host.name and the point's two; three bucket counts
    # items: at least the values that are neither attributes' (4 each) nor buckets, at most twice all values
    assert values_in(doc) - 4 * 3 - 3 <= counts.items <= 2 * values_in(doc)
    empty = counted("traces", b'{"resourceSpans": [{}, {}, {}]}', True, UNBOUNDED)
    assert empty.items >= 3


def test_json_brackets_inside_strings_do_not_refuse_a_request():
    text = "{[" * 200
    body = json.dumps(traces([span(TRACE, SPAN, T0, 10, extra={"note": text})])).encode()
    assert counted("traces", body, True, Limits(max_request_items=100)).items < 100


def test_json_objects_past_the_item_limit_are_refused():
    with pytest.raises(TooManyItems, match=r"--max-request-items"):
        counted("traces", b'{"resourceSpans": [' + b"{}," * 1000 + b"{}]}", True, Limits(max_request_items=1000))


def test_a_request_past_a_limit_is_413_over_http_and_resource_exhausted_over_grpc_and_counted(tmp_path):
    server = InProcessReceiver(tmp_path / "r.duckdb", Limits(max_request_items=5))
    try:
        status, _, reply = server.post("/v1/traces", spans_request())
        assert status == 413 and b"(--max-request-items)" in reply
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as refused:
                export(spans_request(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "(--max-request-items)" in refused.value.details()
        assert server.receiver.counts[TooManyItems.COUNTER] == 2
    finally:
        server.close()


def test_what_decoding_holds_is_reserved_beside_the_body_so_a_full_budget_refuses_it_for_now(tmp_path):
    body = json.dumps(traces([span(TRACE, SPAN, T0, 10)])).encode()
    decoding = request_items.decode_bytes(counted("traces", body, True, Limits()))
    limits = Limits(max_inflight_bytes=Limits().max_body_bytes + len(body) + decoding)
    server = InProcessReceiver(tmp_path / "r.duckdb", limits)
    try:
        server.receiver.inflight.reserve(Limits().max_body_bytes)  # what other requests hold
        assert server.post("/v1/traces", body, "application/json")[0] == 200
        server.receiver.inflight.reserve(1)
        status, headers, _ = server.post("/v1/traces", body, "application/json")
        assert status == 503 and headers["Retry-After"] == "1"
        assert server.receiver.counts["requests_refused_memory"] == 1
    finally:
        server.close()


def test_a_body_the_walk_cannot_read_through_is_taken_to_hold_what_its_bytes_could(walk):
    """A ten-byte varint whose last byte is past the 64 bits stops the C walk, and protobuf's parser reads it: the
    50,000 empty spans behind it must not pass for the three items counted before."""
    odd = b"\x90\x03" + b"\xff" * 9 + b"\x7f"  # an unknown field 50, a varint the parser takes
    with pytest.raises(TooManyItems, match=r"--max-request-items"):
        counted("traces", odd + field(1, field(2, b"\x12\x00" * 50_000)), False, Limits(max_request_items=1000))


def test_json_strings_reading_key_do_not_lower_the_count_of_items():
    spans = b",".join(b'{"name":"key"}' for _ in range(1990))
    body = b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + spans + b"]}]}]}"
    with pytest.raises(TooManyItems, match=r"--max-request-items"):
        counted("traces", body, True, Limits(max_request_items=1000, max_request_attributes=1000))
