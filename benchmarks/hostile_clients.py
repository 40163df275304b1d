"""What hostile clients cost the good ones: `sloscope serve`'s accepted spans per second and request latency for
keep-alive exporters alone (the baseline, measured in the same run), then beside clients sending malformed
requests and slow clients trickling their headers; and serve's resident memory in each.

Then fair admission, at the default limits: good clients at 127.0.0.1 alone, then beside an attack from 127.0.0.2
held for the rest of the phase, on the same serve (or webhook): 530 idle keep-alive connections (with a bearer
token set: GET /healthz needs none), 530 slow bodies, 80 gRPC calls that never send their message, 2,000 idle
HTTP/2 connections, and 70 idle connections to the webhook. Each good request is its own connection (a new
one is what a flood shuts out), but gRPC's, which keep one channel as exporters do; each has a 2 s timeout.

    .venv/bin/python benchmarks/hostile_clients.py [--seconds 20] [--good 2] [--malformed 1] [--slow 6]
        [--attack-seconds 10]

Each phase runs a fresh serve (its own database, --decode-workers 0), so one cannot warm the other; the
mix's limits are the soak test's (2 s deadlines, 256 KiB bodies, 32 connections).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.alerting_stack import free_port, wait_listening  # noqa: E402
from tests.alerts.test_webhook import CONFIG, TOKEN, payload  # noqa: E402
from tests.hostile_clients import (ATTACKER, ClientMix, h2_connection, idle_keepalive, rss_bytes,  # noqa: E402
                                   serving, silent_calls, slow_bodies, webhook_serving)
from tests.otlp_builders import span, traces  # noqa: E402
from tests.raw_http import RawClient, request  # noqa: E402

LIMITS = ["--read-header-timeout", "2", "--read-timeout", "2", "--max-request-body-size", "256KiB",
          "--max-connections", "32"]


def phase(db: Path, seconds: float, good: int, malformed: int, slow: int) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), "--grpc", "off",
                             "--http", f"127.0.0.1:{port}", "--decode-workers", "0", "--log-level", "error",
                             *LIMITS])
    try:
        wait_listening(port, proc, "sloscope serve")
        mix = ClientMix(port)
        threads = mix.start(good, malformed, slow)
        rss, started = [], time.monotonic()
        while time.monotonic() - started < seconds:
            rss.append(rss_bytes(proc.pid))
            time.sleep(0.5)
        mix.stop.set()
        elapsed = time.monotonic() - started
        for thread in threads:
            thread.join(30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    latencies = sorted(mix.latencies) or [float("nan")]
    return {"spans_per_s": mix.kept_spans / elapsed, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "hostile": mix.hostile, "failed_good": len(mix.unanswered), "rss_mib": max(rss) / 2**20}


BEARER = "a-token-of-sixteen-or-more"
TIMEOUT_S = 2.0  # a good request slower than this counts as failed
GOOD_CLIENTS = 4


class GoodClients:
    """Good clients at 127.0.0.1, each in a loop until `stop`: (ok, seconds) per request in `results`."""

    def __init__(self, one_request, n: int = GOOD_CLIENTS):
        self.one_request, self.results, self.stop = one_request, [], threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                ok = self.one_request()
            except (OSError, ConnectionError, grpc.RpcError):
                ok = False
            self.results.append((ok and time.monotonic() - began <= TIMEOUT_S, time.monotonic() - began))
            time.sleep(0.05)

    def run_for(self, seconds: float) -> dict:
        """Success rate and p99 of the requests made in the next `seconds`."""
        first = len(self.results)
        time.sleep(seconds)
        taken = self.results[first:]
        latencies = sorted(s for _, s in taken) or [float("nan")]
        return {"n": len(taken), "ok": sum(ok for ok, _ in taken) / max(1, len(taken)),
                "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def _raw_post(port: int, path: str, body: bytes, headers: dict) -> bool:
    with RawClient(port, timeout=TIMEOUT_S) as client:
        client.send(request(path, body, headers))
        return client.response()[0] == 200


def _otlp_body() -> bytes:
    return json.dumps(traces([span(f"{i:032x}", f"{i:016x}", 1_764_410_400_000_000_000 + i, 30,
                                   tier=["standard"]) for i in range(1, 21)])).encode()


def _http_good(port: int, token: str | None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    return lambda: _raw_post(port, "/v1/traces", _otlp_body(), headers)


def _grpc_good(target: str):
    channel = grpc.insecure_channel(target)
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    body = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[]).SerializeToString()
    return lambda: export(body, timeout=TIMEOUT_S) is not None


def _webhook_good(port: int):
    headers = {"Authorization": f"Bearer {TOKEN.decode()}", "Content-Type": "application/json"}
    return lambda: _raw_post(port, "/alerts", json.dumps(payload()).encode(), headers)


def _h2_flood(port: int, n: int) -> list:
    return [sock for sock in (h2_connection(ATTACKER, port) for _ in range(n)) if sock is not None]


def _silent_grpc(port: int, n: int) -> list:
    socks = [h2_connection(ATTACKER, port) for _ in range(n // 16)]  # 16 calls a connection, gRPC's stream cap
    for sock in socks:
        silent_calls(sock, 16)
    return socks


def _attack(good: GoodClients, hold, seconds: float) -> tuple[dict, dict]:
    """The good clients alone for a third of `seconds`, then beside what `hold()` opens and holds."""
    for thread in good.threads:
        thread.start()
    try:
        alone = good.run_for(seconds / 3)
        held = hold()
        try:
            return alone, good.run_for(seconds)
        finally:
            for client in held:
                client.close()
    finally:
        good.stop.set()
        for thread in good.threads:
            thread.join(TIMEOUT_S * 2)


def _serve_attacks(tmp: Path, seconds: float) -> dict:
    found = {}
    with serving(tmp / "idle.duckdb", env={"SLOSCOPE_BEARER_TOKEN": BEARER}) as port:
        found["idle keep-alive x530"] = _attack(GoodClients(_http_good(port, BEARER)),
                                                lambda: idle_keepalive(ATTACKER, port, 530), seconds)
    with serving(tmp / "slow.duckdb") as port:
        found["slow bodies x530"] = _attack(GoodClients(_http_good(port, None)),
                                            lambda: slow_bodies(ATTACKER, port, 530), seconds)
    for name, hold, n in (("gRPC silent calls x80", _silent_grpc, 80), ("idle HTTP/2 x2000", _h2_flood, 2000)):
        grpc_port = free_port()
        with serving(tmp / f"{n}.duckdb", grpc=f"127.0.0.1:{grpc_port}"):
            found[name] = _attack(GoodClients(_grpc_good(f"127.0.0.1:{grpc_port}")),
                                  lambda: hold(grpc_port, n), seconds)
    with webhook_serving(tmp, CONFIG.replace("execute: true", "execute: false"), TOKEN) as port:
        found["webhook idle x70"] = _attack(GoodClients(_webhook_good(port), n=2),
                                            lambda: idle_keepalive(ATTACKER, port, 70, path="/-/healthy"), seconds)
    return found


def attacks_table(seconds: float) -> bool:
    """Prints each attack's table row; True where every one kept >= 0.9 of the alone success rate and p99 < 1 s."""
    with tempfile.TemporaryDirectory() as tmp:
        found = _serve_attacks(Path(tmp), seconds)
    print(f"\n{'attack (from 127.0.0.2)':24} {'alone: ok':>10} {'p99 ms':>8} {'attacked: ok':>13} {'p99 ms':>8} "
          f"{'requests':>9} {'ok ratio':>9}")
    fair = True
    for name, (alone, attacked) in found.items():
        ratio = attacked["ok"] / alone["ok"] if alone["ok"] else float("nan")
        fair &= ratio >= 0.9 and attacked["p99_ms"] < 1000
        print(f"{name:24} {alone['ok']:>10.3f} {alone['p99_ms']:>8.1f} {attacked['ok']:>13.3f} "
              f"{attacked['p99_ms']:>8.1f} {attacked['n']:>9} {ratio:>9.2f}")
    return fair


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--good", type=int, default=2)
    parser.add_argument("--malformed", type=int, default=1)
    parser.add_argument("--slow", type=int, default=6)
    parser.add_argument("--attack-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        alone = phase(Path(tmp) / "alone.duckdb", args.seconds, args.good, 0, 0)
        mixed = phase(Path(tmp) / "mixed.duckdb", args.seconds, args.good, args.malformed, args.slow)
    for name, result in (("good clients alone (baseline)", alone), ("beside hostile clients", mixed)):
        print(f"{name:32} {result['spans_per_s']:8.0f} spans/s  p50 {result['p50_ms']:6.1f} ms  "
              f"p99 {result['p99_ms']:6.1f} ms  max RSS {result['rss_mib']:6.1f} MiB  "
              f"hostile requests {result['hostile']}  good requests failed {result['failed_good']}")
    print(f"ratio beside hostile / alone: throughput {mixed['spans_per_s'] / alone['spans_per_s']:.2f}, "
          f"p99 latency {mixed['p99_ms'] / alone['p99_ms']:.2f}, max RSS {mixed['rss_mib'] / alone['rss_mib']:.2f}")
    fair = attacks_table(args.attack_seconds)
    return 0 if not mixed["failed_good"] and not alone["failed_good"] and fair else 1


if __name__ == "__main__":
    sys.exit(main())
