"""A mix of OTLP/HTTP clients for soaking `sloscope serve`: keep-alive exporters that retry a 503 as exporters
do, clients sending malformed requests, and slow clients trickling their headers; and clients from an address of
their own that hold connections and calls: idle keep-alive connections, slow bodies, idle HTTP/2 connections and
gRPC calls that never send their message. Used by the soak test, the admission tests and
benchmarks/hostile_clients.py."""

import gzip
import http.client
import json
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from tests.alerting_stack import free_port, wait_listening
from tests.otlp_builders import span, traces
from tests.raw_http import RawClient, request

# How soon a good client beside an attack must be answered: one shut out waits for its 5 s timeout, or for the
# flood's connections to time out after 60 s; a loaded machine may take a second or two for a real answer.
ANSWERED_S = 4.0

T0 = 1_764_410_400_000_000_000
JSON = {"Content-Type": "application/json"}
MALFORMED = [
    b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n{}",
    b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n{}",
    b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    request("/v1/traces", gzip.compress(b'{"resourceSpans": []}' * 50)[:-9], {**JSON, "Content-Encoding": "gzip"}),
    request("/v1/traces", b"{not json", JSON),
    request("/v1/traces", b"\xff" * 300, {"Content-Type": "application/x-protobuf"}),
    request("/v1/traces", b"x" * 300_000, JSON),  # over the soak's 256 KiB body limit
    request("/v1/traces", gzip.compress(b"\0" * 8_000_000), {**JSON, "Content-Encoding": "gzip"}),  # a bomb
    b"POST /v1/traces HTTP/1.1\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n",  # a header line too long
]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


class ClientMix:
    def __init__(self, port: int):
        self.port = port
        self.stop = threading.Event()
        self.kept_spans = 0
        self.unanswered: list[str] = []
        self.misanswered: list[int] = []  # hostile requests answered other than 4xx
        self.latencies: list[float] = []  # seconds from a good request's first try to its 200
        self.hostile = 0
        self._lock = threading.Lock()
        self._next_id = 1

    def _ids(self, n: int) -> range:
        with self._lock:
            first, self._next_id = self._next_id, self._next_id + n
        return range(first, first + n)

    def good_client(self) -> None:
        """Keep-alive exporter: 20 spans a request; a 503 is retried as an exporter would."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            ids = self._ids(20)
            payload = json.dumps(traces([span(f"{i:032x}", f"{i:016x}", T0 + i, 30, tier=["standard"])
                                         for i in ids])).encode()
            began = time.monotonic()
            for _ in range(50):
                try:
                    conn.request("POST", "/v1/traces", payload, JSON)
                    reply = conn.getresponse()
                    reply.read()
                except (OSError, http.client.HTTPException):
                    conn.close()  # reconnects on the next request
                    time.sleep(0.1)
                    continue
                if reply.status == 200:
                    with self._lock:
                        self.kept_spans += len(ids)
                        self.latencies.append(time.monotonic() - began)
                    break
                if reply.status != 503:
                    self.unanswered.append(f"good request answered {reply.status}")
                    break
                time.sleep(0.2)
            else:
                self.unanswered.append("good request never accepted")
            time.sleep(0.05)
        conn.close()

    def start(self, good: int, malformed: int, slow: int) -> list[threading.Thread]:
        kinds = [self.good_client] * good + [self.malformed_client] * malformed + [self.slow_client] * slow
        threads = [threading.Thread(target=kind, daemon=True) for kind in kinds]
        for thread in threads:
            thread.start()
        return threads

    def malformed_client(self) -> None:
        rng = random.Random(7)
        while not self.stop.is_set():
            try:
                with RawClient(self.port, timeout=10) as c:
                    c.send(rng.choice(MALFORMED))
                    status = c.response()[0]
                    if not 400 <= status < 500:
                        self.misanswered.append(status)
            except (OSError, ConnectionError):
                pass  # refused by closing: also an answer
            self.hostile += 1
            time.sleep(0.05)

    def slow_client(self) -> None:
        """A header byte every 0.3 s, on a fresh connection each time the server cuts the last one off."""
        while not self.stop.is_set():
            try:
                with RawClient(self.port, timeout=10) as c:
                    c.trickle(request("/v1/traces", b"{}" * 100, JSON), every_s=0.3)
            except OSError:
                pass
            self.hostile += 1


@contextlib.contextmanager
def serving(db, *flags: str, grpc: str | None = None, env: dict | None = None):
    """A real `sloscope serve` on 127.0.0.1 (OTLP/HTTP; OTLP/gRPC too at `grpc`, a HOST:PORT), with its own
    database and no decode workers; yields its HTTP port once both listen."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db),
                             "--http", f"127.0.0.1:{port}", "--grpc", grpc or "off", "--decode-workers", "0",
                             "--log-level", "error", *flags], env={**os.environ, **(env or {})})
    try:
        wait_listening(port, proc, "sloscope serve")
        if grpc:
            wait_listening(int(grpc.rsplit(":", 1)[1]), proc, "sloscope serve's gRPC")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@contextlib.contextmanager
def webhook_serving(tmp, config: str, token: bytes):
    """A real `sloscope webhook` on 127.0.0.1 with `config` (remediation YAML) and `token`; yields its port."""
    cfg, token_file = tmp / "remediation.yaml", tmp / "token"
    cfg.write_text(config)
    token_file.write_text(token.decode())
    token_file.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "webhook", "--config", str(cfg), "--db",
                             str(tmp / "audit.duckdb"), "--token-file", str(token_file), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield int(re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+)/alerts\n", proc.stdout.readline())[1])
    finally:
        proc.terminate()
        proc.wait(10)


# --- clients from an address of their own ---------------------------------------------------------------------
# The whole of 127.0.0.0/8 is this host's: a client bound to 127.0.0.2 is another address to serve's per-client
# limits than one on 127.0.0.1, the address every client library connects from by default.

ATTACKER = "127.0.0.2"


def connect_from(source: str, port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


class RawClientFrom(RawClient):
    """tests/raw_http.py's client, connecting from `source`."""

    def __init__(self, source: str, port: int, timeout: float = 10.0):
        self.sock = connect_from(source, port, timeout)
        self.file = self.sock.makefile("rb")


def idle_keepalive(source: str, port: int, n: int, path: str = "/healthz") -> list[RawClientFrom]:
    """n connections that each GET `path` (open without a token) and then stay open, idle; those the server
    closes or refuses on the way are left out."""
    held = []
    for _ in range(n):
        try:
            client = RawClientFrom(source, port, timeout=5)
            client.send(request(path, b"", method="GET", length=False))
            client.response()
            held.append(client)
        except (OSError, ConnectionError):
            pass
    return held


def slow_bodies(source: str, port: int, n: int, headers: dict[str, str] | None = None) -> list[RawClientFrom]:
    """n requests that send their headers, declaring a body of 64 KiB, and one byte of it."""
    held = []
    for _ in range(n):
        try:
            client = RawClientFrom(source, port, timeout=5)
            client.send(b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n"
                        + b"".join(f"{k}: {v}\r\n".encode() for k, v in (headers or {}).items()) + b"\r\n{")
            held.append(client)
        except OSError:
            pass
    return held


# --- raw HTTP/2: gRPC connections and calls that never go on ---------------------------------------------------
# grpcio connects only from the default address, so the hostile side of gRPC is written by hand: the client
# preface, SETTINGS, and HEADERS frames of Export calls (HPACK literals) whose message never follows.

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_HEADERS, H2_SETTINGS = 0x1, 0x4
H2_END_HEADERS, H2_ACK = 0x4, 0x1
EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: str, value: str) -> bytes:
    """A header field without indexing, its name and value as plain strings (each under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


EXPORT_HEADERS = b"".join(_hpack_literal(k, v) for k, v in (
    (":method", "POST"), (":scheme", "http"), (":path", EXPORT_PATH), (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"), ("te", "trailers")))


def h2_connection(source: str, port: int) -> socket.socket | None:
    """An HTTP/2 connection through its preface and SETTINGS exchange, then idle; None where refused."""
    try:
        sock = connect_from(source, port, timeout=2)
        sock.sendall(H2_PREFACE + _h2_frame(H2_SETTINGS, 0, 0))
        if not sock.recv(4096):  # the server's SETTINGS; none: closed at once, past the connection cap
            sock.close()
            return None
        sock.sendall(_h2_frame(H2_SETTINGS, H2_ACK, 0))
        return sock
    except OSError:
        return None


def silent_calls(sock: socket.socket, n: int) -> None:
    """n Export calls on the connection that send their headers and never their message."""
    sock.sendall(b"".join(_h2_frame(H2_HEADERS, H2_END_HEADERS, 2 * i + 1, EXPORT_HEADERS) for i in range(n)))
