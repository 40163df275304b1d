"""OTLP/HTTP ingest throughput of `sloscope serve`, from request to committed rows.

Sends protobuf ExportTraceServiceRequest and ExportMetricsServiceRequest payloads over loopback from
concurrent client threads to a real `sloscope serve` process, then stops it with SIGTERM (which returns once
every accepted row is committed) and counts the rows. The baseline, measured in the same run on the same
payloads, is the bare protobuf parse rate (ParseFromString alone, one core).

    .venv/bin/python benchmarks/ingest_throughput.py [--spans 1000000] [--points 300000] [--per-request 1000]

Spans are sent with acknowledgements from the fsynced intake log (the default, `--ack log`), from the DuckDB
commit (`--ack commit`), and with `--ack queued` (a 200 once they are queued in memory, not durable) as the
baseline of what durability costs. The host's speed drifts within a run, so this is done in rounds: each round
measures the bare parse just before and just after its three modes (each round starting with the next mode),
each mode is taken against that round's baseline and `--ack queued`, and the medians over the rounds are
printed. Then the acknowledgement latency (p50, p99) of each mode at half its own rate, with an open-loop client.

For spans it also measures, in this process on the same payloads, the stages alone: the fast path and the
general decoder from bytes to frames, and the store writing those rows. Metric points are also measured with
`--decode-workers 0` (every request decoded in the server process).

With --graph it measures instead what keeping every span costs (docs/traces.md): traces of 5 to 10 spans of
mixed kinds (an entry SERVER span, CLIENT calls with the SERVER spans they reach, INTERNAL spans), against the
same number of SERVER spans alone (the shape of a fleet whose services send requests only), in alternating rounds
through `sloscope serve --ack log`: spans/s of each, their ratio, and the bytes the store's file takes per span.

    .venv/bin/python benchmarks/ingest_throughput.py --graph [--spans 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import duckdb
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.alerting_stack import free_port, wait_listening  # noqa: E402

T0 = 1_764_410_400_000_000_000
ACK_MODES = {"log": " (default)", "commit": "", "queued": " (not durable)"}


def _kv(key, value):
    kv = KeyValue(key=key)
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value
    return kv


def trace_payloads(total: int, per_request: int) -> list[bytes]:
    rng = random.Random(1)
    payloads, n = [], 0
    while n < total:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([_kv("service.name", "llm-gateway"), _kv("host.name", f"gpu-node-{n % 16}"),
                                       _kv("k8s.pod.name", "llm-gateway-7f9c"), _kv("k8s.namespace.name", "inference")])
        spans = rs.scope_spans.add().spans
        for _ in range(min(per_request, total - n)):
            n += 1
            start = T0 + n * 1000
            span = spans.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), name="POST /v1/chat/completions",
                             kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start,
                             end_time_unix_nano=start + rng.randint(50, 900) * 1_000_000)
            span.attributes.extend([_kv("http.request.method", "POST"), _kv("http.route", "/v1/chat/completions"),
                                    _kv("http.response.status_code", 200), _kv("url.scheme", "http"),
                                    _kv("http.request.header.x-slo-tier", rng.choice(["standard", "p99-latency-critical"]))])
        payloads.append(req.SerializeToString())
    return payloads


def metric_payloads(total: int, per_request: int) -> list[bytes]:
    payloads, n = [], 0
    while n < total:
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        rm.resource.attributes.extend([_kv("host.name", f"gpu-node-{n % 16}"), _kv("service.name", "sloscope-collector")])
        metric = rm.scope_metrics.add().metrics.add(name="hw.gpu.utilization", unit="1")
        for _ in range(min(per_request, total - n)):
            n += 1
            p = metric.gauge.data_points.add(time_unix_nano=T0 + n * 1_000_000, as_double=(n % 100) / 100)
            p.attributes.extend([_kv("hw.id", f"GPU-{n % 8}"), _kv("hw.gpu.task", "general")])
        payloads.append(req.SerializeToString())
    return payloads


def bare_parse_rate(payloads: list[bytes], message_type, items: int) -> float:
    started = time.perf_counter()
    for body in payloads:
        message_type().ParseFromString(body)
    return items / (time.perf_counter() - started)


def stage_rates(payloads: list[bytes], items: int, workdir: Path) -> dict[str, float]:
    """Spans per second of each stage alone, on one core: fast path and general decoder from bytes to frames
    (tiers resolved), and the store writing those frames in the writer's batches."""
    from sloscope.analytics.frames import Frames
    from sloscope.analytics.store import Store
    from sloscope.receiver import otlp_spans
    from sloscope.receiver.server import Decoders, fast_decode
    from sloscope.enrich.tiers import TierResolver, resolve_tiers

    def frames_by(decode) -> tuple[float, list]:
        resolver, out = TierResolver(frozenset({"standard", "p99-latency-critical"}), "standard"), []
        started = time.perf_counter()
        for body in payloads:
            batch, _ = decode(body)
            resolve_tiers(batch.spans, resolver)
            out.append(Frames.of(batch))
        return items / (time.perf_counter() - started), out

    general_decoders = Decoders()
    general, frames = frames_by(lambda body: general_decoders.decode("traces", body, False))
    rates = {"general decoder, bytes to frames": general}
    if otlp_spans.available():  # as the receiver does: the general decoder for what the fast path declines
        rates["fast path, bytes to frames"], frames = frames_by(
            lambda body: fast_decode("traces", body, False) or general_decoders.decode("traces", body, False))
    per_write = max(1, 200_000 // max(1, items // len(payloads)))  # the writer's batch of 200k rows
    with Store(workdir / "store-alone.duckdb") as store:
        started = time.perf_counter()
        for i in range(0, len(frames), per_write):
            store.write(Frames.concat(frames[i:i + per_write]))
        store.close()
        rates["store writing the same rows"] = items / (time.perf_counter() - started)
    return rates


def send_all(port: int, path: str, payloads: list[bytes], clients: int) -> tuple[int, int]:
    """POST every payload (retrying on 503 as an OTLP exporter would); returns (accepted, retries)."""
    lock, queue, counts = threading.Lock(), list(payloads), [0, 0]

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if not queue:
                    break
                body = queue.pop()
            while True:
                conn.request("POST", path, body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    with lock:
                        counts[0] += 1
                    break
                if response.status != 503:
                    raise SystemExit(f"{path}: HTTP {response.status}")
                with lock:
                    counts[1] += 1
                time.sleep(float(response.getheader("Retry-After", "1")) / 10)
        conn.close()

    _run_clients(client, clients)
    return counts[0], counts[1]


def paced_latencies(port: int, path: str, payloads: list[bytes], requests_per_s: float, clients: int) -> list[float]:
    """Send payloads at a fixed rate, open loop (request i is due at i / rate, whether or not the ones before it
    were answered), and return each one's seconds from when it was due to its 200: what an exporter waits,
    queueing behind slow answers included."""
    lock, due, latencies = threading.Lock(), iter(range(len(payloads))), []
    started = time.perf_counter() + 0.2

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                i = next(due, None)
            if i is None:
                break
            at = started + i / requests_per_s
            time.sleep(max(0.0, at - time.perf_counter()))
            conn.request("POST", path, payloads[i], {"Content-Type": "application/x-protobuf"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"{path}: HTTP {response.status} at {requests_per_s:.0f} requests/s")
            with lock:
                latencies.append(time.perf_counter() - at)
        conn.close()

    _run_clients(client, clients)
    return sorted(latencies)


def _run_clients(client, clients: int) -> None:
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _serve(db: Path, port: int, serve_args: tuple[str, ...]) -> subprocess.Popen:
    return _serve_on(db, ("--http", f"127.0.0.1:{port}", "--grpc", "off", *serve_args), port)


def _serve_on(db: Path, serve_args: tuple[str, ...], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(db), *serve_args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc, "sloscope serve")
    return proc


def _committed_rows(db: Path, tables: tuple[str, ...]) -> int:
    con = duckdb.connect(str(db), read_only=True)
    rows = sum(con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] for table in tables)
    con.close()
    return rows


def end_to_end(path: str, payloads: list[bytes], items: int, table: str | tuple[str, ...], clients: int,
               workdir: Path, serve_args: tuple[str, ...] = ()) -> tuple[float, int, int, float, int]:
    """(items/s, rows committed to `table` (or tables), retried 503s, serve's CPU seconds per item from its
    start-up on to its exit, the database file's bytes)."""
    tables = (table,) if isinstance(table, str) else table
    run = Path(tempfile.mkdtemp(dir=workdir))  # a fresh store each time: a stored row is not written again
    db, port = run / f"{tables[0]}.duckdb", free_port()
    proc = _serve(db, port, serve_args)
    cpu_at_start = _tree_cpu_seconds(proc.pid)
    started = time.perf_counter()
    _, retries = send_all(port, path, payloads, clients)
    proc.send_signal(signal.SIGTERM)
    cpu = _exit_cpu_seconds(proc) - cpu_at_start
    seconds = time.perf_counter() - started
    rows, size = _committed_rows(db, tables), db.stat().st_size
    shutil.rmtree(run)
    if rows != items:
        raise SystemExit(f"{', '.join(tables)}: {rows} rows committed for {items} sent")
    return items / seconds, rows, retries, cpu / items, size


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its descendants so far (serve's decode workers start with it)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return _cpu_seconds(pid) + sum(_tree_cpu_seconds(int(child)) for child in children)


def _exit_cpu_seconds(proc: subprocess.Popen) -> float:
    """Wait for the process to exit and return its user and system CPU seconds, all its threads and the workers
    it waited for together, as the kernel accounts them at exit."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def span_round(spans: list[bytes], args, workdir: Path, number: int) -> dict:
    """One round: each ack mode end to end, (spans/s, rows committed, retried 503s), between two bare parses
    whose mean is the round's baseline. Each round starts with the next mode, so that no mode always runs
    first, on caches and disk blocks the run before it has not warmed."""
    before = bare_parse_rate(spans, ExportTraceServiceRequest, args.spans)
    result, result["steal"] = {}, {}
    modes = list(ACK_MODES)
    for ack in modes[number % len(modes):] + modes[:number % len(modes)]:
        ticks = _cpu_ticks()
        result[ack] = end_to_end("/v1/traces", spans, args.spans, "requests", args.clients, workdir, ("--ack", ack))
        result["steal"][ack] = _steal_share(ticks)
    result["bare"] = (before + bare_parse_rate(spans, ExportTraceServiceRequest, args.spans)) / 2
    return result


def _cpu_ticks() -> tuple[int, int]:
    """(stolen, all) CPU ticks of this machine so far: a virtual machine's host takes a share of its CPUs."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[7], sum(ticks)


def _steal_share(since: tuple[int, int]) -> float:
    stolen, total = (now - then for now, then in zip(_cpu_ticks(), since))
    return stolen / total if total else 0.0


def ack_latency(payloads: list[bytes], requests_per_s: float, clients: int, workdir: Path,
                ack: str) -> tuple[float, float]:
    """p50 and p99 seconds from a request being due to its 200, with acknowledgements by `ack`, at a fixed rate."""
    db, port = workdir / f"latency-{ack}.duckdb", free_port()
    proc = _serve(db, port, ("--ack", ack))
    try:
        latencies = paced_latencies(port, "/v1/traces", payloads, requests_per_s, clients)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    return latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _exports_received(http_port: int) -> int:
    """Metrics export requests serve has accepted so far (from its /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith("sloscope_receiver_requests_total{") and 'signal="metrics"' in line and (
                'outcome="accepted"' in line):
            return int(float(re.split(r"\s+", line.strip())[-1]))
    return 0


def _await_exports(http_port: int, collect: subprocess.Popen, count: int, timeout_s: float = 180) -> None:
    """Until the collector has delivered `count` exports: its start-up (bcc compiling the eBPF programs, ~13 s on
    a loaded 2-core VM) is over."""
    deadline = time.monotonic() + timeout_s
    while _exports_received(http_port) < count:
        if collect.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the collector did not start exporting")
        time.sleep(0.5)


def collector_footprint(workdir: Path, seconds: int = 20) -> str:
    """CPU share and memory of `sloscope collect --interval 1` with all local probes, after start-up."""
    port, http_port = free_port(), free_port()
    serve = _serve_on(workdir / "c.duckdb", ("--grpc", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http_port}"),
                      http_port)
    collect = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "collect", "--endpoint",
                                f"http://127.0.0.1:{port}", "--interval", "1", "--duration", str(seconds + 200), "--probe", "node",
                                "--spool-dir", str(workdir / "spool")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _await_exports(http_port, collect, 2)
        cpu0, t0, rss = _cpu_seconds(collect.pid), time.monotonic(), []
        for _ in range(seconds):
            time.sleep(1)
            rss.append(_rss_bytes(collect.pid))
        cpu = (_cpu_seconds(collect.pid) - cpu0) / (time.monotonic() - t0)
        return (f"collector, interval 1 s, probes {'/'.join(['syscall', 'tcp', 'block', 'runqueue', 'procfs'])}: "
                f"{cpu:.1%} of one CPU, RSS {max(rss) / 2**20:.0f} MiB (steady state over {seconds} s)")
    finally:
        collect.send_signal(signal.SIGTERM)
        collect.wait(timeout=60)
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=300_000)
    parser.add_argument("--per-request", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=10,
                        help="concurrent requests: 10 is an OpenTelemetry Collector exporter's default "
                        "(sending_queue.num_consumers)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three ack modes (medians printed)")
    parser.add_argument("--latency-seconds", type=float, default=20, help="length of the fixed-rate latency run")
    parser.add_argument("--latency-clients", type=int, default=16,
                        help="connections of the fixed-rate run (enough that none waits for a free one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spans = trace_payloads(args.spans, args.per_request)
        rounds = [span_round(spans, args, Path(tmp), number) for number in range(args.rounds)]
        bare_spans = median([r["bare"] for r in rounds])
        rates = {ack: median([r[ack][0] for r in rounds]) for ack in ACK_MODES}
        latencies = {}
        for ack in ACK_MODES:
            half_rate = rates[ack] / 2 / args.per_request  # requests per second
            latencies[ack] = (half_rate, *ack_latency(spans[:max(200, int(half_rate * args.latency_seconds))],
                                                      half_rate, args.latency_clients, Path(tmp), ack))
        points = metric_payloads(args.points, args.per_request)
        bare_points = bare_parse_rate(points, ExportMetricsServiceRequest, args.points)
        point_rate, point_rows, point_retries, *_ = end_to_end("/v1/metrics", points, args.points, "samples",
                                                           args.clients, Path(tmp))
        inline, *_ = end_to_end("/v1/metrics", points, args.points, "samples", args.clients, Path(tmp),
                                  ("--decode-workers", "0"))
        stages = stage_rates(spans, args.spans, Path(tmp))  # last: decoding here slows this process as a client
        print(f"spans ({args.spans:,} in requests of {args.per_request}; medians of {args.rounds} rounds):")
        round_bare = ", ".join(f"{r['bare']:,.0f}" for r in rounds)
        print(f"  {'bare protobuf parse (upb)':<36} {bare_spans:>11,.0f}/s  (rounds: {round_bare})")
        for stage, rate in stages.items():
            print(f"  {stage:<36} {rate:>11,.0f}/s  (x{rate / bare_spans:.3f} of the bare parse)")
        for ack in ACK_MODES:
            of_bare = [r[ack][0] / r["bare"] for r in rounds]
            of_queued = [r[ack][0] / r["queued"][0] for r in rounds]
            retries = sum(r[ack][2] for r in rounds)
            steal = ", ".join(f"{r['steal'][ack]:.0%}" for r in rounds)
            print(f"  {'end to end, --ack ' + ack + ACK_MODES[ack]:<36} {rates[ack]:>11,.0f}/s  -> ratio "
                  f"{median(of_bare):.3f} of the bare parse, x{median(of_queued):.3f} of --ack queued "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in of_bare)} of the bare parse, the host stealing "
                  f"{steal} of the CPUs; {retries} retried 503s)")
        for ack in ACK_MODES:  # what a mode costs, less exposed to the host's pace than a rate
            per_span = [r[ack][3] for r in rounds]
            of_queued = [r[ack][3] / r["queued"][3] for r in rounds]
            print(f"  --ack {ack}: serve's CPU {median(per_span) * 1e6:.2f} us per span, x{median(of_queued):.2f} "
                  f"of --ack queued (rounds: {', '.join(f'{x:.2f}' for x in of_queued)})")
        for ack, (half_rate, p50, p99) in latencies.items():
            print(f"  --ack {ack}: acknowledgement latency at half its rate ({half_rate * args.per_request:,.0f} "
                  f"spans/s, {half_rate:.0f} requests/s, open loop): p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms")
        print(f"metric points: {point_rate:>9,.0f}/s end to end ({point_rows:,} rows committed, {point_retries} "
              f"retried 503s); bare protobuf parse {bare_points:>11,.0f}/s -> ratio {point_rate / bare_points:.3f}")
        print(f"{'':>13}  {inline:>9,.0f}/s with every request decoded in the server process "
              f"(--decode-workers 0): the workers give x{point_rate / inline:.2f}")
        if os.geteuid() == 0:
            print(collector_footprint(Path(tmp)))
    print(f"({os.cpu_count()} CPUs; client, server and writer share them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
