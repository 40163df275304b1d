"""A service instrumented with the OpenTelemetry SDK at its defaults (a service name, no host or Kubernetes
attributes) exporting straight to a real `sloscope serve`: it gets tier SLIs at once, and node attribution from
its connection's address (the pod IP, as k8sattributes' `connection` association) as soon as the pod list has the
pod; spans it sent before that are moved to the node when the pod appears."""

import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from sloscope.analytics.store import Store
from tests.alerting_stack import free_port, wait_listening
from tests.fakes.kube_api import FakeKubeApi
from tests.enrich.test_node_from_pod import wait_for

SLOSCOPE = [sys.executable, "-m", "sloscope.commands.cli"]


def serve_requests(provider: TracerProvider, n: int, tier: str) -> None:
    """Requests as an instrumented HTTP server records them, with the tier header captured
    (OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=x-slo-tier)."""
    tracer = provider.get_tracer("opentelemetry.instrumentation.asgi")
    for i in range(n):
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER, attributes={
                "http.request.method": "POST", "http.route": "/v1/chat/completions", "url.scheme": "http",
                "http.response.status_code": 503 if i == 0 else 200, "http.request.header.x-slo-tier": [tier]}):
            time.sleep(0.002)
    provider.force_flush()


def scrape(port: int) -> list[str]:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode().splitlines()


def metric(port: int, name: str) -> float | None:
    values = [float(line.split()[-1]) for line in scrape(port) if line.startswith(name + " ")]
    return values[0] if values else None


def test_a_default_sdk_service_gets_tier_slis_and_its_pods_node(tmp_path):
    db, port = tmp_path / "sdk.duckdb", free_port()
    with FakeKubeApi() as kube:
        serve = subprocess.Popen(SLOSCOPE + ["serve", "--db", str(db), "--http", f"127.0.0.1:{port}", "--grpc", "off",
                                             "--decode-workers", "0", "--kube-api", kube.url],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_listening(port, serve, "sloscope serve")
            provider = TracerProvider(resource=Resource.create({"service.name": "chat"}))
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
                endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=10)))
            serve_requests(provider, 10, "p99-latency-critical")  # before the pod is known
            wait_for(lambda: metric(port, "sloscope_ingest_spans_node_unknown_total") == 10, 10, "the first spans")
            # The pod the SDK runs in: here the exporter connects from 127.0.0.1.
            kube.add_pod("chat-7d9f6c5b8-k2x9q", "inference", "gpu-node-5", "127.0.0.1",
                         created=datetime.now(timezone.utc) - timedelta(minutes=1))
            wait_for(lambda: metric(port, "sloscope_ingest_spans_node_replaced_late_total") == 10, 10,
                     "the late placement")
            serve_requests(provider, 10, "standard")  # the pod is known: placed at intake
            wait_for(lambda: metric(port, "sloscope_ingest_spans_node_from_pod_ip_total") == 10, 10, "the placement")
            provider.shutdown()
            slis = [line for line in scrape(port) if line.startswith("sloscope_requests_total{")]
            assert any('tier="p99-latency-critical"' in line and 'node="gpu-node-5"' in line for line in slis), slis
        finally:
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=60) == 0, serve.stderr.read()[-3000:]
    with Store(db, read_only=True) as store:
        rows = store.rows("SELECT tier, node, service, pod_ip, count(*), count(*) FILTER (failed) FROM requests "
                          "GROUP BY ALL ORDER BY tier")
    assert rows == [("p99-latency-critical", "gpu-node-5", "chat", "127.0.0.1", 10, 1),
                    ("standard", "gpu-node-5", "chat", "127.0.0.1", 10, 1)]
