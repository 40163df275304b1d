"""`sloscope serve` as an operator sees it: a port it cannot have, an IPv6 address, liveness and readiness, its own
counters on /metrics, and its log lines."""

import io
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from sloscope.analytics.store import Store
from sloscope.analytics.writer import Writer
from sloscope.receiver.server import http_server
from sloscope import logs
from sloscope.commands.serve_ops import readiness_page
from tests.alerting_stack import free_port, wait_listening
from tests.otlp_builders import gauge, metrics, span, traces
from tests.raw_http import RawClient, request

T0 = 1_764_410_400_000_000_000
TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _serve(db, *flags, http_port=None, grpc="off"):
    command = [sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--decode-workers", "0",
               "--http", f"127.0.0.1:{http_port}" if http_port else "off", "--grpc", grpc, *flags]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def _stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    return stderr


def _get(port, path) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape(port) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(_get(port, "/metrics")[1]) for s in f.samples}


@pytest.mark.parametrize("taken", ["http", "grpc"])
def test_a_port_that_is_taken_is_one_line_and_a_failing_exit(tmp_path, taken):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port, other = holder.getsockname()[1], free_port()
        http_port, grpc_port = (port, other) if taken == "http" else (other, port)
        proc = _serve(tmp_path / "s.duckdb", http_port=http_port, grpc=f"127.0.0.1:{grpc_port}")
        _, stderr = proc.communicate(timeout=60)
    what = "OTLP/HTTP" if taken == "http" else "OTLP/gRPC"
    assert proc.returncode != 0
    assert stderr.splitlines() == [f"sloscope serve: cannot listen for {what} on 127.0.0.1:{port}: "
                                   "Address already in use"]


def test_a_port_that_is_taken_on_ipv6_loopback_is_named_in_brackets(tmp_path, ipv6_loopback):
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind((ipv6_loopback, 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = _serve(tmp_path / "s.duckdb", grpc=f"[{ipv6_loopback}]:{port}")
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert stderr.splitlines() == [f"sloscope serve: cannot listen for OTLP/gRPC on [::1]:{port}: "
                                   "Address already in use"]


def _listening_on(proc) -> dict[str, str]:
    """What serve's log says each listener is on ({"OTLP/HTTP": "http://HOST:PORT", ...}), read up to the line
    saying it serves."""
    shown = {}
    for line in proc.stderr:
        if found := re.search(r"(OTLP/HTTP|OTLP/gRPC) on (\S+)$", line):
            shown[found[1]] = found[2]
        if "writing to" in line:
            break
    return shown


def test_serve_receives_over_http_and_grpc_on_ipv6_loopback(tmp_path, ipv6_loopback):
    loopback = f"[{ipv6_loopback}]:0"
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(tmp_path / "s.duckdb"),
                             "--decode-workers", "0", "--http", loopback, "--grpc", loopback],
                            stderr=subprocess.PIPE, text=True)
    try:
        shown = _listening_on(proc)
        assert re.fullmatch(r"http://\[::1\]:\d+", shown["OTLP/HTTP"]), shown
        assert re.fullmatch(r"\[::1\]:\d+", shown["OTLP/gRPC"]), shown
        spans = json.dumps(traces([span("a" * 32, "b" * 16, T0, 20, tier=["standard"])])).encode()
        post = urllib.request.Request(shown["OTLP/HTTP"] + "/v1/traces", spans, {"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=10) as reply:
            assert reply.status == 200
        points = ParseDict(metrics([gauge("hw.gpu.temperature", [(T0, 61.0)], {"hw.id": "GPU-1"})]),
                           metrics_service_pb2.ExportMetricsServiceRequest())
        with grpc.insecure_channel(shown["OTLP/gRPC"]) as channel:
            metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(points, timeout=10)
    finally:
        _stop(proc)
    assert proc.returncode == 0
    with Store(tmp_path / "s.duckdb", read_only=True) as store:
        assert store.rows("SELECT count(*) FROM requests") == [(1,)]
        assert store.rows("SELECT count(*) FROM samples") == [(1,)]


def test_health_readiness_counters_and_json_logs_of_a_running_serve(tmp_path):
    port = free_port()
    proc = _serve(tmp_path / "s.duckdb", "--log-format", "json", "--max-request-body-size", "4KiB", http_port=port)
    try:
        wait_listening(port, proc, "sloscope serve")
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (200, "ready\n")
        good = json.dumps(traces([span("a" * 32, "b" * 16, T0, 20, tier=["standard"])])).encode()
        sends = [request("/v1/traces", good, {"Content-Type": "application/json"}),
                 request("/v1/traces", b"{nope", {"Content-Type": "application/json"}),
                 request("/v1/traces", b"x" * 5000, {"Content-Type": "application/json"}),
                 b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n",
                 request("/v1/metrics", json.dumps(metrics([gauge("hw.gpu.temperature", [(T0, "NaN")])])).encode(),
                         {"Content-Type": "application/json"})]
        for raw in sends:
            with RawClient(port) as c:
                c.send(raw)
                c.response()
        deadline = time.monotonic() + 10  # the writer commits within its linger of a second
        while (scraped := _scrape(port))[("sloscope_writer_queued_bytes", ())] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stderr = _stop(proc)
    requests = "sloscope_receiver_requests_total"
    assert scraped[(requests, (("outcome", "accepted"), ("signal", "traces")))] == 1
    assert scraped[(requests, (("outcome", "invalid"), ("signal", "traces")))] == 1
    assert scraped[(requests, (("outcome", "refused"), ("signal", "metrics")))] == 0
    partial = (("reason", "points_not_finite"), ("signal", "metrics"))
    assert scraped[("sloscope_receiver_partial_rejects_total", partial)] == 1
    bad = "sloscope_receiver_bad_requests_total"
    assert scraped[(bad, (("reason", "too_large"),))] == 1 and scraped[(bad, (("reason", "bad_framing"),))] == 1
    assert scraped[("sloscope_writer_write_failures_total", ())] == 0
    assert scraped[("sloscope_writer_queued_bytes", ())] == 0 and scraped[("sloscope_writer_healthy", ())] == 1
    assert scraped[("sloscope_receiver_inflight_bytes", ())] == 0
    lines = [json.loads(line) for line in stderr.splitlines()]
    assert all(set(line) == {"time", "level", "logger", "message"} for line in lines)
    assert all(re.fullmatch(TIMESTAMP, line["time"]) for line in lines)
    assert any(line["message"].startswith("OTLP/HTTP on http://127.0.0.1:") for line in lines)
    assert lines[-1]["message"].startswith("stopped; written:")


def test_readyz_says_why_serve_is_not_ready(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    writer = Writer(store).start()
    stopping = threading.Event()
    httpd = http_server(None, "127.0.0.1", 0, pages={"/readyz": readiness_page(store, writer, stopping)})
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        assert _get(port, "/readyz") == (200, "ready\n")
        stopping.set()
        assert _get(port, "/readyz") == (503, "/readyz: not ready: shutting down\n")
        stopping.clear()
        writer.stop()
        store.close()
        status, reason = _get(port, "/readyz")
        assert (status, reason) == (503, "/readyz: not ready: store not open; stopping\n")  # no error text
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_text_logs_have_timestamps_and_one_line_per_message(tmp_path):
    port = free_port()
    proc = _serve(tmp_path / "t.duckdb", http_port=port)
    try:
        wait_listening(port, proc, "sloscope serve")
    finally:
        stderr = _stop(proc)
    assert re.match(TIMESTAMP + r" INFO sloscope\.serve: OTLP/HTTP on http://127\.0\.0\.1:\d+$", stderr.splitlines()[0])
    stream, root = io.StringIO(), logging.getLogger()
    saved = root.handlers[:], root.level  # pytest's own capture, given back
    try:
        logs.configure("warning", "text", stream)
        logging.getLogger("sloscope.test").info("not logged at warning")
        logging.getLogger("sloscope.test").warning("tier %s", "x\r\nFORGED LINE")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert re.fullmatch(TIMESTAMP + r" WARNING sloscope\.test: tier x\\r\\nFORGED LINE\n", stream.getvalue())
