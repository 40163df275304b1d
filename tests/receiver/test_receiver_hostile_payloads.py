"""What a client gets back for what it should not have sent: a gauge or sum point without a value is refused alone
on every decoding path, as a counted partial success, never stored as 0; and every error answer to an OTLP/HTTP
export request is a google.rpc.Status in the request's own encoding, as OTLP/HTTP requires."""

import json

import grpc
import pytest
from google.protobuf.json_format import ParseDict
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from sloscope.edge.auth import BearerAuth
from sloscope.receiver.limits import Limits
from tests.in_process import InProcessReceiver
from tests.otlp_builders import counter, gauge, metrics
from tests.raw_http import RawClient, request

T0 = 1_764_410_400_000_000_000
S = 10**9
PROTOBUF, JSON = "application/x-protobuf", "application/json"


def _valueless_second_points() -> dict:
    """A gauge and a cumulative sum of two points each, the second of each with neither asDouble nor asInt."""
    doc = metrics([gauge("hw.gpu.temperature", [(T0, 61.0), (T0 + S, 62.0)], {"hw.id": "GPU-1"}),
                   counter("sloscope.tcp.retransmits", T0 - S, [(T0, 10), (T0 + S, 20)])])
    for metric in doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]:
        point = (metric.get("gauge") or metric["sum"])["dataPoints"][1]
        del point["asDouble" if "asDouble" in point else "asInt"]
    return doc


def _over_http(server, doc, content_type):
    body = json.dumps(doc).encode() if content_type == JSON else \
        ParseDict(doc, metrics_service_pb2.ExportMetricsServiceRequest()).SerializeToString()
    status, _, reply = server.post("/v1/metrics", body, content_type)
    assert status == 200, reply
    if content_type == JSON:
        partial = json.loads(reply)["partialSuccess"]
        return int(partial["rejectedDataPoints"]), partial["errorMessage"]
    partial = metrics_service_pb2.ExportMetricsServiceResponse.FromString(reply).partial_success
    return partial.rejected_data_points, partial.error_message


def _over_grpc(server, doc):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        partial = metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(
            ParseDict(doc, metrics_service_pb2.ExportMetricsServiceRequest()), timeout=10).partial_success
    return partial.rejected_data_points, partial.error_message


@pytest.mark.parametrize("path", ["protobuf", "json", "grpc", "protobuf by a decode worker", "json by a decode worker"])
def test_a_point_without_a_value_is_refused_alone_on_every_path(tmp_path, one_worker_pool, path):
    server = InProcessReceiver(tmp_path / "r.duckdb", decode_pool=one_worker_pool if "worker" in path else None)
    try:
        doc = _valueless_second_points()
        if path == "grpc":
            rejected, message = _over_grpc(server, doc)
        else:
            rejected, message = _over_http(server, doc, JSON if path.startswith("json") else PROTOBUF)
        assert rejected == 2 and "2 points_invalid_value" in message
        assert server.receiver.counts["metrics_rejected_points_invalid_value"] == 2
        assert server.rows("SELECT metric, value FROM samples ORDER BY metric") == [
            ("hw.gpu.temperature", 61.0), ("sloscope.tcp.retransmits", 10.0)]
        assert server.store.counters()["points_invalid_value"] == 2
    finally:
        server.close()


@pytest.fixture
def served(tmp_path):
    made = []

    def make(**options):
        made.append(InProcessReceiver(tmp_path / f"r{len(made)}.duckdb", **options))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _head(content_type: str, framing: str, path: str = "/v1/traces") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n".encode()


def _invalid(content_type: str) -> bytes:
    return b"{not json" if content_type == JSON else b"\xff" * 30


# (request for a content type, HTTP status, google.rpc.Status code, the message's start, counter)
ERROR_ANSWERS = [
    pytest.param(lambda ct: request("/v1/traces", _invalid(ct), {"Content-Type": ct}), 400,
                 grpc.StatusCode.INVALID_ARGUMENT,
                 {JSON: "not valid JSON", PROTOBUF: "not a valid ExportTraceServiceRequest"}, "traces_invalid",
                 id="invalid body"),
    pytest.param(lambda ct: _head(ct, "Content-Length: -1"), 400, grpc.StatusCode.INVALID_ARGUMENT,
                 "Content-Length must be one non-negative decimal number", "requests_bad_framing",
                 id="bad Content-Length"),
    pytest.param(lambda ct: _head(ct, "X-Nothing: 1"), 411, grpc.StatusCode.INVALID_ARGUMENT,
                 "Content-Length or Transfer-Encoding: chunked required", "requests_bad_framing", id="no framing"),
    pytest.param(lambda ct: _head(ct, "Transfer-Encoding: gzip, chunked"), 501, grpc.StatusCode.UNIMPLEMENTED,
                 "Transfer-Encoding must be chunked alone", "requests_bad_framing", id="transfer coding"),
    pytest.param(lambda ct: _head(ct, "Content-Length: 70000"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 "body larger than 65536 bytes", "requests_too_large", id="too large"),
    pytest.param(lambda ct: request("/v1/traces", b"x", {"Content-Type": ct, "Content-Encoding": "br"}), 415,
                 grpc.StatusCode.INVALID_ARGUMENT, "unsupported Content-Encoding 'br'", "requests_bad_encoding",
                 id="content coding"),
    pytest.param(lambda ct: _head(ct, "Content-Length: 10") + b"{", 408, grpc.StatusCode.DEADLINE_EXCEEDED,
                 "request body not received within 0.5 s", "requests_body_timeout", id="body deadline"),
    pytest.param(lambda ct: request("/v1/nope", b"{}", {"Content-Type": ct}), 404, grpc.StatusCode.UNIMPLEMENTED,
                 "unknown path: OTLP/HTTP serves", "requests_unknown_path", id="unknown path"),
]


def _status(content_type: str, body: bytes) -> tuple[int, str]:
    if content_type == JSON:
        status = json.loads(body)
        return status["code"], status["message"]
    status = status_pb2.Status.FromString(body)
    return status.code, status.message


@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
@pytest.mark.parametrize("make_request,code,grpc_code,message,counter", ERROR_ANSWERS)
def test_error_answers_to_export_requests_are_a_status_in_the_requests_encoding(
        served, content_type, make_request, code, grpc_code, message, counter):
    s = served(limits=Limits(max_body_bytes=65536, grpc_max_message_bytes=65536, read_timeout_s=0.5))
    with RawClient(s.http_port) as c:
        c.send(make_request(content_type + "; charset=utf-8"))
        status, headers, body = c.response()
    assert (status, headers["content-type"]) == (code, content_type)
    reply_code, reply_message = _status(content_type, body)
    expected = message[content_type] if isinstance(message, dict) else message
    assert reply_code == grpc_code.value[0] and reply_message.startswith(expected)
    assert s.receiver.counts[counter] == 1


@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
def test_an_unauthenticated_export_request_is_a_status_with_the_challenge(served, content_type):
    s = served(auth=BearerAuth(b"secret"))
    status, headers, body = s.post("/v1/traces", b"", content_type)
    assert (status, headers["Content-Type"]) == (401, content_type) and headers["WWW-Authenticate"]
    assert _status(content_type, body) == (grpc.StatusCode.UNAUTHENTICATED.value[0], "missing or wrong bearer token")
    assert s.receiver.counts["unauthenticated_http"] == 1


def test_answers_with_no_otlp_encoding_to_answer_in_stay_text(served):
    """A POST in neither OTLP encoding (as the Collector answers it), and the pages' errors."""
    s = served(pages={"/healthz": lambda: (b"ok\n", "text/plain")})
    status, headers, body = s.post("/v1/traces", b"x", "text/plain")
    assert (status, headers["Content-Type"]) == (415, "text/plain; charset=utf-8")
    assert body == b"Content-Type must be application/x-protobuf or application/json\n"
    with RawClient(s.http_port) as c:
        c.send(request("/nope", b"", {"Content-Type": JSON}, method="GET", length=False))
        status, headers, body = c.response()
    assert (status, headers["content-type"]) == (404, "text/plain; charset=utf-8") and body.startswith(b"not found")
