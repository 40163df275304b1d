"""A `sloscope serve` on 127.0.0.1 against requests of a few KiB, compressed, that inflate within the 32 MiB body
limit to millions of empty items, attributes, buckets or brackets: each is answered 413 / RESOURCE_EXHAUSTED
naming its limit, at once, and costs serve no more memory than the body itself, where decoding it used to cost
gigabytes. A large batch of ordinary items still passes.

The memory bound: what serve holds of such a request is its compressed body, the inflated body as it grows and
once joined (twice the body limit) and, for JSON past a limit, that text without its strings (the body limit
again); four times the body limit leaves room for the allocator. Before the limits, the empty spans alone took
serve's peak to 3 GiB."""

import gzip
import re
import subprocess
import sys
import time
import urllib.request
import zlib

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from sloscope.receiver.limits import Limits
from sloscope.receiver.wire import encoded_varint
from tests.hostile_clients import rss_bytes

BODY = Limits().max_body_bytes
RSS_BOUND = 4 * BODY
ANSWERED_WITHIN_S = 5.0
T0 = 1_764_410_400_000_000_000
PROTOBUF, JSON = "application/x-protobuf", "application/json"


def field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + encoded_varint(len(payload)) + payload


def filled(unit: bytes, room: int) -> bytes:
    return unit * (room // len(unit))


def empty_items() -> bytes:
    """One resource block, one scope block, and empty spans (or metrics, or log records) up to the body limit."""
    return field(1, field(2, filled(b"\x12\x00", BODY - 16)))


def empty_attributes() -> bytes:
    """A resource of empty key-values up to the body limit."""
    return field(1, field(1, filled(b"\x0a\x00", BODY - 16)))


def histogram_buckets(n: int) -> bytes:
    """One exponential histogram point of n buckets of one (n bytes: a bucket count of 1 is one byte)."""
    point = (b"\x19" + T0.to_bytes(8, "little") + b"\x21" + n.to_bytes(8, "little") +
             field(8, field(2, b"\x01" * n)))
    return field(1, field(2, field(2, field(1, b"sloscope.tcp.rtt") + field(10, field(1, point) + b"\x10\x02"))))


def nested_json() -> bytes:
    """An attribute value of arrays nested millions deep."""
    depth = BODY // 2 - 128
    return (b'{"resourceSpans":[{"resource":{"attributes":[{"key":"k","value":' + b"[" * depth + b"]" * depth +
            b"}]}}]}")


def _listening_on(log_path, proc) -> dict[str, int]:
    """The port of each listener ({"OTLP/HTTP": PORT, "OTLP/gRPC": PORT}), from serve's log once it serves."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        log = log_path.read_text()
        if "writing to" in log:
            return {kind: int(port) for kind, port in re.findall(r"(OTLP/HTTP|OTLP/gRPC) on \S*:(\d+)$", log, re.M)}
        time.sleep(0.1)
    raise AssertionError(f"serve did not start: {log_path.read_text()[-2000:]}")


class Serve:
    """serve as a subprocess, with one decode worker, and its peak RSS since `reset_peak`."""

    def __init__(self, tmp_path):
        log = tmp_path / "serve.log"
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db",
                                          str(tmp_path / "s.duckdb"), "--decode-workers", "1", "--http",
                                          "127.0.0.1:0", "--grpc", "127.0.0.1:0"], stderr=out)
        ports = _listening_on(log, self.proc)
        self.port, self.grpc_port = ports["OTLP/HTTP"], ports["OTLP/gRPC"]

    def reset_peak(self) -> int:
        """Start the peak over from now (Linux: clear_refs 5); the RSS now."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as refs:
            refs.write("5")
        return rss_bytes(self.proc.pid)

    def peak(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    def post(self, signal: str, body: bytes, content_type: str, coding: str) -> tuple[int, bytes]:
        data = zlib.compress(body, 9) if coding == "deflate" else gzip.compress(body, 6)
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/{signal}", data,
                                         {"Content-Type": content_type, "Content-Encoding": coding})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read()

    def page(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as reply:
            return reply.read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    served = Serve(tmp_path_factory.mktemp("serve"))
    yield served
    served.stop()


def _refused(serve, send) -> tuple[bytes, float, int]:
    """(the answer's body, seconds to it, bytes serve's peak RSS rose by) of `send()`, which must be refused
    with a 413."""
    before = serve.reset_peak()
    began = time.monotonic()
    status, answer = send()
    took = time.monotonic() - began
    assert status == 413, answer[:300]
    return answer, took, serve.peak() - before


@pytest.mark.parametrize("signal, body, content_type, coding, flag", [
    ("traces", empty_items, PROTOBUF, "deflate", "--max-request-items"),
    ("metrics", empty_items, PROTOBUF, "gzip", "--max-request-items"),
    ("logs", empty_items, PROTOBUF, "deflate", "--max-request-items"),
    ("traces", lambda: b'{"resourceSpans":[' + filled(b"{},", BODY - 32) + b"{}]}", JSON, "deflate",
     "--max-request-items"),
    ("metrics", empty_attributes, PROTOBUF, "deflate", "--max-request-attributes"),
    ("metrics", lambda: histogram_buckets(Limits().max_request_buckets + 1), PROTOBUF, "gzip",
     "--max-request-buckets"),
    ("traces", nested_json, JSON, "deflate", "--max-request-items"),
], ids=["empty spans", "empty metrics", "empty log records", "{} in JSON", "attributes", "buckets",
        "nested JSON"])
def test_an_amplifying_request_is_413_at_once_costing_no_more_than_its_body(serve, signal, body, content_type,
                                                                            coding, flag):
    answer, took, rose = _refused(serve, lambda: serve.post(signal, body(), content_type, coding))
    assert f"in one request ({flag})".encode() in answer
    assert took < ANSWERED_WITHIN_S
    assert rose < RSS_BOUND, f"serve's peak RSS rose by {rose / 2**20:.0f} MiB"


def test_an_amplifying_grpc_message_is_resource_exhausted_costing_no_more_than_its_body(serve):
    before = serve.reset_peak()
    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}", compression=grpc.Compression.Gzip) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
        with pytest.raises(grpc.RpcError) as refused:
            export(field(1, field(2, filled(b"\x12\x00", BODY - 64))), timeout=30)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "in one request (--max-request-items)" in refused.value.details()
    assert serve.peak() - before < RSS_BOUND


def test_refusals_for_too_many_items_are_counted_on_metrics(serve):
    serve.post("traces", field(1, field(2, filled(b"\x12\x00", BODY - 16))), PROTOBUF, "deflate")
    counted = re.search(r'^sloscope_receiver_bad_requests_total\{reason="too_many_items"\} (\S+)',
                        serve.page("/metrics"), re.M)
    assert counted and float(counted[1]) >= 1


def ordinary_spans(size: int) -> bytes:
    """Spans as Envoy writes them (twenty tags each), as many as `size` bytes hold, each with its own ids."""
    span_attributes = [KeyValue(key=f"envoy.tag.{k}", value=AnyValue(string_value=f"value-{k:02d}"))
                       for k in range(18)] + [
        KeyValue(key="http.response.status_code", value=AnyValue(string_value="200")),
        KeyValue(key="http.request.header.x-slo-tier", value=AnyValue(string_value="standard"))]
    request = ExportTraceServiceRequest()
    block = request.resource_spans.add()
    block.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="gpu-node-1")))
    template = block.scope_spans.add().spans.add(
        trace_id=b"T" * 16, span_id=b"S" * 8, name="ingress", kind=2, start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 20_000_000, attributes=span_attributes).SerializeToString()
    head, tail = template.split(b"T" * 16 + b"\x12\x08" + b"S" * 8)
    one = len(field(2, template))
    spans = [field(2, head + n.to_bytes(16, "big") + b"\x12\x08" + n.to_bytes(8, "big") + tail)
             for n in range(1, (size - 256) // one)]
    resource = field(1, block.resource.SerializeToString())
    return field(1, resource + field(2, b"".join(spans)))


def test_a_body_of_ordinary_spans_at_the_body_limit_is_accepted(serve):
    body = ordinary_spans(BODY)
    assert len(body) > BODY - 1024
    status, answer = serve.post("traces", body, PROTOBUF, "gzip")
    assert status == 200, answer[:300]


def test_a_batch_of_the_largest_exponential_histograms_is_accepted(serve):
    """The Collector's batch (8192 points) of exponential histograms of 160 positive and 160 negative buckets
    each, the SDKs' largest."""
    point = (b"\x19" + T0.to_bytes(8, "little") + b"\x21" + (320).to_bytes(8, "little") +
             field(8, field(2, b"\x01" * 160)) + field(9, field(2, b"\x01" * 160)))
    metric = field(1, b"sloscope.tcp.rtt") + field(10, filled(field(1, point), 8192 * len(field(1, point))) +
                                                   b"\x10\x02")
    body = field(1, field(1, field(1, field(1, b"host.name") + field(2, field(1, b"gpu-node-1")))) +
                 field(2, field(2, metric)))
    status, answer = serve.post("metrics", body, PROTOBUF, "gzip")
    assert status == 200, answer[:300]
