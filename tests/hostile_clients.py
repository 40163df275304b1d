"""A mix of OTLP/HTTP clients for soaking `sloscope serve`: keep-alive exporters that retry a 503 as exporters
do, clients sending malformed requests, and slow clients trickling their headers. Used by the soak test and
benchmarks/hostile_clients.py."""

import gzip
import http.client
import json
import random
import threading
import time

from tests.otlp_builders import span, traces
from tests.raw_http import RawClient, request

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
