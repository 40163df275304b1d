"""The Collector's receivers' metrics are kept like any catalog signal, by both decoders, with their own units."""

import json
from itertools import takewhile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.analytics.attribution import Window, signal_steps
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.receiver.otlp_json import Decoder
from sloscope.receiver.otlp_proto import ProtoDecoder
from sloscope import catalog, taxonomy
from sloscope.slo_spec import load_spec
from tests.otlp_builders import metrics as own_metrics
from tests.otlp_builders import gauge as own_gauge
from tests.otlp_builders import write_lines
from tests.receiver_otlp import cumulative, dcgm_labels, gauge, hostmetrics, kubeletstats, prometheus_scrape

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000
START = T0 - 3600 * S  # the receivers' cumulative series start when the Collector did
BLANK_INT64 = 9223372036854775794  # DCGM's blank int64 sentinel, as dcgm-exporter prints it

HOST = hostmetrics("gpu-node-1", {
    "cpu": [gauge("system.cpu.utilization", "1", [(T0, 0.42)], {"cpu": "cpu0", "state": "user"}),
            gauge("system.cpu.utilization", "1", [(T0, 0.51)], {"cpu": "cpu0", "state": "idle"}),
            cumulative("system.cpu.time", "s", START, [(T0, 8123.5)], {"cpu": "cpu0", "state": "user"})],
    "load": [gauge("system.cpu.load_average.1m", "{thread}", [(T0, 3.25)])],
    "memory": [gauge("system.memory.utilization", "1", [(T0, 0.61)], {"state": "used"}),
               cumulative("system.memory.usage", "By", START, [(T0, 41e9)], {"state": "used"}, True, monotonic=False)],
    "paging": [cumulative("system.paging.faults", "{faults}", START, [(T0, 1200)], {"type": "major"}, True),
               cumulative("system.paging.faults", "{faults}", START, [(T0, 9_400_000)], {"type": "minor"}, True)],
    "disk": [cumulative("system.disk.io_time", "s", START, [(T0, 532.25)], {"device": "nvme0n1"}),
             cumulative("system.disk.operation_time", "s", START, [(T0, 811.5)],
                        {"device": "nvme0n1", "direction": "read"})],
    "network": [cumulative("system.network.errors", "{errors}", START, [(T0, 3)],
                           {"device": "eth0", "direction": "receive"}, True),
                cumulative("system.network.dropped", "{packets}", START, [(T0, 17)],
                           {"device": "eth0", "direction": "transmit"}, True),
                cumulative("system.network.connections", "{connections}", START, [(T0, 1840)],
                           {"protocol": "tcp", "state": "TIME_WAIT"}, True, monotonic=False)],
})
KUBELET = kubeletstats("gpu-node-1", [gauge("k8s.node.cpu.usage", "{cpu}", [(T0, 11.5)]),
                                      gauge("k8s.node.memory.working_set", "By", [(T0, 52e9)], integer=True)], [
    ("vllm-0", "inference", [gauge("k8s.pod.cpu.usage", "{cpu}", [(T0, 3.5)]),
                             gauge("k8s.pod.memory.working_set", "By", [(T0, 9.5e9)], integer=True)],
     {"vllm": [gauge("container.cpu.usage", "{cpu}", [(T0, 3.4)]),
               gauge("container.memory.working_set", "By", [(T0, 9.1e9)], integer=True)]}),
    ("batch-7", "jobs", [gauge("k8s.pod.cpu.usage", "{cpu}", [(T0, 6.0)])], {}),
])
GPU0, GPU1 = dcgm_labels("gpu-node-2", 0), dcgm_labels("gpu-node-2", 1, "GPU-0d4e5f60-7a8b-4c9d-8e0f-112233445566")
DCGM = prometheus_scrape("10.4.2.17:9400", [
    gauge("DCGM_FI_DEV_GPU_UTIL", "", [(T0, 87.0)], GPU0),
    gauge("DCGM_FI_PROF_SM_ACTIVE", "", [(T0, 0.41)], GPU0),
    gauge("DCGM_FI_PROF_DRAM_ACTIVE", "", [(T0, 0.33)], GPU0),
    gauge("DCGM_FI_DEV_FB_USED", "", [(T0, 30512.0)], GPU0),
    gauge("DCGM_FI_DEV_GPU_TEMP", "", [(T0, 61.0)], GPU0),
    gauge("DCGM_FI_DEV_GPU_TEMP", "", [(T0, float(BLANK_INT64))], GPU1),  # a field with no value
    gauge("DCGM_FI_DEV_SM_CLOCK", "", [(T0, 1980.0)], GPU0),
], times=[T0])


def _decode(kind, request):
    if kind == "json":
        decoder = Decoder()
        return decoder.decode(request), decoder.skipped
    decoder = ProtoDecoder()
    return decoder.decode(ParseDict(request, ExportMetricsServiceRequest())), decoder.skipped


def _rows(batch):
    p = batch.points
    return {(p.metric[i], p.node[i], p.attributes[i]): (p.value[i], p.is_sum[i], p.cumulative[i])
            for i in range(len(p))}


def _key(metric, node, **attrs):
    return metric, node, json.dumps(attrs, sort_keys=True, separators=(",", ":"))


@pytest.fixture(params=["json", "protobuf"])
def decode(request):
    return lambda otlp: _decode(request.param, otlp)


def test_hostmetrics_series_are_kept_on_their_node_with_their_attribute_names(decode):
    batch, skipped = decode(HOST)
    rows = _rows(batch)
    assert rows[_key("system.cpu.utilization", "gpu-node-1", cpu="cpu0", state="user")] == (0.42, False, False)
    assert rows[_key("system.cpu.load_average.1m", "gpu-node-1")] == (3.25, False, False)
    assert rows[_key("system.paging.faults", "gpu-node-1", type="major")] == (1200.0, True, True)
    assert rows[_key("system.disk.io_time", "gpu-node-1", device="nvme0n1")] == (532.25, True, True)
    assert rows[_key("system.disk.operation_time", "gpu-node-1", device="nvme0n1", direction="read")][1:] == \
        (True, True)
    assert rows[_key("system.network.dropped", "gpu-node-1", device="eth0", direction="transmit")] == \
        (17.0, True, True)
    # An up-down counter is a level: 1840 connections in TIME_WAIT, not an increase to take deltas of.
    assert rows[_key("system.network.connections", "gpu-node-1", protocol="tcp", state="TIME_WAIT")] == \
        (1840.0, False, False)
    assert skipped["points_not_in_catalog"] == 2  # system.cpu.time, system.memory.usage
    assert len(rows) == 11


def test_a_shared_name_is_told_apart_by_its_producers_attribute_names():
    for name, own, theirs in (("system.disk.io_time", "system.device", "device"),
                              ("system.paging.faults", "system.paging.type", "type")):
        sig = catalog.signal(name)
        assert sig.producer_of([own]).name == catalog.OWN
        assert sig.producer_of([theirs]).name == catalog.HOSTMETRICS
        assert sig.attributes == (own,)  # the signal's own definition stays sloscope's


def test_kubeletstats_pod_and_container_series_keep_their_pod_and_count_for_its_node(decode):
    batch, _ = decode(KUBELET)
    rows = _rows(batch)
    assert rows[_key("k8s.node.cpu.usage", "gpu-node-1")] == (11.5, False, False)
    assert rows[_key("k8s.pod.cpu.usage", "gpu-node-1", **{"k8s.pod.name": "vllm-0",
                                                           "k8s.namespace.name": "inference"})][0] == 3.5
    # two pods on one node are two series, not one that takes whichever came last
    assert rows[_key("k8s.pod.cpu.usage", "gpu-node-1", **{"k8s.pod.name": "batch-7",
                                                           "k8s.namespace.name": "jobs"})][0] == 6.0
    assert rows[_key("container.memory.working_set", "gpu-node-1", **{
        "k8s.pod.name": "vllm-0", "k8s.namespace.name": "inference", "k8s.container.name": "vllm"})][0] == 9.1e9
    assert {m for m, _, _ in rows} == {"k8s.node.cpu.usage", "k8s.node.memory.working_set", "k8s.pod.cpu.usage",
                                       "k8s.pod.memory.working_set", "container.cpu.usage",
                                       "container.memory.working_set"}


def test_dcgm_fields_keep_dcgms_units_and_take_their_node_from_the_hostname_label(decode):
    batch, skipped = decode(DCGM)
    rows = _rows(batch)
    gpu0 = json.dumps(GPU0, sort_keys=True, separators=(",", ":"))
    assert rows[("DCGM_FI_DEV_GPU_UTIL", "gpu-node-2", gpu0)][0] == 87.0  # percent, 0..100: not a ratio
    assert rows[("DCGM_FI_PROF_SM_ACTIVE", "gpu-node-2", gpu0)][0] == 0.41  # ratio, 0..1
    assert rows[("DCGM_FI_DEV_FB_USED", "gpu-node-2", gpu0)][0] == 30512.0  # MiB
    assert rows[("DCGM_FI_DEV_GPU_TEMP", "gpu-node-2", gpu0)][0] == 61.0
    assert len(rows) == 5  # the blank temperature of GPU 1 is no reading
    assert skipped["points_blank"] == 1
    assert skipped["points_not_in_catalog"] == 3  # DCGM_FI_DEV_SM_CLOCK, up, scrape_duration_seconds
    assert "points_node_unknown" not in skipped
    assert catalog.signal("DCGM_FI_DEV_GPU_UTIL").unit == "%" and catalog.signal("hw.gpu.utilization").unit == "1"


def test_a_scrape_that_names_no_node_anywhere_is_kept_on_the_unknown_node_and_counted(decode):
    labels = {k: v for k, v in GPU0.items() if k != "Hostname"}
    batch, skipped = decode(prometheus_scrape("10.4.2.17:9400", [gauge("DCGM_FI_DEV_GPU_UTIL", "", [(T0, 5.0)],
                                                                       labels)], times=[T0]))
    assert batch.points.node == [catalog.UNKNOWN_NODE] and skipped["points_node_unknown"] == 1


def test_every_receiver_signal_has_a_producer_a_unit_and_a_noise_floor():
    receivers = [s for s in catalog.SIGNALS if s.producers[0].name != catalog.OWN and not s.derived]
    assert {s.producers[0].name for s in receivers} == {catalog.HOSTMETRICS, catalog.KUBELETSTATS,
                                                         catalog.PROMETHEUS, catalog.OTLP}
    for s in receivers:
        assert s.unit and s.noise_floor > 0 and s.producers[0].source.startswith(
            ("hostmetrics receiver", "kubeletstats receiver", "dcgm-exporter through the prometheus receiver",
             *(f"{engine} through the prometheus receiver" for engine in ("vLLM", "SGLang", "TGI", "Triton")),
             "an inference server's OpenTelemetry SDK (GenAI semantic conventions) through the otlp receiver")), s


def test_stored_receiver_series_read_in_their_own_units_beside_sloscopes(tmp_path):
    """Counters become rates (seconds busy per second), the percent stays a percent and NVML's ratio stays a
    ratio: two series, never one baseline."""
    host = hostmetrics("gpu-node-2", {"disk": [cumulative("system.disk.io_time", "s", START,
                                                          [(T0 + k * 5 * S, 500.0 + 0.6 * k) for k in range(8)],
                                                          {"device": "nvme0n1"})]})
    dcgm = prometheus_scrape("10.4.2.17:9400", [gauge("DCGM_FI_DEV_GPU_UTIL", "", [(T0 + k * 5 * S, 87.0)
                                                                                   for k in range(8)], GPU0)])
    nvml = own_metrics([own_gauge("hw.gpu.utilization", [(T0 + k * 5 * S, 0.87) for k in range(8)],
                                  {"hw.id": GPU0["UUID"]})], node="gpu-node-2")
    spec = load_spec(None)
    with Store(tmp_path / "r.duckdb") as store:
        report = Ingestor(store, TierResolver.from_spec(spec)).ingest_files(
            [write_lines(tmp_path / "r.jsonl", [host, dcgm, nvml])])
        assert report.rejected_count == 0
        t0 = datetime.fromtimestamp(T0 / 1e9, timezone.utc).replace(tzinfo=None)
        steps = signal_steps(store, Window(t0, t0, t0, t0 + timedelta(minutes=1), 10.0))
    # (the first point's increase is over the hour since the series started)
    means = dict(steps.group_by("metric").agg(pl.col("value").median()).iter_rows())
    assert means["system.disk.io_time"] == pytest.approx(0.12)  # 0.6 s busy per 5 s
    assert means["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(87.0)
    assert means["hw.gpu.utilization"] == pytest.approx(0.87)


def strength_rows() -> list[str]:
    rows = []
    for cause in taxonomy.CAUSES:
        for ev in cause.evidence:
            where = f" ({', '.join(f'{k}={v}' for k, v in ev.where)})" if ev.where else ""
            feature = f" {ev.feature}" if ev.feature != "level" else ""
            rows.append(f"| {cause.id} | {ev.measure} | {ev.rank} | `{ev.signal}`{where}{feature} | {ev.producer} |")
    return rows


def test_the_taxonomy_page_lists_every_evidence_with_its_measure_rank_and_producer():
    lines = (Path(__file__).resolve().parents[2] / "docs" / "taxonomy.md").read_text().splitlines()
    start = lines.index("| cause | measure | rank | evidence | producer |") + 2
    table = list(takewhile(lambda line: line.startswith("|"), lines[start:]))
    assert table == strength_rows(), "docs/taxonomy.md's strength table, as it should read:\n" + \
        "\n".join(strength_rows())


def test_within_a_measure_every_receiver_ranks_below_sloscopes_own_probes():
    for cause in taxonomy.CAUSES:
        for measure, evidence in taxonomy.by_measure(cause.evidence).items():
            own = [ev.rank for ev in evidence if ev.producer == catalog.OWN]
            others = [ev.rank for ev in evidence if ev.producer != catalog.OWN]
            assert not own or not others or max(own) < min(others), (cause.id, measure)
