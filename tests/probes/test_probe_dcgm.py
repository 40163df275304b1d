"""dcgm-exporter probe against a stand-in exporter on 127.0.0.1 that serves what its counters file enables:
the stock etc/default-counters.csv by default, or sloscope's deploy/dcgm-exporter-counters.csv; the field
mapping held to DCGM's own field list (tests/fakes/dcgm_fields.py)."""

import logging
from pathlib import Path

import pytest
import yaml

from sloscope.probes.base import ProbeError
from sloscope.probes.gpu import dcgm_exporter as dcgm
from sloscope.probes.gpu.dcgm_exporter import DcgmExporterProbe, parse_exposition, TruncatedExposition
from sloscope.probes.registry import ProbeSet
from tests.fakes.dcgm_exporter import (STOCK_COUNTERS, FakeDcgmExporter, FakeGpu as DcgmGpu, default_fields,
                                       load_counters)
from tests.fakes.dcgm_fields import DCGM_FIELDS, NOT_DCGM_FIELDS
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.probe_asserts import by, one, assert_catalog_samples

REPO = Path(__file__).resolve().parents[2]
COUNTERS = REPO / "deploy" / "dcgm-exporter-counters.csv"


# -- scraping and mapping --------------------------------------------------------------------------------------------

@pytest.fixture
def exporter():
    """An exporter with sloscope's counters file."""
    fake = FakeDcgmExporter(counters=load_counters(COUNTERS)).start()
    try:
        yield fake
    finally:
        fake.stop()


def test_exposition_parser_labels_escapes_and_comments():
    text = ('# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
            'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x",modelName="A \\"quoted\\" \\\\ name",} 47\n'
            'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x"} 0.812500 1700000000000\n'
            'up 1\n')
    samples, problems = parse_exposition(text)
    assert problems == []
    assert samples[0].labels == {"gpu": "0", "UUID": "GPU-x", "modelName": 'A "quoted" \\ name'}
    assert (samples[1].name, samples[1].value) == ("DCGM_FI_PROF_SM_ACTIVE", 0.8125)
    bad, problems = parse_exposition('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-x} 4\nok 1\nx{a="b"} notanumber\n')
    assert [s.name for s in bad] == ["ok"] and len(problems) == 2 and "line 3" in problems[1]
    with pytest.raises(TruncatedExposition):
        parse_exposition('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-x"} 47\nDCGM_FI_DEV_FB_USED{UUID="GP')


def test_dcgm_fields_map_to_the_catalog(exporter):
    probe = DcgmExporterProbe(url=exporter.url)
    assert probe.check().ok
    with probe:
        samples = probe.collect()
    assert_catalog_samples(samples)
    uuid = exporter.gpus[0].uuid
    hw = {"hw.id": uuid}
    assert one(samples, "sloscope.gpu.sm.active", **hw).value == pytest.approx(0.8125)
    assert one(samples, "sloscope.gpu.dram.active", **hw).value == pytest.approx(0.4375)
    util = one(samples, "hw.gpu.utilization", **hw)
    assert util.value == pytest.approx(0.87) and util.attributes["hw.gpu.task"] == "general"
    assert one(samples, "hw.gpu.memory.usage", **hw).value == 20500 * 2**20
    assert one(samples, "hw.gpu.memory.limit", **hw).value == (20500 + 60000 + 559) * 2**20
    assert one(samples, "sloscope.gpu.memory.reserved", **hw).value == 559 * 2**20
    assert one(samples, "hw.gpu.temperature", **hw).value == 47
    assert probe.missing_signals() == {} and probe.notes == ()
    assert {s.attributes["hw.id"] for s in samples} == {g.uuid for g in exporter.gpus}


def test_dcgm_byte_rates_become_byte_counts_per_interval(exporter):
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        exporter.set(0, "DCGM_FI_PROF_NVLINK_TX_BYTES", 4_000_000_000)  # 2 GB/s before, 4 GB/s now
        samples = probe.collect()
    tx = one(samples, "hw.gpu.io", **{"hw.id": exporter.gpus[0].uuid, "sloscope.gpu.link": "nvlink",
                                      "network.io.direction": "transmit"})
    seconds = (tx.time_unix_nano - tx.start_time_unix_nano) / 1e9
    assert tx.kind == "counter_delta" and seconds > 0
    assert tx.value == pytest.approx(3_000_000_000 * seconds)  # trapezoid of 2 and 4 GB/s
    pcie_rx = one(samples, "hw.gpu.io", **{"hw.id": exporter.gpus[0].uuid, "sloscope.gpu.link": "pcie",
                                           "network.io.direction": "receive"})
    assert pcie_rx.value == pytest.approx(3_000_000 * seconds)


def test_dcgm_blank_values_are_dropped_not_reported(exporter):
    exporter.set(0, "DCGM_FI_DEV_FB_USED", None)  # int64 blank
    exporter.set(0, "DCGM_FI_PROF_SM_ACTIVE", None)  # fp64 blank
    assert str(dcgm.DCGM_INT64_BLANK) in exporter.exposition() and "140737488355328.000000" in exporter.exposition()
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        samples = probe.collect()
    hw = {"hw.id": exporter.gpus[0].uuid}
    assert by(samples, "hw.gpu.memory.usage", **hw) == [] and by(samples, "sloscope.gpu.sm.active", **hw) == []
    assert by(samples, "hw.gpu.memory.limit", **hw) == []  # used+free needs the blank field
    assert one(samples, "hw.gpu.temperature", **hw).value == 47
    assert max(s.value for s in samples if s.name != "hw.gpu.io") < 2**40
    assert probe.error_counts["blank value"] >= 2


def test_dcgm_truncated_text_is_a_clear_counted_error(exporter):
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        exporter.cut_mid_line = True
        with pytest.raises(ProbeError, match="truncated"):
            probe.collect()
        exporter.cut_mid_line = False
        exporter.short_body = True
        with pytest.raises(ProbeError, match="truncated"):
            probe.collect()
        exporter.short_body = False
        assert by(probe.collect(), "hw.gpu.temperature")  # the next good scrape is used
    assert probe.error_counts["truncated"] == 2


def test_dcgm_bad_lines_and_http_errors(exporter):
    exporter.garbage_line = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-broken" 12'
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        assert by(probe.collect(), "hw.gpu.temperature")  # the other lines are kept
        assert probe.error_counts["bad line"] >= 1
        exporter.status = 503
        with pytest.raises(ProbeError, match="HTTP 503"):
            probe.collect()


def test_dcgm_legacy_and_dcgm4_spellings_and_mig(exporter):
    exporter.legacy = True
    legacy = DcgmExporterProbe(url=exporter.url, hostname="gpu-node-1")
    with legacy:
        s = legacy.collect()
    assert one(s, "hw.gpu.temperature", **{"hw.id": exporter.gpus[1].uuid}).value == 47
    assert one(s, "hw.gpu.utilization", **{"hw.id": exporter.gpus[1].uuid}).value == pytest.approx(0.87)
    assert one(s, "sloscope.gpu.sm.active", **{"hw.id": exporter.gpus[1].uuid}).value == pytest.approx(0.8125)

    exporter.legacy, exporter.dcgm4_names = False, True  # a counters file written with DCGM 4.x names
    exporter.gpus.append(DcgmGpu(0, exporter.gpus[0].uuid, mig_instance="3",
                                 fields={"DCGM_FI_PROF_SM_ACTIVE": 0.25}))
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        s = probe.collect()
    text = exporter.exposition()
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in text and "DCGM_FI_PROF_SM_UTIL_RATIO" in text
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO{" in text and " 87\n" in text  # still a percentage
    assert one(s, "hw.gpu.utilization", **{"hw.id": exporter.gpus[0].uuid}).value == pytest.approx(0.87)
    assert one(s, "sloscope.gpu.dram.active", **{"hw.id": exporter.gpus[0].uuid}).value == pytest.approx(0.4375)
    assert one(s, "hw.gpu.temperature", **{"hw.id": exporter.gpus[0].uuid}).value == 47
    assert one(s, "sloscope.gpu.sm.active", **{"hw.id": exporter.gpus[0].uuid + "/gi3"}).value == 0.25

    other_host = DcgmExporterProbe(url=exporter.url, hostname="another-node")
    assert not other_host.check().ok  # every row belongs to gpu-node-1


def test_dcgm_unreachable_is_named_and_falls_back_to_nvml(exporter):
    gpu = FakeGpu("GPU-11111111-2222-3333-4444-555555555555")
    url = exporter.url
    exporter.stop()  # nothing listens on that port any more
    missing = DcgmExporterProbe(url=url, timeout=1.0).check().missing
    assert missing == (f"dcgm-exporter at {url}: connection refused (dcgm-exporter not running, or on another "
                       "port: --dcgm-url)",)
    nv = FakeNvml([gpu])
    with ProbeSet(["dcgm"], options={"dcgm": {"url": url}, "nvml": {"nvml": nv}}) as probes:
        (decision,) = probes.decisions
        assert decision.running == ("nvml",) and "connection refused" in decision.missing[0]
        assert decision.lost_signals == ("sloscope.gpu.sm.active", "sloscope.gpu.dram.active")


def test_dcgm_default_fields_cover_every_mapped_field():
    assert set(default_fields()) >= {f for f, m in dcgm.FIELDS.items() if dcgm.STOCK_NAME[m.key] == f
                                      and m.key != "fb_total"}


# -- DCGM's own field list -------------------------------------------------------------------------------------

def test_every_mapped_field_is_dcgms_with_its_id_type_and_unit():
    for name, f in dcgm.FIELDS.items():
        assert name in DCGM_FIELDS, f"{name} is not a DCGM field"
        assert DCGM_FIELDS[name] == (f.field_id, f.dcgm_type, f.unit), name
    assert not set(NOT_DCGM_FIELDS) & set(dcgm.FIELDS)


def test_unknown_ratio_names_are_not_guessed(exporter):
    exporter.counters = tuple(c for c in exporter.counters if c != "DCGM_FI_PROF_SM_ACTIVE")
    uuid = exporter.gpus[0].uuid
    exporter.garbage_line = f'DCGM_FI_PROF_SM_ACTIVE_RATIO{{gpu="0",UUID="{uuid}"}} 0.5'
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        samples = probe.collect()
    assert by(samples, "sloscope.gpu.sm.active") == []
    assert probe.missing_signals() == {"sloscope.gpu.sm.active": "DCGM_FI_PROF_SM_ACTIVE"}


# -- a stock dcgm-exporter, and sloscope's counters file --------------------------------------------------------

def test_the_stand_in_serves_the_stock_counters_by_default():
    fake = FakeDcgmExporter()
    names = {line.split("{")[0] for line in fake.exposition().splitlines() if not line.startswith("#")}
    assert names == set(STOCK_COUNTERS)
    assert "DCGM_FI_PROF_SM_ACTIVE" not in names and not any("NVLINK_TX_BYTES" in n for n in names)


def test_against_a_stock_exporter_the_probe_names_each_missing_field_once(caplog):
    with FakeDcgmExporter() as exporter, ProbeSet(["dcgm"], options={"dcgm": {"url": exporter.url}}) as probes:
        with caplog.at_level(logging.WARNING, logger="sloscope.probes.gpu.dcgm_exporter"):
            for _ in range(3):
                samples = probes.collect()
        probe = probes.probes["dcgm"]
        health = {s.attributes["sloscope.signal.name"]: (s.value, s.attributes.get("probe.needs"))
                  for s in probes.health(1) if s.name == "sloscope.probe.signal.health"}
    assert by(samples, "sloscope.gpu.sm.active") == []
    assert by(samples, "hw.gpu.io", **{"sloscope.gpu.link": "pcie"})  # the stock file has the PCIe rates
    assert by(samples, "hw.gpu.io", **{"sloscope.gpu.link": "nvlink"}) == []
    assert health["sloscope.gpu.sm.active"] == (0.0, "DCGM_FI_PROF_SM_ACTIVE")
    assert health["hw.gpu.io"] == (0.0, "DCGM_FI_PROF_NVLINK_TX_BYTES,DCGM_FI_PROF_NVLINK_RX_BYTES")
    assert health["sloscope.gpu.dram.active"] == (1.0, None) and health["hw.gpu.utilization"] == (1.0, None)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("does not serve DCGM_FI_PROF_SM_ACTIVE" in w for w in warnings) == 1  # once, by name
    assert any("deploy/dcgm-exporter-counters.csv" in n for n in probe.notes)


def test_sloscopes_counters_file_enables_every_field_the_probe_needs():
    enabled = set(load_counters(COUNTERS))
    needed = {dcgm.STOCK_NAME[key] for keys in dcgm.NEEDS.values() for key in keys}
    assert needed <= enabled <= set(DCGM_FIELDS)  # nothing more, and every name DCGM's own
    with FakeDcgmExporter(counters=tuple(enabled)) as exporter:
        probe = DcgmExporterProbe(url=exporter.url)
        with probe:
            samples = probe.collect()
    assert probe.missing_signals() == {}
    assert {s.name for s in samples} == set(DcgmExporterProbe.signals)


def test_a_missing_field_shows_on_metrics(tmp_path):
    """From the probe set's health samples through the store to sloscope serve's /metrics text."""
    from sloscope import metric_names
    from sloscope.alerts.store_metrics import StoreCollector
    from sloscope.analytics.store import Store
    from sloscope.slo_spec import load_spec
    from tests.otlp_builders import gauge, metrics
    from tests.alerts.test_store_metrics import ingest, scrape, value

    now_ns = 1_764_410_400 * 10**9
    with FakeDcgmExporter() as exporter, ProbeSet(["dcgm"], options={"dcgm": {"url": exporter.url}}) as probes:
        health = probes.health(now_ns)
    lines = [metrics([gauge(s.name, [(s.time_unix_nano, s.value)], s.attributes) for s in health], node="gpu-node-1")]
    with Store(tmp_path / "db.duckdb") as store:
        ingest(store, tmp_path, lines)
        families = scrape(StoreCollector(store.reading, load_spec(None), clock=lambda: now_ns / 1e9 + 5))
    up = metric_names.PROBE_SIGNAL_UP
    assert value(families, up, up, node="gpu-node-1", probe="dcgm", signal="sloscope.gpu.sm.active",
                 needs="DCGM_FI_PROF_SM_ACTIVE") == 0.0
    assert value(families, up, up, node="gpu-node-1", probe="dcgm", signal="sloscope.gpu.dram.active") == 1.0


# -- the Helm values that mount sloscope's counters file ------------------------------------------------------

def test_dcgm_exporter_values_mount_the_counters_file_it_runs_with():
    values = yaml.safe_load((REPO / "deploy" / "dcgm-exporter-values.yaml").read_text())
    args = values["arguments"]
    path = args[args.index("-f") + 1]
    (mount,) = [m for m in values["extraVolumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in values["extraConfigMapVolumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["configMap"]["items"] if i["path"] == mount["subPath"]]
    # the ConfigMap the values name is the one the documented command creates from deploy/
    command = (f"create configmap {volume['configMap']['name']} "
               f"--from-file={item['key']}=deploy/dcgm-exporter-counters.csv")
    for name in ("dcgm-exporter-values.yaml", "dcgm-exporter-counters.csv"):
        assert command in " ".join((REPO / "deploy" / name).read_text().replace("\\\n#", " ").split()), name


def test_dcgm_exporter_counters_file_is_in_the_exporters_format():
    rows = [line.split(",") for line in COUNTERS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert all(len(r) == 3 and r[1].strip() in ("gauge", "counter", "label") and r[2].strip() for r in rows)
    needed = {dcgm.STOCK_NAME[key] for keys in dcgm.NEEDS.values() for key in keys}
    assert {r[0].strip() for r in rows if r[1].strip() != "label"} == needed
