"""An attribute value nested past the parser's own limit (upb's 100 messages, orjson's 1024 levels) costs the item
holding it, not the request: on every path (OTLP/HTTP protobuf and JSON, OTLP/gRPC, a decode worker) the item is
refused alone, counted as any value nested too deep, and the rest is stored; where the attribute is not read, the
item is kept. A body that is also malformed keeps its parser's error."""

import base64
import json
import re

import grpc
import orjson
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest, ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from sloscope.receiver.nesting import is_depth_error, pruned_json, pruned_protobuf
from sloscope.receiver.wire import encoded_varint
from tests.in_process import InProcessReceiver
from tests.otlp_builders import gauge, metrics, span, traces

T0 = 1_764_410_400_000_000_000
S = 10**9
PROTOBUF, JSON = "application/x-protobuf", "application/json"
PATHS = ["protobuf", "json", "grpc", "protobuf by a decode worker", "json by a decode worker"]
# AnyValue levels: 4000 protobuf messages and 6000 JSON arrays and objects, far past upb's and orjson's limits.
DEEP_LEVELS = 2000
DEEP_MARK = "__deep value__"


# --- building requests whose deep part no protobuf runtime would serialize --------------------------------------


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field in wire format."""
    return encoded_varint(number << 3 | 2) + encoded_varint(len(payload)) + payload


def _group(number: int, content: bytes = b"") -> bytes:
    return encoded_varint(number << 3 | 3) + content + encoded_varint(number << 3 | 4)


def _deep_any_value(levels: int) -> bytes:
    """AnyValue{array_value (5): ArrayValue{values (1): ...}} `levels` deep around a string_value (1), built from
    the inside out by its headers alone, as nesting the bytes themselves would copy them once per level."""
    leaf = _field(1, b"x")
    size, headers = len(leaf), []
    for _ in range(levels):
        array = encoded_varint(1 << 3 | 2) + encoded_varint(size)
        size += len(array)
        value = encoded_varint(5 << 3 | 2) + encoded_varint(size)
        size += len(value)
        headers.append(value + array)
    return b"".join(reversed(headers)) + leaf


def _deep_json_value(levels: int) -> str:
    return '{"arrayValue": {"values": [' * levels + '{"stringValue": "x"}' + "]}}" * levels


def _deep_key_value(key: str) -> bytes:
    """A KeyValue (key 1, value 2) whose value nests DEEP_LEVELS arrays."""
    return _field(1, key.encode()) + _field(2, _deep_any_value(DEEP_LEVELS))


# Where the item with the deep attribute is (the last one at each step) and its attributes field's number.
ITEM_PATH = {"traces": ("resourceSpans", "scopeSpans", "spans"),
             "metrics": ("resourceMetrics", "scopeMetrics", "metrics", "gauge", "dataPoints")}
ATTRIBUTES_FIELD = {"traces": 9, "metrics": 7}  # Span.attributes, NumberDataPoint.attributes
REQUESTS = {"traces": ExportTraceServiceRequest, "metrics": ExportMetricsServiceRequest}
RESPONSES = {"traces": ExportTraceServiceResponse, "metrics": ExportMetricsServiceResponse}
REJECTED = {"traces": ("rejected_spans", "rejectedSpans"), "metrics": ("rejected_data_points", "rejectedDataPoints")}


def _snake(name: str) -> str:
    return re.sub("([A-Z])", r"_\1", name).lower()


def _with_raw_fields(message, path: tuple, raw: bytes) -> bytes:
    """The message's bytes with `raw` (fields in wire format) added to the message at the end of `path`, the last
    item of each repeated field on the way. Field order is free in wire format, and repeated items keep theirs."""
    if not path:
        return message.SerializeToString() + raw
    name = _snake(path[0])
    field = message.DESCRIPTOR.fields_by_name[name]
    items = list(getattr(message, name)) if field.is_repeated else [getattr(message, name)]
    others = type(message)()
    others.CopyFrom(message)
    others.ClearField(name)
    return (others.SerializeToString() + b"".join(_field(field.number, item.SerializeToString()) for item in items[:-1])
            + _field(field.number, _with_raw_fields(items[-1], path[1:], raw)))


def _last_item(doc: dict, signal: str) -> dict:
    item = doc
    for name in ITEM_PATH[signal]:
        item = item[name][-1] if isinstance(item[name], list) else item[name]
    return item


def _body(signal: str, doc: dict, deep_key: str, encoding: str) -> bytes:
    """The request of `doc` with its last item given the attribute `deep_key`, nested DEEP_LEVELS deep."""
    if encoding == JSON:
        deep_doc = json.loads(json.dumps(doc))
        _last_item(deep_doc, signal).setdefault("attributes", []).append({"key": deep_key, "value": DEEP_MARK})
        return json.dumps(deep_doc).replace(json.dumps(DEEP_MARK), _deep_json_value(DEEP_LEVELS)).encode()
    return _with_raw_fields(_message(signal, doc), ITEM_PATH[signal],
                            _field(ATTRIBUTES_FIELD[signal], _deep_key_value(deep_key)))


def _message(signal: str, doc: dict):
    """The request as protobuf, its hex ids made bytes (ParseDict reads ids as base64, as canonical JSON has them)."""
    doc = json.loads(json.dumps(doc))
    for block in doc.get("resourceSpans", ()):
        for scope in block["scopeSpans"]:
            for item in scope["spans"]:
                for key in ("traceId", "spanId"):
                    item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
    return ParseDict(doc, REQUESTS[signal]())


def _spans_doc() -> dict:
    """Three good SERVER spans and a fourth, whose http.route the deep attribute will be."""
    spans = [span(f"{i:032x}", f"{i:016x}", T0 + i * S, 100) for i in range(1, 5)]
    spans[-1]["attributes"] = [a for a in spans[-1]["attributes"] if a["key"] != "http.route"]
    return traces(spans)


def _points_doc() -> dict:
    return metrics([gauge("hw.gpu.temperature", [(T0, 61.0), (T0 + S, 62.0), (T0 + 2 * S, 63.0)],
                          {"hw.id": "GPU-1"})])


# --- sending them -----------------------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path, one_worker_pool, request):
    through_worker = "worker" in request.node.callspec.params["path"]
    s = InProcessReceiver(tmp_path / "r.duckdb", decode_pool=one_worker_pool if through_worker else None)
    yield s
    s.close()


def _encoding(path: str) -> str:
    return JSON if path.startswith("json") else PROTOBUF


def _export(server, path: str, signal: str, body: bytes) -> tuple[int, str]:
    """(rejected count, error message) of the partial success answering the body."""
    if path == "grpc":
        service = {"traces": "trace.v1.TraceService", "metrics": "metrics.v1.MetricsService"}[signal]
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            export = channel.unary_unary(f"/opentelemetry.proto.collector.{service}/Export",
                                         response_deserializer=RESPONSES[signal].FromString)
            partial = export(body, timeout=30).partial_success
        return getattr(partial, REJECTED[signal][0]), partial.error_message
    status, _, reply = server.post(f"/v1/{signal}", body, _encoding(path))
    assert status == 200, reply
    if _encoding(path) == JSON:
        partial = json.loads(reply).get("partialSuccess", {})
        return int(partial.get(REJECTED[signal][1], 0)), partial.get("errorMessage", "")
    partial = RESPONSES[signal].FromString(reply).partial_success
    return getattr(partial, REJECTED[signal][0]), partial.error_message


def _refused_as_too_deep(server, signal: str, rejected: int, message: str, reason: str) -> None:
    assert rejected == 1
    assert f"1 {reason} (an attribute value of the wrong type or nested too deep)" in message
    assert server.receiver.counts[f"{signal}_rejected_{reason}"] == 1


# --- on every path ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_span_with_a_read_attribute_nested_past_the_parser_is_refused_alone(server, path):
    body = _body("traces", _spans_doc(), "http.route", _encoding(path))
    rejected, message = _export(server, path, "traces", body)
    _refused_as_too_deep(server, "traces", rejected, message, "spans_invalid_attribute")
    assert server.rows("SELECT route FROM requests") == [("/v1/chat/completions",)] * 3
    assert server.store.counters()["spans_invalid_attribute"] == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_point_with_an_attribute_nested_past_the_parser_is_refused_alone(server, path):
    body = _body("metrics", _points_doc(), "gpu.detail", _encoding(path))
    rejected, message = _export(server, path, "metrics", body)
    _refused_as_too_deep(server, "metrics", rejected, message, "points_invalid_attribute")
    assert server.rows("SELECT value FROM samples ORDER BY value") == [(61.0,), (62.0,)]
    assert server.store.counters()["points_invalid_attribute"] == 1


@pytest.mark.parametrize("path", PATHS)
def test_an_unread_attribute_nested_past_the_parser_is_ignored(server, path):
    body = _body("traces", _spans_doc(), "app.payload", _encoding(path))
    assert _export(server, path, "traces", body) == (0, "")
    assert server.spans() == 4


def _malformed_protobuf(body: bytes) -> bytes:
    return body + b"\x0a\x05ab"  # a last field whose length runs past the end


def _malformed_json(body: bytes) -> bytes:
    return body[:-1]  # the request object never closed


@pytest.mark.parametrize("path", PATHS)
def test_a_deep_body_that_is_also_malformed_keeps_the_parsers_error(server, path):
    body = _body("traces", _spans_doc(), "http.route", _encoding(path))
    assert _export(server, path, "traces", body)[0] == 1  # as sent, the deep span alone is refused
    broken = _malformed_json(body) if _encoding(path) == JSON else _malformed_protobuf(body)
    expected = "not valid JSON: depth limit exceeded" if _encoding(path) == JSON else \
        "not a valid ExportTraceServiceRequest: Error parsing message with type"
    if path == "grpc":
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                         response_deserializer=ExportTraceServiceResponse.FromString)
            with pytest.raises(grpc.RpcError) as refused:
                export(broken, timeout=30)
        code, text = refused.value.code(), refused.value.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    else:
        status, _, reply = server.post("/v1/traces", broken, _encoding(path))
        assert status == 400
        text = json.loads(reply)["message"] if _encoding(path) == JSON else reply.decode(errors="replace")
    assert expected in text
    assert server.receiver.counts["traces_invalid"] == 1


# --- the pruning itself -----------------------------------------------------------------------------------------


# Three levels of messages around a varint field, which pruning at level 2 empties the third of.
THREE_DEEP, CUT_AT_TWO = _field(3, _field(4, _field(5, b"\x08\x01"))), _field(3, _field(4, _field(5, b"")))


def test_protobuf_pruning_empties_what_lies_past_the_level_and_keeps_the_rest():
    kept = _field(1, _field(2, b"\x08\x01"))  # a message two levels deep: within the level
    assert pruned_protobuf(kept + THREE_DEEP, levels=2) == kept + CUT_AT_TWO
    assert pruned_protobuf(kept + CUT_AT_TWO, levels=2) is None  # nothing to cut


def test_protobuf_pruning_leaves_a_payload_that_is_not_wire_format_as_its_bytes():
    """A string or bytes value that holds wire format, and nests deep, up to a byte that is not."""
    not_a_message = _field(1, _field(1, _field(1, _field(1, b"")))) + b"\xff"
    assert pruned_protobuf(_field(2, not_a_message) + THREE_DEEP, levels=2) == _field(2, not_a_message) + CUT_AT_TWO


def test_protobuf_pruning_drops_groups_nested_past_the_level_and_keeps_shallower_ones():
    shallow = _group(7, b"\x08\x01" + _field(1, _field(1, _field(1, _field(1, b"")))))  # its fields stay unread
    too_deep = _group(8, _group(8, _group(8)))
    assert pruned_protobuf(shallow + too_deep + THREE_DEEP, levels=2) == shallow + CUT_AT_TWO


@pytest.mark.parametrize("malformed", [
    THREE_DEEP + b"\x0a\x05ab",  # a length past the end
    THREE_DEEP + encoded_varint(7 << 3 | 4),  # an end-group outside any group
    THREE_DEEP + encoded_varint(7 << 3 | 3) + encoded_varint(8 << 3 | 4),  # a group ended as another
    THREE_DEEP + encoded_varint(7 << 3 | 3),  # a group never ended
    THREE_DEEP + b"\x00\x01",  # field number 0
    THREE_DEEP + b"\xff" * 11,  # a varint longer than 10 bytes
])
def test_protobuf_pruning_gives_up_on_a_body_that_is_not_wire_format(malformed):
    assert pruned_protobuf(malformed, levels=2) is None


def test_protobuf_pruning_reads_what_upb_refuses_for_depth_as_upb_reads_the_rest():
    good = _message("traces", _spans_doc())
    body = _body("traces", _spans_doc(), "app.payload", PROTOBUF)
    with pytest.raises(Exception) as refused:
        ExportTraceServiceRequest.FromString(body)
    assert is_depth_error(refused.value)
    pruned = ExportTraceServiceRequest.FromString(pruned_protobuf(body))
    spans = pruned.resource_spans[0].scope_spans[0].spans
    assert spans[:3] == good.resource_spans[0].scope_spans[0].spans[:3]
    assert [kv.key for kv in spans[3].attributes][-1] == "app.payload"


def test_json_pruning_replaces_what_lies_past_the_level_with_null():
    text = br'{"a": [[["x"]]], "b": "[[[\"]]]{", "c": [1, {"d\\": {"e": 2}}], "f": [[]]}'
    assert orjson.loads(pruned_json(text, levels=2)) == {"a": [None], "b": '[[["]]]{', "c": [1, None], "f": [None]}


def test_json_pruning_does_not_count_brackets_in_strings_or_after_escapes():
    text = br'[["]]]\\", "\"[[", ["x\\\\"]], "{{"]'
    assert orjson.loads(pruned_json(text, levels=2)) == [[']]]\\', '"[[', None], "{{"]
    assert pruned_json(br'[["[[[[", "]]]]"]]', levels=2) is None  # nothing to cut


@pytest.mark.parametrize("unbalanced", [b"[[[[1]]]", b"[[[[1]]]]]", b'[[[["x]]]]'])
def test_json_pruning_gives_up_on_unbalanced_brackets(unbalanced):
    assert pruned_json(unbalanced, levels=2) is None


def test_json_pruning_answers_what_orjson_refuses_for_depth():
    text = _body("traces", _spans_doc(), "http.route", JSON)
    with pytest.raises(orjson.JSONDecodeError) as refused:
        orjson.loads(text)
    assert is_depth_error(refused.value)
    doc = orjson.loads(pruned_json(text))
    assert doc["resourceSpans"][0]["scopeSpans"][0]["spans"][:3] == _spans_doc()["resourceSpans"][0]["scopeSpans"][0][
        "spans"][:3]
