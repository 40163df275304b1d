"""The live demo's workload, three small programs (`python -m sloscope.live.workload service|backend|load`):

- service: an inference-like HTTP service instrumented with the OpenTelemetry SDK. Each POST is one SERVER
  span (http.route, http.request.header.x-slo-tier, http.response.status_code; resource service.name and
  host.name = the node) covering a CPU-bound model step, a cache read (O_DIRECT) and write (fsync), and a call
  over TCP to the backend (a new connection per request);
- backend: the service's dependency, a tiny TCP responder meant to run in its own network namespace;
- load: an open-loop load generator (arrivals do not wait for answers, so a slow service builds a queue as it
  would in production) over a pool of keep-alive connections, sending two tiers through the x-slo-tier header
  at a steady rate; SIGUSR1 starts a burst (rate x --burst-factor for --burst-seconds). It prints one JSON line
  of totals when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import mmap
import os
import random
import signal
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from sloscope.addresses import parse_address

ROUTE = "/v1/completions"
TIERS = ("p99-latency-critical", "standard")
READY = "load: ready"  # on stderr once SIGUSR1 (a burst) is handled
BACKEND_RESPONSE = (b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 2048\r\n\r\n"
                    + bytes(2048))


# --- the service -----------------------------------------------------------------------------------------

class Model:
    """The request's work: a model step that hashes `model_kib` KiB of the "weights", a file-backed mapping of
    `weights_mib` (CPU: a few ms, longer than a scheduler time slice, as a forward pass is; and memory: the
    weights are page cache, which the kernel takes back under memory pressure and the next step faults in
    from disk again); a cache read (`read_kib` at a random offset of a `store_mib` file, with O_DIRECT so it
    reaches the disk) and a cache write of `cache_kib` with fsync (disk); and one call to the backend
    (network)."""

    def __init__(self, cache_dir: Path, backend: tuple[str, int], model_kib: int, cache_kib: int,
                 backend_timeout_s: float, weights_mib: int = 384, read_kib: int = 64, store_mib: int = 64,
                 cache_files: int = 32):
        self.cache_dir = cache_dir
        self.backend = backend
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.model_bytes = model_kib * 1024
        self.weights = self._weights(cache_dir / "weights.bin", max(weights_mib * 2**20, 2 * self.model_bytes))
        self.windows = (len(self.weights) - self.model_bytes) // 65536
        self.payload = os.urandom(cache_kib * 1024)
        self.backend_timeout_s = backend_timeout_s
        self.cache_files = cache_files
        self.read_bytes = read_kib * 1024
        self._next = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self.store = cache_dir / "store.bin"
        self._fill(self.store, store_mib * 2**20)
        self.store_blocks = store_mib * 2**20 // self.read_bytes
        self.direct = hasattr(os, "O_DIRECT")
        try:
            os.close(os.open(self.store, os.O_RDONLY | getattr(os, "O_DIRECT", 0)))
        except OSError:  # a filesystem without O_DIRECT (tmpfs): buffered reads
            self.direct = False

    @staticmethod
    def _fill(path: Path, size: int) -> None:
        chunk = os.urandom(2**20)
        with open(path, "wb") as f:
            for _ in range(size // 2**20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())

    def _weights(self, path: Path, size: int) -> mmap.mmap:
        self._fill(path, size)
        with open(path, "rb") as f:
            weights = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # Random access, as a model's weight and embedding reads are: no readahead, so a page the kernel took
        # back costs its own read when it is touched again.
        weights.madvise(mmap.MADV_RANDOM)
        return weights

    def step(self) -> None:
        offset = random.randrange(self.windows) * 65536
        digest = hashlib.sha256(memoryview(self.weights)[offset:offset + self.model_bytes])  # GIL released
        self._read_cache()
        self._write_cache(digest.digest())
        self._call_backend()

    def _read_cache(self) -> None:
        buf = getattr(self._local, "buf", None)
        if buf is None:  # O_DIRECT wants an aligned buffer: an anonymous mapping is page-aligned
            buf = self._local.buf = mmap.mmap(-1, self.read_bytes)
        fd = os.open(self.store, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
        try:
            os.preadv(fd, [buf], random.randrange(self.store_blocks) * self.read_bytes)
        finally:
            os.close(fd)

    def _write_cache(self, key: bytes) -> None:
        with self._lock:
            n = self._next = (self._next + 1) % self.cache_files
        fd = os.open(self.cache_dir / f"kv-{n:03d}.bin", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, key + self.payload, 0)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _call_backend(self) -> None:
        with socket.create_connection(self.backend, timeout=self.backend_timeout_s) as conn:
            conn.sendall(b"GET /features HTTP/1.0\r\nHost: backend\r\n\r\n")
            received = 0
            while chunk := conn.recv(65536):  # to the end: the backend closes first (its side keeps TIME_WAIT)
                received += len(chunk)
        if received < len(BACKEND_RESPONSE):
            raise ConnectionError(f"short answer from the backend ({received} bytes)")


def _tracer(node: str, service_name: str, otlp_endpoint: str):
    provider = TracerProvider(resource=Resource.create({"service.name": service_name, "host.name": node}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=otlp_endpoint.rstrip("/") + "/v1/traces", timeout=10),
        max_queue_size=20_000, schedule_delay_millis=1000, max_export_batch_size=2048))
    return provider


def run_service(args) -> int:
    provider = _tracer(args.node, args.service_name, args.otlp)
    tracer = provider.get_tracer("sloscope.live.service")
    model = Model(Path(args.cache_dir), parse_address(args.backend, "--backend"), args.model_kib, args.cache_kib,
                  args.backend_timeout, args.weights_mib)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # persistent connections, as a client's pool or a sidecar keeps them

        def log_message(self, fmt, *a):
            pass

        def do_POST(self):  # noqa: N802 - http.server's naming
            tier = self.headers.get("x-slo-tier")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            attributes = {"http.request.method": "POST", "http.route": ROUTE, "url.path": self.path}
            if tier is not None:
                attributes["http.request.header.x-slo-tier"] = [tier]
            with tracer.start_as_current_span(f"POST {ROUTE}", kind=SpanKind.SERVER, attributes=attributes) as span:
                status = 200
                try:
                    model.step()
                except OSError as exc:
                    status = 502
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute("http.response.status_code", status)
                body = b'{"choices": [{"text": "ok"}]}' if status == 200 else b'{"error": "backend"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    server = Server(parse_address(args.listen, "--listen"), Handler)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"service listening on {args.listen}", file=sys.stderr, flush=True)
    stop.wait()
    server.shutdown()
    provider.shutdown()  # exports what is queued
    return 0


# --- the backend -----------------------------------------------------------------------------------------

class _BackendHandler(socketserver.StreamRequestHandler):
    def handle(self):
        try:
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            self.wfile.write(BACKEND_RESPONSE)
        except OSError:
            pass


class _BackendServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def run_backend(args) -> int:
    server = _BackendServer(parse_address(args.listen, "--listen"), _BackendHandler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"backend listening on {args.listen}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


# --- the load generator ----------------------------------------------------------------------------------

class Load:
    def __init__(self, target: tuple[str, int], rate: float, critical_share: float, burst_factor: float,
                 burst_seconds: float, timeout_s: float, max_in_flight: int, seed: int):
        self.target = target
        self.rate = rate
        self.critical_share = critical_share
        self.burst_factor = burst_factor
        self.burst_seconds = burst_seconds
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self.rng = random.Random(seed)
        self.burst_until = 0.0
        self.counts = {"sent": 0, "ok": 0, "failed": 0, "dropped": 0, "bursts": 0}
        self.in_flight = 0
        self.idle: list = []  # keep-alive connections not in use

    def burst(self) -> None:
        self.burst_until = time.monotonic() + self.burst_seconds
        self.counts["bursts"] += 1

    async def one(self, tier: str) -> None:
        """One request on a pooled keep-alive connection (a new one when none is idle)."""
        self.in_flight += 1
        try:
            for attempt in (1, 2):
                reused = bool(self.idle)
                reader, writer = self.idle.pop() if reused else await asyncio.wait_for(
                    asyncio.open_connection(*self.target), self.timeout_s)
                try:
                    status = await asyncio.wait_for(self._exchange(reader, writer, tier), self.timeout_s)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                    writer.close()
                    if reused and attempt == 1:  # the server may have closed an idle connection: once more
                        continue
                    raise
                self.idle.append((reader, writer))
                self.counts["ok" if status == 200 else "failed"] += 1
                return
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            self.counts["failed"] += 1
        finally:
            self.in_flight -= 1

    @staticmethod
    async def _exchange(reader, writer, tier: str) -> int:
        writer.write(f"POST {ROUTE} HTTP/1.1\r\nHost: inference\r\nx-slo-tier: {tier}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("connection closed")
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        return int(status_line.split()[1])

    async def run(self, stop: asyncio.Event) -> None:
        tasks = set()
        next_at = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            rate = self.rate * (self.burst_factor if now < self.burst_until else 1.0)
            next_at += self.rng.expovariate(rate)
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except asyncio.TimeoutError:
                    pass
            else:
                next_at = max(next_at, time.monotonic() - 1.0)  # never fire a long backlog at once
            if self.in_flight >= self.max_in_flight:
                self.counts["dropped"] += 1
                continue
            tier = TIERS[0] if self.rng.random() < self.critical_share else TIERS[1]
            self.counts["sent"] += 1
            task = asyncio.create_task(self.one(tier))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=self.timeout_s)


def run_load(args) -> int:
    load = Load(parse_address(args.target, "--target"), args.rate, args.critical_share, args.burst_factor,
                args.burst_seconds, args.timeout, args.max_in_flight, args.seed)

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, load.burst)
        print(READY, file=sys.stderr, flush=True)  # SIGUSR1 before this line would have killed the process
        if args.duration:
            loop.call_later(args.duration, stop.set)
        await load.run(stop)

    asyncio.run(main())
    print(json.dumps(load.counts), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sloscope.live.workload")
    sub = parser.add_subparsers(dest="program", required=True)
    service = sub.add_parser("service")
    service.add_argument("--listen", default="127.0.0.1:8080")
    service.add_argument("--backend", default="10.200.0.2:8081")
    service.add_argument("--cache-dir", default="var/demo-live/cache")
    service.add_argument("--otlp", default="http://127.0.0.1:4318", help="OTLP/HTTP base URL")
    service.add_argument("--node", default=socket.gethostname())
    service.add_argument("--service-name", default="llm-inference")
    service.add_argument("--model-kib", type=int, default=6144, help="KiB hashed per request (the model step)")
    service.add_argument("--cache-kib", type=int, default=16, help="KiB written and fsynced per request")
    service.add_argument("--weights-mib", type=int, default=384, help="size of the mapped weights file")
    service.add_argument("--backend-timeout", type=float, default=5.0)
    service.set_defaults(func=run_service)
    backend = sub.add_parser("backend")
    backend.add_argument("--listen", default="10.200.0.2:8081")
    backend.set_defaults(func=run_backend)
    load = sub.add_parser("load")
    load.add_argument("--target", default="127.0.0.1:8080")
    load.add_argument("--rate", type=float, default=10.0, help="steady requests per second (both tiers)")
    load.add_argument("--critical-share", type=float, default=0.5)
    load.add_argument("--burst-factor", type=float, default=10.0)
    load.add_argument("--burst-seconds", type=float, default=5.0)
    load.add_argument("--timeout", type=float, default=15.0)
    load.add_argument("--max-in-flight", type=int, default=400)
    load.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: on SIGTERM)")
    load.add_argument("--seed", type=int, default=1)
    load.set_defaults(func=run_load)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
