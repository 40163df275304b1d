"""Acknowledged means durable: `sloscope serve` killed with SIGKILL at random moments under concurrent clients,
then restarted on the same database, which replays its intake log (the default, --ack log). Every request
answered 200 is stored exactly once; resent requests (the clients retry every request not answered 200, and
resend some that were) add nothing."""

import http.client
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sloscope.analytics.frames import Frames

from sloscope.analytics.store import Store
from sloscope.analytics.writer import COMMITTED, Writer, frame_bytes
from sloscope.receiver.server import fast_decode
from sloscope.enrich.tiers import TierResolver, resolve_tiers
from sloscope.slo_spec import load_spec
from tests.alerting_stack import free_port, wait_listening
from tests.otlp_builders import SPAN_ID, TRACE_ID, gauge, metrics

SLOSCOPE = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sloscope")
T0 = 1_764_410_400_000_000_000
SPANS_PER_REQUEST = 50


def _traces(client: int, seq: int) -> bytes:
    """Protobuf spans with ids unique to (client, seq, k), so that what is stored says which request it was."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "llm-gateway"
    rs.resource.attributes.add(key="host.name").value.string_value = f"node-{client}"
    spans = rs.scope_spans.add().spans
    for k in range(SPANS_PER_REQUEST):
        start = T0 + (seq * SPANS_PER_REQUEST + k) * 1_000_000
        span = spans.add(trace_id=bytes.fromhex(f"{client:08x}{seq:08x}{k:016x}"),
                         span_id=bytes.fromhex(f"{k + 1:016x}"), name="POST /v1/chat/completions",
                         kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start, end_time_unix_nano=start + 5_000_000)
        span.attributes.add(key="http.response.status_code").value.int_value = 200
    return request.SerializeToString()


def _spans(seq: int) -> Frames:
    """The frames of _traces(1, seq) as the intake hands them to the writer."""
    batch, _ = fast_decode("traces", _traces(1, seq), False)
    resolve_tiers(batch.spans, TierResolver.from_spec(load_spec(None)))
    return Frames.of(batch)


def _gauges(client: int, seq: int) -> bytes:
    points = [(T0 + (seq * 10 + k) * 10**9, float(k)) for k in range(10)]
    return json.dumps(metrics([gauge("hw.gpu.temperature", points, {"hw.id": f"GPU-{client}"})],
                              node=f"node-{client}")).encode()


class Serve:
    """`sloscope serve` on one database and port, restartable; in its own process group with its workers."""

    def __init__(self, db: Path, port: int, log: Path | None = None):
        self.db, self.port, self.proc = db, port, None
        self.log = log or db.with_suffix(".log")

    def start(self) -> None:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([SLOSCOPE, "serve", "--db", str(self.db), "--http", f"127.0.0.1:{self.port}",
                                          "--grpc", "off", "--decode-workers", "0"], stdout=log, stderr=log,
                                         start_new_session=True)
        wait_listening(self.port, self.proc, "sloscope serve")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def _post(port: int, path: str, body: bytes, content_type: str) -> int | None:
    """The HTTP status, or None when serve was not there to answer (killed, restarting)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", path, body, {"Content-Type": content_type})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):  # killed mid-answer: an answer not read counts as none
        return None
    finally:
        conn.close()


class Client(threading.Thread):
    """Sends its requests in turn, each until it is answered 200; resends every fifth one once after that."""

    def __init__(self, index: int, port: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.index, self.port, self.stop_sending = index, port, stop
        self.acked: list[tuple[str, int]] = []  # (signal, seq) answered 200
        self.unexpected: list[int] = []

    def run(self) -> None:
        seq = 0
        while not self.stop_sending.is_set():
            kind = "traces" if seq % 3 else "metrics"
            body, content_type = ((_traces(self.index, seq), "application/x-protobuf") if kind == "traces"
                                  else (_gauges(self.index, seq), "application/json"))
            if self._until_accepted(f"/v1/{kind}", body, content_type):
                self.acked.append((kind, seq))
                if seq % 5 == 0:
                    self._until_accepted(f"/v1/{kind}", body, content_type)
            seq += 1

    def _until_accepted(self, path: str, body: bytes, content_type: str) -> bool:
        while not self.stop_sending.is_set():
            status = _post(self.port, path, body, content_type)
            if status == 200:
                return True
            if status not in (None, 503):
                self.unexpected.append(status)
                return False
            time.sleep(0.05)
        return False


def _answered(clients: list[Client]) -> int:
    return sum(len(c.acked) for c in clients)


@pytest.mark.slow
def test_every_acknowledged_request_survives_sigkill_exactly_once(tmp_path):
    rng = random.Random(7)
    serve, stop = Serve(tmp_path / "d.duckdb", free_port()), threading.Event()
    serve.start()
    clients = [Client(i, serve.port, stop) for i in range(4)]
    for c in clients:
        c.start()
    try:
        for _ in range(3):  # each time after some requests were answered, at a random moment after that
            answered = _answered(clients)
            deadline = time.monotonic() + 60
            while _answered(clients) < answered + 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.5))
            serve.kill()
            serve.start()
        time.sleep(1.0)
    finally:
        stop.set()
        for c in clients:
            c.join(30)
        assert serve.stop() == 0, serve.log.read_text()[-3000:]
    acked_spans = {(f"{c.index:08x}{seq:08x}{k:016x}", f"{k + 1:016x}") for c in clients
                   for kind, seq in c.acked if kind == "traces" for k in range(SPANS_PER_REQUEST)}
    acked_points = {(f"node-{c.index}", T0 // 1000 + (seq * 10 + k) * 10**6) for c in clients
                    for kind, seq in c.acked if kind == "metrics" for k in range(10)}
    with Store(serve.db, read_only=True) as store:
        stored_spans = store.rows(f"SELECT {TRACE_ID}, {SPAN_ID} FROM requests")
        stored_points = store.rows("SELECT node, epoch_us(ts) FROM samples")
        counters = store.counters()
    assert not [s for c in clients for s in c.unexpected]
    assert _answered(clients) >= 12 and acked_spans and acked_points  # enough went through to mean something
    assert acked_spans <= set(stored_spans) and acked_points <= set(stored_points)
    assert len(stored_spans) == len(set(stored_spans)) and len(stored_points) == len(set(stored_points))
    # The counters are committed with their rows: a crash between the two cannot make them disagree.
    assert (counters["requests_loaded"], counters["samples_loaded"]) == (len(stored_spans), len(stored_points))


def test_the_writer_queue_is_bounded_in_bytes(tmp_path):
    with Store(tmp_path / "b.duckdb") as store:
        frames = _spans(0)
        writer = Writer(store, max_queued_bytes=frame_bytes(frames) + 1)  # not started: everything stays queued
        first = writer.offer(frames, {})
        assert first is not None and writer.offer(_spans(1), {}) is None
        assert writer.stats()["queued_bytes"] == frame_bytes(frames) > 0
        writer.start()
        assert first.wait(10).outcome == COMMITTED and writer.stats()["queued_bytes"] == 0
        assert writer.offer(_spans(1), {}).wait(10).outcome == COMMITTED
        writer.stop()
