"""The sender against an endpoint that trickles its answer: an OTLP/HTTP attempt has the exporter's timeout in all
(a socket timeout starts again with every byte), the batch it was cut short for waits in the spool like after any
retryable failure, and reaches a healthy receiver on the same address once there is one."""

import itertools
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.collectors.otlp_answers import RETRY
from sloscope.collectors.otlp_http import HttpExporter
from sloscope.collectors.shipper import Shipper
from sloscope.collectors.spool import Spool
from tests.collectors.test_collector import wait_for
from tests.collectors.test_shipper import gauge_batch, tag_of_request

DEADLINE_S = 1.5  # the exporter's timeout: the whole attempt's
SLACK_S = 0.5
TRICKLE_EVERY_S = 0.5
TRICKLE_FOR_S = DEADLINE_S + 4  # well past the deadline: without one, an attempt lasts this long
GIVE_UP_S = 60  # the trickling endpoint's own bound, should a test fail before it is stopped

# Where the answer slows down: what is sent at once, then what is sent a byte at a time, its last byte repeated
# (a reason phrase, a header value, a body that never come to an end in time).
PHASES = {
    "status line": (b"", b"HTTP/1.1 200 OK"),
    "headers": (b"HTTP/1.1 200 OK\r\n", b"Server: trickle"),
    "body": (b"HTTP/1.1 503 Busy\r\nContent-Length: 100000\r\n\r\n", b"x"),
}


def read_request(conn: socket.socket) -> None:
    """Read one request whole: its headers, then a body of its Content-Length (at most 1 MiB in all)."""
    data = b""
    while len(data) < 2**20 and not _whole(data):
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


def _whole(data: bytes) -> bool:
    head, found, body = data.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    return bool(found) and len(body) >= sum(lengths)


class TricklingEndpoint:
    """On 127.0.0.1: takes each request whole, then answers part of it at once and the rest a byte every
    TRICKLE_EVERY_S, for at most TRICKLE_FOR_S or until stopped."""

    def __init__(self, at_once: bytes, trickled: bytes):
        self.at_once, self.trickled = at_once, trickled
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        gives_up = time.monotonic() + GIVE_UP_S
        while not self.stopping.is_set() and time.monotonic() < gives_up:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(TRICKLE_FOR_S)
        answer = itertools.chain(self.trickled, itertools.repeat(self.trickled[-1]))
        ends = time.monotonic() + TRICKLE_FOR_S
        try:
            read_request(conn)
            conn.sendall(self.at_once)
            while time.monotonic() < ends and not self.stopping.is_set():
                conn.sendall(bytes([next(answer)]))
                time.sleep(TRICKLE_EVERY_S)
        except OSError:  # the client went
            pass

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(TRICKLE_EVERY_S + 5)
        self.listener.close()


class RecordingReceiver(ThreadingHTTPServer):
    """A plain HTTP server on 127.0.0.1 that takes every request (200) and keeps its path and body."""

    def __init__(self, port: int):
        self.requests: list[tuple[str, bytes]] = []
        super().__init__(("127.0.0.1", port), _Recording)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def __exit__(self, *exc):
        self.shutdown()
        super().__exit__(*exc)


class _Recording(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class TimedExporter:
    """An exporter whose attempts are timed: (seconds, answer) each."""

    def __init__(self, exporter):
        self.exporter = exporter
        self.attempts = []

    def send(self, body):
        began = time.monotonic()
        answer = self.exporter.send(body)
        self.attempts.append((time.monotonic() - began, answer))
        return answer

    def shutdown(self):
        self.exporter.shutdown()


@pytest.mark.parametrize("phase", PHASES)
def test_an_attempt_answered_a_byte_at_a_time_ends_at_its_deadline_and_the_batch_is_delivered_later(tmp_path,
                                                                                                    phase):
    trickling = TricklingEndpoint(*PHASES[phase])
    endpoint = f"http://127.0.0.1:{trickling.port}/v1/metrics"
    exporter = TimedExporter(HttpExporter(endpoint, {}, timeout_s=DEADLINE_S))
    shipper = Shipper(exporter, Spool(str(tmp_path)), timeout_s=DEADLINE_S, retry_initial_s=0.05, retry_max_s=0.1)
    shipper.start()
    try:
        shipper.submit(gauge_batch(1.0))
        assert wait_for(lambda: exporter.attempts, timeout=TRICKLE_FOR_S + 5)
        assert wait_for(lambda: len(shipper.spool) == 1)  # kept, as after any retryable failure
        trickling.stop()  # ends an attempt in flight at once: no longer a measure of the deadline
        took, answer = exporter.attempts[0]
        assert DEADLINE_S <= took <= DEADLINE_S + SLACK_S, f"the trickled attempt took {took:.2f} s"
        assert answer.outcome == RETRY
        with RecordingReceiver(trickling.port) as healthy:
            assert wait_for(lambda: healthy.requests and not shipper.spool)
        assert [(path, tag_of_request(ExportMetricsServiceRequest.FromString(body)))
                for path, body in healthy.requests] == [("/v1/metrics", 1.0)]
        assert shipper.spool.dropped_batches == 0 and shipper.stats.replayed_batches == 1
        assert all(took <= DEADLINE_S + SLACK_S for took, _answer in exporter.attempts)
    finally:
        shipper.close(1)
        trickling.stop()
