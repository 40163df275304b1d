"""End to end: an SLO spec declares vLLM's queue as evidence for a cause of its own; `ingest` and `serve` keep the
metric because the spec says so, and `rca`, the report and the dashboards name the cause on the right node."""

import json
import random
import signal
import subprocess
import sys
import urllib.request

import pytest

from sloscope import metric_names
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.dashboards.grafana import build_all
from sloscope.dashboards.report import render
from sloscope.slo_spec import load_spec
from tests.alerting_stack import free_port
from tests.otlp_builders import attr, span, traces, write_lines
from tests.receiver_otlp import gauge, prometheus_scrape

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000
MINUTES = 16
FAULT_AT = 12 * 60
NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
FAULTY = "gpu-node-2"
SPEC_TEXT = """\
default_tier: standard
tiers:
  p99-latency-critical:
    latency: {percentile: 99, threshold_ms: 800}
    availability: 99.9
  standard:
    latency: {percentile: 95, threshold_ms: 200}
    availability: 99.5
causes:
  batch_queue:
    layer: runtime
    physical: requests wait in the inference server's queue (its running batch is full)
    remediation: add inference replicas beside {node}, or lower their max batch size
evidence:
  - metric: "myllm:requests_waiting"
    cause: batch_queue
    harmful: up
    threshold: 16
    noise_floor: 1
"""


def _vllm(node, rng, queued):
    """vLLM's /metrics scraped by the prometheus receiver, with the pod's node as k8sattributes adds it."""
    waiting = [(T0 + s * S, (40.0 + rng.gauss(0, 2)) if queued and s >= FAULT_AT else float(rng.randint(0, 2)))
               for s in range(0, MINUTES * 60, 5)]
    request = prometheus_scrape(f"10.4.{NODES.index(node)}.9:8000", [
        gauge("myllm:requests_waiting", "", waiting, {"model_name": "llama-3.1-8b"})], job="vllm")
    request["resourceMetrics"][0]["resource"]["attributes"].append(attr("k8s.node.name", node))
    return request


def _requests(node, rng, slow, base):
    spans = []
    for i in range(MINUTES * 60 * 4):
        s = i / 4
        ms = rng.lognormvariate(5.2, 0.25) * (5 if slow and s >= FAULT_AT + 8 else 1)
        spans.append(span(f"{base + i:032x}", f"{base + i:016x}", T0 + int(s * S), ms, tier=["p99-latency-critical"]))
    return traces(spans, node=node)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("declared")
    rng = random.Random(3)
    lines = []
    for k, node in enumerate(NODES):
        lines += [_vllm(node, rng, node == FAULTY), _requests(node, rng, node == FAULTY, k * 1_000_000)]
    spec = tmp / "slo.yaml"
    spec.write_text(SPEC_TEXT)
    db = tmp / "fleet.duckdb"
    assert main(["ingest", "--db", str(db), "--slo", str(spec), str(write_lines(tmp / "fleet.jsonl", lines))]) == 0
    return db, spec


def test_rca_names_the_declared_cause_on_the_right_node(fleet, capsys):
    db, _ = fleet
    capsys.readouterr()
    assert main(["rca", "--db", str(db), "--format", "json"]) == 0  # the spec given at ingest is remembered
    incidents = json.loads(capsys.readouterr().out)["incidents"]
    assert incidents and {i["node"] for i in incidents} == {FAULTY}
    top = incidents[0]["causes"][0]
    assert top["cause"] == "batch_queue" and top["layer"] == "runtime" and top["score"] >= 0.5
    assert top["remediation"].startswith(f"add inference replicas beside {FAULTY}")
    ev = top["evidence"][0]
    assert ev["signal"] == "myllm:requests_waiting" and ev["source"] == "slo_spec"
    assert ev["attributes"]["model_name"] == "llama-3.1-8b" and ev["observed"] > 16 > ev["baseline"]


def test_without_the_declaration_the_metric_is_not_kept(tmp_path):
    rng = random.Random(3)
    lines = write_lines(tmp_path / "v.jsonl", [_vllm(node, rng, False) for node in NODES])
    assert main(["ingest", "--db", str(tmp_path / "plain.duckdb"), str(lines)]) == 0
    with Store(tmp_path / "plain.duckdb", read_only=True) as store:
        assert store.rows("SELECT count(*) FROM samples")[0][0] == 0
        assert store.counters()["points_not_in_catalog"] > 0


def test_the_report_shows_the_declared_cause_and_its_metric(fleet):
    db, spec = fleet
    with Store(db, read_only=True) as store:
        html = render(store, load_spec(spec))
    assert "batch_queue" in html and "myllm:requests_waiting" in html


def test_the_dashboards_show_any_cause_the_analysis_ranks_declared_ones_included(fleet):
    """The cause panels read sloscope_incident_cause_score by its cause label, never a fixed list of ids, so a
    declared cause shows as the built-in ones do."""
    _, spec = fleet
    text = json.dumps(build_all(load_spec(spec)))
    assert metric_names.INCIDENT_CAUSE_SCORE in text and "cause=" not in text.replace('cause=~\\"$cause\\"', "")


def test_serve_keeps_the_metrics_its_spec_declares(tmp_path):
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC_TEXT)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "serve", "--db", str(tmp_path / "s.duckdb"),
                             "--slo", str(spec), "--decode-workers", "0", "--http", f"127.0.0.1:{port}",
                             "--grpc", "off"], stderr=subprocess.PIPE, text=True)
    try:
        # serve's own line, not only an open port: whatever else listens there must not answer for it
        assert any(f"OTLP/HTTP on http://127.0.0.1:{port}" in line for line in _lines_until_listening(proc))
        body = json.dumps(_vllm(FAULTY, random.Random(1), False)).encode()
        post = urllib.request.Request(f"http://127.0.0.1:{port}/v1/metrics", body,
                                      {"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=30) as reply:
            assert reply.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    with Store(tmp_path / "s.duckdb", read_only=True) as store:
        rows = store.rows("SELECT DISTINCT node, metric FROM samples")
    assert rows == [(FAULTY, "myllm:requests_waiting")]


def _lines_until_listening(proc):
    """serve's log lines up to the one saying it listens over HTTP (or to its exit)."""
    for line in proc.stderr:
        yield line
        if "OTLP/HTTP on" in line:
            return
