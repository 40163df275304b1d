"""The /metrics exporter: what a scrape of a store says, parsed back with prometheus_client's parser."""

import threading
import time
from datetime import datetime, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sloscope import exposition, metric_names
from sloscope.alerts.store_metrics import StoreCollector, render
from sloscope.alerts.rules import rules_dict
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import load_spec
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces, write_lines
from tests.alerts.test_rules import series_names

SPEC = load_spec(None)
T0_S = 1_764_410_400  # 2025-11-29T10:00:00Z
T0 = T0_S * 1_000_000_000
S = 1_000_000_000


def tid(i):
    return f"{i:032x}"


def sid(i):
    return f"{i:016x}"


def ingest(store, tmp_path, lines, name="in.jsonl"):
    path = write_lines(tmp_path / name, lines)
    report = Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files([path])
    assert report.rejected_count == 0, report.rejected


def scrape(collector) -> dict:
    """family name -> {(sample name, sorted labels): value}"""

    text = exposition.render(collector).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return out


def value(families, family_name, sample, **labels):
    return families[family_name][(sample, tuple(sorted(labels.items())))]


@pytest.fixture
def store(tmp_path):
    crit = "p99-latency-critical"
    spans = [span(tid(i), sid(i), T0 + i * S, 100, tier=crit) for i in range(8)]
    spans += [span(tid(8), sid(8), T0, 900, tier=crit), span(tid(9), sid(9), T0, 1500, tier=crit, status=503)]
    standard = [span(tid(20), sid(20), T0, 150, tier="standard"), span(tid(21), sid(21), T0, 250, tier="standard"),
                span(tid(22), sid(22), T0, 250, tier="nonsense")]
    gpu = {"hw.id": "GPU-1"}
    lines = [
        traces(spans, service="llm-gateway", node="gpu-node-1"),
        traces(standard, service="embedder", node="gpu-node-2"),
        metrics([
            gauge("hw.gpu.utilization", [(T0, 0.5), (T0 + 10 * S, 0.93)], gpu),
            gauge("hw.gpu.utilization", [(T0 + 10 * S, 0.4)], {"hw.id": "GPU-1", "process.pid": 4242}),
            gauge("hw.gpu.memory.usage", [(T0 + 10 * S, 2.0e9)], gpu),
            gauge("spdk.bdev.io.wait", [(T0 + 10 * S, 0.008)], {"spdk.bdev.name": "Nvme0n1",
                                                                 "disk.io.direction": "read"}),
            gauge("spdk.reactor.busy", [(T0 + 10 * S, 0.85)], {"spdk.reactor.lcore": 0}),
            gauge("sloscope.nvme.temperature", [(T0 + 10 * S, 70.0)], {"system.device": "nvme0n1"}),
        ], node="gpu-node-1"),
        # a node whose samples stopped long ago: not exported
        metrics([gauge("hw.gpu.utilization", [(T0 - 3600 * S, 0.99)], {"hw.id": "GPU-9"})], node="gpu-node-9"),
    ]
    with Store(tmp_path / "db.duckdb") as s:
        ingest(s, tmp_path, lines)
        yield s


def collector(store, **kw):
    kw.setdefault("clock", lambda: T0_S + 60)
    return StoreCollector(store.reading, SPEC, **kw)


def test_request_histograms_and_counters_per_tier_service_and_node(store):
    f = scrape(collector(store))
    crit = {"tier": "p99-latency-critical", "service": "llm-gateway", "node": "gpu-node-1"}
    name = metric_names.REQUEST_DURATION
    assert value(f, name, name + "_bucket", **crit, le="0.5") == 8
    assert value(f, name, name + "_bucket", **crit, le="0.8") == 8  # the tier's threshold is an exact bucket
    assert value(f, name, name + "_bucket", **crit, le="1.0") == 9
    assert value(f, name, name + "_bucket", **crit, le="+Inf") == 10
    assert value(f, name, name + "_count", **crit) == 10
    assert value(f, name, name + "_sum", **crit) == pytest.approx((800 + 900 + 1500) / 1000)
    assert value(f, "sloscope_requests", metric_names.REQUESTS, **crit) == 10
    assert value(f, "sloscope_request_errors", metric_names.REQUEST_ERRORS, **crit) == 1
    std = {"tier": "standard", "service": "embedder", "node": "gpu-node-2"}  # the invalid tier counts as default
    assert value(f, name, name + "_bucket", **std, le="0.2") == 1
    assert value(f, "sloscope_requests", metric_names.REQUESTS, **std) == 3
    assert value(f, "sloscope_request_errors", metric_names.REQUEST_ERRORS, **std) == 0  # exported even when zero
    les = {dict(k[1])["le"] for k in f[name] if k[0] == name + "_bucket"}
    for tier in SPEC.tiers.values():  # every tier threshold is a bucket bound, spelled as the rules spell it
        assert metric_names.le_label(metric_names.le_seconds(tier.threshold_ms)) in les


def test_physical_gauges_are_the_latest_value_of_fresh_series(store):
    f = scrape(collector(store))
    assert f[metric_names.GPU_UTILIZATION] == {(metric_names.GPU_UTILIZATION, (("gpu", "GPU-1"), ("node", "gpu-node-1"))): 0.93}
    assert value(f, metric_names.GPU_MEMORY_USED, metric_names.GPU_MEMORY_USED, node="gpu-node-1", gpu="GPU-1") == 2.0e9
    assert value(f, metric_names.SPDK_BDEV_IO_WAIT, metric_names.SPDK_BDEV_IO_WAIT, node="gpu-node-1", bdev="Nvme0n1",
                 direction="read") == 0.008
    assert value(f, metric_names.SPDK_REACTOR_BUSY, metric_names.SPDK_REACTOR_BUSY, node="gpu-node-1", lcore="0") == 0.85
    # an empty label is no label in the exposition
    assert value(f, metric_names.NVME_TEMPERATURE, metric_names.NVME_TEMPERATURE, node="gpu-node-1", device="nvme0n1") == 70.0
    # without an age limit, the stale node's last value shows
    old = scrape(collector(store, gauge_max_age_s=None))
    assert value(old, metric_names.GPU_UTILIZATION, metric_names.GPU_UTILIZATION, node="gpu-node-9", gpu="GPU-9") == 0.99


def test_ingest_counters_and_the_cardinality_cap(store):
    f = scrape(collector(store))
    assert value(f, "sloscope_ingest_requests_loaded", "sloscope_ingest_requests_loaded_total") == 13
    assert value(f, "sloscope_ingest_tier_invalid", "sloscope_ingest_tier_invalid_total") == 1
    f = scrape(collector(store, max_series=1))
    hist = metric_names.REQUEST_DURATION
    assert {dict(k[1])["tier"] for k in f[hist]} == {"p99-latency-critical"}  # one label set kept, in order
    dropped = "sloscope_exporter_series_dropped"
    assert value(f, dropped, metric_names.SERIES_DROPPED, family=hist) == 1
    assert value(f, dropped, metric_names.SERIES_DROPPED, family=metric_names.GPU_UTILIZATION) == 0  # the per-process series is no series
    assert len(f[metric_names.GPU_UTILIZATION]) == 1
    assert value(f, "sloscope_exporter_errors", metric_names.EXPORTER_ERRORS, part="requests") == 0


def test_a_failing_part_is_left_out_and_counted(store):
    c = collector(store)
    c._gauges = lambda con: (_ for _ in ()).throw(RuntimeError("boom"))
    f = scrape(c)
    assert metric_names.GPU_UTILIZATION not in f and metric_names.REQUEST_DURATION in f
    assert value(f, "sloscope_exporter_errors", metric_names.EXPORTER_ERRORS, part="gauges") == 1


def test_render_serves_the_text_format_and_scrapes_beside_a_writer(store, tmp_path):
    body, content_type = render(store, SPEC, clock=lambda: T0_S + 60)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert b"sloscope_requests_total{" in body
    errors, bodies = [], []

    def scraper():
        try:
            for _ in range(5):
                bodies.append(render(store)[0])
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=scraper) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(3):  # the writer keeps writing on the store's own connection meanwhile
        ingest(store, tmp_path, [traces([span(tid(100 + i), sid(100 + i), T0, 50, tier="standard")],
                                        service="embedder", node="gpu-node-2")], name=f"more{i}.jsonl")
    for t in threads:
        t.join()
    assert not errors and len(bodies) == 15
    # a scrape serves the last refresh's text; the next refresh falls due within a few times its duration
    deadline = time.monotonic() + 30
    while b'sloscope_requests_total{node="gpu-node-2",service="embedder",tier="standard"} 6.0' not in render(store)[0]:
        assert time.monotonic() < deadline, "the ingested requests never reached /metrics"
        time.sleep(0.05)


@pytest.mark.slow
def test_incident_cause_scores_of_open_incidents_and_every_rule_series_exported(tmp_path):
    from sloscope.simulator.fleet import SimulationConfig, simulate

    out = tmp_path / "otlp"
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    truth = simulate(SimulationConfig(out=out, nodes=2, seed=3, fault="storage_queue", rate=4.0, duration_s=1080,
                                      start=start.strftime("%Y-%m-%dT%H:%M:%SZ"), fault_at_s=660))
    with Store(tmp_path / "sim.duckdb") as store:
        report = Ingestor(store, TierResolver.from_spec(SPEC), jobs=1).ingest_files(sorted(out.glob("*.jsonl*")))
        assert report.rejected_count == 0
        t0 = start.timestamp()
        now = [t0 + 1000]  # 40 s after the fault ended: the incident is open
        c = StoreCollector(store.reading, SPEC, clock=lambda: now[0], cache_s=15)
        f = scrape(c)
        scores = f[metric_names.INCIDENT_CAUSE_SCORE]
        node = truth.fault["node"]
        top = {dict(k[1])["cause"]: v for k, v in scores.items() if dict(k[1])["node"] == node}
        assert max(top, key=top.get) == "storage_queue" and top["storage_queue"] >= 0.5
        assert {dict(k[1])["tier"] for k in scores} <= set(SPEC.tiers)
        assert len({dict(k[1])["cause"] for k in scores}) <= 3  # the top 3 causes per incident

        # every series the rules select (not recorded by another rule) is in a scrape of a realistic store
        doc = rules_dict(SPEC)
        recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
        selected = set().union(*(series_names(r["expr"]) for g in doc["groups"] for r in g["rules"])) - recorded
        samples = {s for fam in f.values() for s, _ in fam}
        assert selected <= samples, sorted(selected - samples)

        # cached for cache_s; later, the incident is closed and its scores are gone
        now[0] += 5
        assert scrape(c)[metric_names.INCIDENT_CAUSE_SCORE] == scores
        now[0] = t0 + 1080 + 900
        assert scrape(c)[metric_names.INCIDENT_CAUSE_SCORE] == {}


def test_signal_counters_histograms_and_remediation_decisions(tmp_path):
    tcp = counter("sloscope.tcp.retransmits", T0 - S, [(T0, 10), (T0 + S, 25), (T0 + 2 * S, 40)])
    psi = counter("sloscope.pressure.stall", T0 - S, [(T0, 1.5), (T0 + S, 2.0)],
                  {"pressure.resource": "io", "pressure.kind": "some"})
    # buckets (2^-15, 2^-14] and (2^-14, 2^-13] s: counts 1 and 2, then 2 and 5, cumulative
    syscalls = exp_histogram("sloscope.syscall.duration", T0 - S, [(T0, 3, 3e-4, -15, [1, 2]),
                                                                    (T0 + S, 7, 7e-4, -15, [2, 5])],
                             attrs={"syscall.name": "read"})
    with Store(tmp_path / "db.duckdb") as store:
        ingest(store, tmp_path, [metrics([tcp, psi, syscalls], node="gpu-node-1")])
        store.con.execute("CREATE TABLE remediation_audit (ts TIMESTAMP, alert VARCHAR, fingerprint VARCHAR, "
                          "starts_at TIMESTAMP, action VARCHAR, target VARCHAR, params VARCHAR, decision VARCHAR, "
                          "reason VARCHAR)")
        store.con.execute("INSERT INTO remediation_audit VALUES (now(), 'SloscopeGpuSaturated', 'ab', NULL, "
                          "'nft_drain_backend', 'backend:gpu-node-1', '{}', 'executed', 'done')")
        families = scrape(collector(store))
    assert value(families, "sloscope_tcp_retransmits", metric_names.TCP_RETRANSMITS, node="gpu-node-1") == 40  # 10 + 15 + 15
    assert value(families, "sloscope_pressure_stall_seconds", metric_names.PRESSURE_STALL, node="gpu-node-1",
                 resource="io", kind="some") == pytest.approx(2.0)
    hist = "sloscope_syscall_duration_seconds"
    labels = {"node": "gpu-node-1", "syscall": "read"}
    assert value(families, hist, hist + "_count", **labels) == 7
    assert value(families, hist, hist + "_bucket", le=metric_names.le_label(2.0 ** -14), **labels) == 2  # (2^-15, 2^-14]
    assert value(families, hist, hist + "_bucket", le=metric_names.le_label(2.0 ** -12), **labels) == 7
    assert value(families, hist, hist + "_bucket", le=metric_names.le_label(2.0 ** -16), **labels) == 0
    assert value(families, "sloscope_remediation_actions", metric_names.REMEDIATION_ACTIONS, alert="SloscopeGpuSaturated",
                 action="nft_drain_backend", target="backend:gpu-node-1", decision="executed") == 1
