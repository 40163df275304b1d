"""serve's decode workers: what they store is what the server process would have stored, a bad body is still
the client's 400, a worker that dies costs a retry, never an accepted request, and workers do not outlive serve."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sloscope.analytics.decode_pool import DecodePool
from sloscope.slo_spec import load_spec
from tests.otlp_builders import exp_histogram, gauge, metrics, resource, span, traces
from tests.in_process import InProcessReceiver
from tests.receiver.test_receiver import T0, _proto_traces

HISTOGRAM = "sloscope.syscall.duration"


@pytest.fixture(scope="module")
def pool():
    spec = load_spec(None)
    p = DecodePool(2, frozenset(spec.tiers), spec.default_tier)
    yield p
    p.close()


def _requests():
    """A mix: protobuf and JSON spans (with a forged tier), gzip JSON metrics, GPU-only spans."""
    gpu_only = {"resourceSpans": [{"resource": resource(service_name="llm-gateway"), "scopeSpans": [{"spans": [
        span("c" * 32, "d" * 16, T0 + 5, 80, tier=["standard"], extra={"hw.id": "GPU-7"})]}]}]}
    return [
        ("/v1/traces", _proto_traces(20).SerializeToString(), "application/x-protobuf", {}),
        ("/v1/traces", _proto_traces(3, tier="x" * 500).SerializeToString(), "application/x-protobuf", {}),
        ("/v1/traces", json.dumps(traces([span("a" * 32, "b" * 16, T0, 250, tier=["bogus"])])).encode(),
         "application/json", {}),
        ("/v1/metrics", gzip.compress(json.dumps(metrics([
            gauge("hw.gpu.temperature", [(T0, 61.0), (T0 + 10**9, 63.0)], {"hw.id": "GPU-7"}),
            exp_histogram(HISTOGRAM, T0 - 10**9, [(T0, 4, 0.002, -12, [3, 1])], attrs={"syscall.name": "read"})])).encode()),
         "application/json", {"Content-Encoding": "gzip"}),
        ("/v1/traces", json.dumps(gpu_only).encode(), "application/json", {}),
    ]


def _json_traces(n: int) -> bytes:
    """Spans the fast path does not take (it reads protobuf only), so that they go to the workers."""
    return json.dumps(traces([span(f"{i + 1:032x}", f"{i + 1:016x}", T0 + i, 100) for i in range(n)])).encode()


def _stored(server):
    server.writer.stop()
    counters = server.store.counters()
    return (server.store.rows("SELECT * FROM requests ORDER BY trace_hi, trace_lo, span_id"),
            server.store.rows("SELECT * FROM samples ORDER BY ALL"),
            server.store.rows("SELECT * FROM histograms ORDER BY ALL"),
            {k: v for k, v in counters.items() if v})


def test_workers_store_what_the_server_process_would(tmp_path, pool):
    inline, offloaded = InProcessReceiver(tmp_path / "inline.duckdb"), InProcessReceiver(tmp_path / "pool.duckdb", decode_pool=pool)
    try:
        for path, body, content_type, headers in _requests():
            replies = [s.post(path, body, content_type, headers) for s in (inline, offloaded)]
            assert [r[0] for r in replies] == [200, 200], replies
            assert replies[0][2] == replies[1][2]  # the same OTLP response, partial success included
        got_inline, got_pool = _stored(inline), _stored(offloaded)
        assert got_inline == got_pool
        requests, samples, histograms, counters = got_pool
        assert len(requests) == 22 and samples and histograms  # the second request repeats ids 1-3
        assert counters["tier_invalid"] >= 1 and counters["spans_node_from_gpu"] == 1
    finally:
        inline.close()
        offloaded.close()


@pytest.mark.parametrize("body,content_type", [(b"\xff\xff\xff not protobuf", "application/x-protobuf"),
                                               (b'{"resourceSpans": "x"}', "application/json")])
def test_a_bad_body_is_still_a_counted_400(tmp_path, pool, body, content_type):
    server = InProcessReceiver(tmp_path / "r.duckdb", decode_pool=pool)
    try:
        assert server.post("/v1/traces", body, content_type)[0] == 400
        assert server.receiver.counts["traces_invalid"] == 1
        assert server.post("/v1/traces", _proto_traces(1).SerializeToString())[0] == 200
    finally:
        server.close()


def test_a_killed_worker_costs_a_retry_not_data(tmp_path):
    spec = load_spec(None)
    own = DecodePool(2, frozenset(spec.tiers), spec.default_tier)
    server = InProcessReceiver(tmp_path / "r.duckdb", decode_pool=own)
    try:
        assert server.post("/v1/traces", _json_traces(5), "application/json")[0] == 200
        os.kill(next(iter(own._pool._processes)), signal.SIGKILL)
        time.sleep(0.5)
        statuses = []
        body = _json_traces(8)  # the same 8 spans until one answer is 200, as an exporter
        for _ in range(20):
            status, headers, _ = server.post("/v1/traces", body, "application/json")
            statuses.append(status)
            if status == 200:
                break
            assert status == 503 and headers["Retry-After"], statuses
        assert statuses[-1] == 200 and own.restarts == 1, statuses
        assert server.rows("SELECT count(*) FROM requests") == [(8,)]  # ids 1..8: the first 5 again, deduplicated
    finally:
        server.close()
        own.close()


# What goes to the workers: JSON, and protobuf the fast path declines (here: an unknown field at the end).
OFFLOADED = [(_json_traces(2), "application/json"),
             (_proto_traces(2).SerializeToString() + b"\x98\x06\x01", "application/x-protobuf")]


@pytest.mark.parametrize("body,content_type", OFFLOADED)
def test_a_request_after_the_pool_closed_is_retryable(tmp_path, body, content_type):
    """While serve stops, a request still in flight gets 503 (the exporter resends it to the next serve)."""
    spec = load_spec(None)
    own = DecodePool(1, frozenset(spec.tiers), spec.default_tier)
    server = InProcessReceiver(tmp_path / "r.duckdb", decode_pool=own)
    try:
        own.close()
        status, headers, _ = server.post("/v1/traces", body, content_type)
        assert status == 503 and headers["Retry-After"]
        assert server.receiver.counts["traces_refused_full"] == 1
    finally:
        server.close()


def test_workers_end_when_serve_is_killed():
    code = ("import time; from sloscope.analytics.decode_pool import DecodePool; "
            "pool = DecodePool(2, frozenset({'standard'}), 'standard'); "
            "print(*pool._pool._processes, flush=True); time.sleep(60)")
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in server.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    server.kill()  # as the OOM killer would: no shutdown of the pool
    server.wait(10)
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
