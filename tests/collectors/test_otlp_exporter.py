"""The collector's OTLP client: every answer classified as the OTLP specification says (retryable or not,
Retry-After / RetryInfo, partial success), against a stand-in receiver over real HTTP and gRPC."""

import email.utils
import re
import socket
import threading
import time

import grpc
import pytest

from sloscope.collectors.otlp_answers import DELIVERED, REFUSED, RETRY, parse_retry_after
from sloscope.collectors.otlp_grpc import GrpcExporter
from sloscope.collectors.otlp_http import HttpExporter
from tests.fakes.otlp_sink import OtlpSink, free_port
from tests.collectors.test_spool import request

BODY = request(2, 1)


@pytest.fixture(scope="module")
def http_sink():
    with OtlpSink("http") as sink:
        yield sink


@pytest.fixture(scope="module")
def grpc_sink():
    with OtlpSink("grpc") as sink:
        yield sink


@pytest.fixture(autouse=True)
def answers_reset(request):
    yield
    for name in ("http_sink", "grpc_sink"):
        if name in request.fixturenames:
            sink = request.getfixturevalue(name)
            sink.fail_with, sink.retry_after, sink.partially_rejected = None, None, 0


def http_exporter(sink):
    return HttpExporter(f"{sink.endpoint}/v1/metrics", {"authorization": "Bearer t"}, timeout_s=2)


def grpc_exporter(sink):
    return GrpcExporter(sink.endpoint, {"authorization": "Bearer t"}, timeout_s=2)


@pytest.mark.parametrize("code, outcome", [(429, RETRY), (502, RETRY), (503, RETRY), (504, RETRY),
                                           (400, REFUSED), (401, REFUSED), (403, REFUSED), (404, REFUSED),
                                           (413, REFUSED), (500, REFUSED), (501, REFUSED)])
def test_http_answers(http_sink, code, outcome):
    http_sink.fail_with = code
    answer = http_exporter(http_sink).send(BODY)
    assert answer.outcome == outcome and answer.detail == f"HTTP {code}: failing on purpose"
    assert answer.retry_after_s is None


@pytest.mark.parametrize("name, outcome", [
    ("CANCELLED", RETRY), ("DEADLINE_EXCEEDED", RETRY), ("ABORTED", RETRY), ("OUT_OF_RANGE", RETRY),
    ("UNAVAILABLE", RETRY), ("DATA_LOSS", RETRY), ("RESOURCE_EXHAUSTED", REFUSED), ("UNKNOWN", REFUSED),
    ("INVALID_ARGUMENT", REFUSED), ("NOT_FOUND", REFUSED), ("ALREADY_EXISTS", REFUSED),
    ("PERMISSION_DENIED", REFUSED), ("UNAUTHENTICATED", REFUSED), ("FAILED_PRECONDITION", REFUSED),
    ("UNIMPLEMENTED", REFUSED), ("INTERNAL", REFUSED)])
def test_grpc_answers(grpc_sink, name, outcome):
    grpc_sink.fail_with = grpc.StatusCode[name]
    answer = grpc_exporter(grpc_sink).send(BODY)
    assert answer.outcome == outcome and answer.detail == f"gRPC {name}: failing on purpose"


def test_retry_after_and_retry_info_are_the_servers_wish(http_sink, grpc_sink):
    http_sink.fail_with, http_sink.retry_after = 503, 7
    assert http_exporter(http_sink).send(BODY).retry_after_s == 7.0
    grpc_sink.fail_with, grpc_sink.retry_after = grpc.StatusCode.UNAVAILABLE, 2.5
    assert grpc_exporter(grpc_sink).send(BODY).retry_after_s == 2.5
    grpc_sink.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED  # with RetryInfo: the server can recover
    answer = grpc_exporter(grpc_sink).send(BODY)
    assert (answer.outcome, answer.retry_after_s) == (RETRY, 2.5)


def test_delivery_and_partial_success(http_sink, grpc_sink):
    for sink, exporter in ((http_sink, http_exporter(http_sink)), (grpc_sink, grpc_exporter(grpc_sink))):
        before = len(sink.requests)
        answer = exporter.send(BODY)
        assert (answer.outcome, answer.rejected_points) == (DELIVERED, 0)
        assert sink.requests[before].SerializeToString() == BODY  # the bytes as given
        assert sink.headers_seen["authorization"] == "Bearer t"
        assert sink.headers_seen["user-agent"].startswith("sloscope-collector")
        sink.partially_rejected = 3
        answer = exporter.send(BODY)
        assert (answer.outcome, answer.rejected_points) == (DELIVERED, 3)  # kept: must not be retried
        assert "some points were not kept" in answer.detail


def test_no_answer_is_retryable():
    closed = f"http://127.0.0.1:{free_port()}"
    for exporter in (HttpExporter(f"{closed}/v1/metrics", {}, 1), GrpcExporter(closed, {}, 1)):
        answer = exporter.send(BODY)
        assert answer.outcome == RETRY and answer.retry_after_s is None
        exporter.shutdown()
        assert exporter.send(BODY).outcome == RETRY  # after shutdown too: the batch is kept


def test_a_grpc_endpoint_back_after_an_outage_is_reached_on_the_next_attempt():
    """gRPC's channel backs off its reconnects on its own (to 2 minutes) and fails every call meanwhile; the
    sender's attempts must reach an endpoint that is back, not wait that out."""
    sink = OtlpSink("grpc")
    exporter = GrpcExporter(sink.endpoint, {}, timeout_s=1)
    try:
        outage_ends = time.monotonic() + 10  # the channel's own backoff grows past 4 s meanwhile
        while time.monotonic() < outage_ends:
            assert exporter.send(BODY).outcome == RETRY
            time.sleep(0.2)
        sink.start()
        back = time.monotonic()
        while exporter.send(BODY).outcome != DELIVERED and time.monotonic() - back < 30:
            time.sleep(0.2)
        assert time.monotonic() - back < 2
    finally:
        exporter.shutdown()
        sink.stop()


def test_a_slow_answer_is_retryable(http_sink):
    http_sink.delay_s = 1.0
    try:
        answer = HttpExporter(f"{http_sink.endpoint}/v1/metrics", {}, timeout_s=0.2).send(BODY)
    finally:
        http_sink.delay_s = 0.0
    assert answer.outcome == RETRY and "Timeout" in answer.detail


def test_untrusted_answers_are_cut_and_made_printable(http_sink, monkeypatch):
    monkeypatch.setattr(http_sink, "_status", lambda code, message: b"\x1b[31m" + b"A" * 5000 + b"\n")
    http_sink.fail_with = 400
    answer = http_exporter(http_sink).send(BODY)
    assert len(answer.detail) <= 200 and "\x1b" not in answer.detail and "\n" not in answer.detail


def test_retry_after_forms():
    now = time.time()
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    for bad in (None, "", "soon", "-1", "1.5", "nan"):
        assert parse_retry_after(bad) is None


class _EndlessAnswer:
    """An endpoint that answers `code` with a chunked body that never ends: a byte every `pause_s`, or as fast as
    it can when pause_s is 0."""

    def __init__(self, code: int, pause_s: float):
        self.code, self.pause_s = code, pause_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1/metrics"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(f"HTTP/1.1 {self.code} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"1\r\nx\r\n" if self.pause_s else b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
            deadline = time.monotonic() + 30
            try:
                while time.monotonic() < deadline:
                    conn.sendall(chunk)
                    time.sleep(self.pause_s)
            except OSError:  # the client went: done
                pass


@pytest.mark.parametrize("pause_s", [0.05, 0.0], ids=["trickle", "flood"])
@pytest.mark.parametrize("code, outcome", [(200, DELIVERED), (503, RETRY), (400, REFUSED)])
def test_an_answer_whose_body_never_ends_is_judged_by_its_status_within_the_timeout(code, outcome, pause_s):
    endpoint = _EndlessAnswer(code, pause_s)
    started = time.monotonic()
    answer = HttpExporter(endpoint.endpoint, {}, timeout_s=0.5).send(BODY)
    assert time.monotonic() - started < 2 * 0.5 + 1.0  # the bound: twice the timeout
    assert answer.outcome == outcome and "not read" in answer.detail
