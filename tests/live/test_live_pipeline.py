"""The live pipeline on loopback: `sloscope serve` and `sloscope collect` as real processes, request spans with
tier headers sent through the OpenTelemetry SDK's OTLP exporter, then `sloscope rca` on what was stored."""

import os
import signal
import subprocess
import sys
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from sloscope.analytics.store import Store
from tests.alerting_stack import free_port, wait_listening
from tests.conftest import need

SLOSCOPE = [sys.executable, "-m", "sloscope.commands.cli"]


def _send_spans(http_port, node, n_per_tier=40):
    provider = TracerProvider(resource=Resource.create({"service.name": "llm-gateway", "host.name": node}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")))
    tracer = provider.get_tracer("test")
    for tier in (["p99-latency-critical"], ["standard"], ["made-up-tier"]):
        for _ in range(n_per_tier):
            with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                              attributes={"http.request.header.x-slo-tier": tier,
                                                          "http.route": "/v1/chat/completions",
                                                          "http.response.status_code": 200}):
                time.sleep(0.001)
            with tracer.start_as_current_span("call model", kind=SpanKind.CLIENT):
                pass
    assert provider.force_flush(30_000)
    provider.shutdown()


def test_serve_collect_and_sdk_spans_end_to_end(tmp_path):
    need(os.geteuid() == 0, "the collector's eBPF probes need root")
    db, http_port, grpc_port = tmp_path / "live.duckdb", free_port(), free_port()
    node = "live-node-1"
    serve = subprocess.Popen(SLOSCOPE + ["serve", "--db", str(db), "--http", f"127.0.0.1:{http_port}",
                                         "--grpc", f"127.0.0.1:{grpc_port}"], stderr=subprocess.PIPE, text=True)
    collect = None
    try:
        wait_listening(http_port, serve, "sloscope serve")
        collect = subprocess.Popen(
            SLOSCOPE + ["collect", "--endpoint", f"http://127.0.0.1:{grpc_port}", "--protocol", "grpc",
                        "--interval", "1", "--duration", "8", "--probe", "node", "--node-name", node,
                        "--spool-dir", str(tmp_path / "spool")],
            stderr=subprocess.PIPE, text=True)
        _send_spans(http_port, node)
        assert collect.wait(timeout=120) == 0, collect.stderr.read()[-3000:]
    finally:
        if collect and collect.poll() is None:
            collect.kill()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, serve.stderr.read()[-3000:]

    with Store(db, read_only=True) as store:
        tiers = dict(store.rows("SELECT tier, count(*) FROM requests GROUP BY tier"))
        assert tiers == {"p99-latency-critical": 40, "standard": 80}  # the made-up tier became the default
        assert store.rows("SELECT DISTINCT node FROM requests") == [(node,)]
        signals = {m for (m,) in store.rows("SELECT DISTINCT metric FROM samples UNION SELECT DISTINCT metric "
                                            "FROM histograms")}
        assert {"sloscope.syscall.duration", "sloscope.cpu.runqueue.delay", "sloscope.pressure.stall",
                "system.network.connection.count"} <= signals
        assert store.rows("SELECT DISTINCT node FROM samples") == [(node,)]
        assert store.counters()["tier_invalid"] == 40
    rca = subprocess.run(SLOSCOPE + ["rca", "--db", str(db), "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    assert rca.returncode == 0 and '"incidents"' in rca.stdout
