"""GPU probes: NVML windowing, units and error handling against an NVML stand-in (and the real pynvml without a
driver), dcgm-exporter scraping against a fake exporter on 127.0.0.1, and the GPU memory-leak rule."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from probes.base import ProbeError, ProbeUnavailable
from probes.gpu import dcgm_exporter as dcgm
from probes.gpu.dcgm_exporter import DcgmExporterProbe, parse_exposition, TruncatedExposition
from probes.gpu.leak import LeakDetector, detect_leak, growth_per_min
from probes.gpu.nvml import NvmlProbe
from probes.registry import ProbeSet
from probes.sample import Sample
from sloscope import catalog
from tests.fakes import nvml as fake_nvml
from tests.fakes.dcgm_exporter import FakeDcgmExporter, FakeGpu as DcgmGpu, default_fields
from tests.fakes.nvml import FakeGpu, FakeNvml

REPO = Path(__file__).resolve().parents[1]
UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-66666666-7777-8888-9999-000000000000"


def by(samples, name, **attrs):
    return [s for s in samples if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())]


def one(samples, name, **attrs):
    found = by(samples, name, **attrs)
    assert len(found) == 1, (name, attrs, found)
    return found[0]


def assert_catalog_samples(samples):
    for s in samples:
        assert isinstance(s, Sample)
        sig = catalog.signal(s.name)
        assert set(s.attributes) <= set(sig.attributes), (s.name, s.attributes)
        assert s.kind == ("gauge" if sig.instrument == catalog.Instrument.GAUGE else "counter_delta")
        assert s.start_time_unix_nano <= s.time_unix_nano


# -- NVML: the stand-in against the real bindings -------------------------------------------------------------

def test_fake_nvml_constants_are_pynvml_values():
    import pynvml  # the bindings import without a driver; only nvmlInit needs libnvidia-ml.so

    for name in fake_nvml.CONSTANTS:
        if name != "NVML_ERROR_UNKNOWN" or hasattr(pynvml, name):
            assert getattr(pynvml, name) == getattr(fake_nvml, name), name


def test_package_imports_without_pynvml():
    code = "import sys, probes.registry, probes.gpu.nvml, probes.cli; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_real_nvml_on_this_host_is_one_clear_line_or_works():
    probe = NvmlProbe()
    availability = probe.check()
    if availability.ok:  # a host with an NVIDIA driver: the real path must produce samples
        with probe:
            samples = probe.collect()
        assert by(samples, "hw.gpu.memory.limit")
        assert_catalog_samples(samples)
    else:
        assert len(availability.missing) == 1
        assert availability.missing[0].startswith(("NVIDIA driver:", "NVML:")), availability.missing
        with pytest.raises(ProbeUnavailable) as err:
            probe.start()
        assert err.value.missing == availability.missing and not probe.running


# -- NVML: availability ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("code, text", [
    (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND,
     "NVIDIA driver: libnvidia-ml.so not found (no NVIDIA driver on this host)"),
    (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver: installed but not loaded"),
    (fake_nvml.NVML_ERROR_NO_PERMISSION, "NVIDIA driver: no permission"),
])
def test_no_driver_is_one_clear_message(code, text):
    nv = FakeNvml([FakeGpu(UUID_A)], init_error=code)
    probe = NvmlProbe(nvml=nv)
    missing = probe.check().missing
    assert len(missing) == 1 and missing[0].startswith(text)
    with pytest.raises(ProbeUnavailable) as err:
        probe.start()
    assert err.value.missing == missing and not probe.running


def test_no_gpu_and_init_balance():
    nv = FakeNvml([])
    probe = NvmlProbe(nvml=nv)
    assert probe.check().missing == ("NVML: no NVIDIA GPU on this host",)
    with pytest.raises(ProbeUnavailable):
        probe.start()
    assert nv.inits == nv.shutdowns == 2  # every nvmlInit is paired with an nvmlShutdown


# -- NVML: windowing and units --------------------------------------------------------------------------------

@pytest.fixture
def gpu():
    return FakeGpu(UUID_A, utilization=42, memory_used=20 * 2**30, memory_total=80 * 2**30, temperature=61,
                   nvlink_tx_kib=1000, nvlink_rx_kib=5000)


def test_sm_active_max_is_the_max_of_new_samples_per_window(gpu):
    gpu.add_samples(99, 98)  # buffered before the probe started: not part of any window
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    probe.start()
    try:
        gpu.add_samples(10, 30, 20)
        first = probe.collect()
        assert one(first, "sloscope.gpu.sm.active.max", **{"hw.id": UUID_A}).value == pytest.approx(0.30)

        second = probe.collect()  # the driver has nothing new: NVML_ERROR_NOT_FOUND, not an error
        assert by(second, "sloscope.gpu.sm.active.max") == []
        assert by(second, "hw.gpu.utilization")  # the rest of the GPU is still reported
        assert not probe.error_counts and probe.healthy

        gpu.add_samples(70, 5)
        third = probe.collect()
        assert one(third, "sloscope.gpu.sm.active.max").value == pytest.approx(0.70)
    finally:
        probe.stop()
    # each query continued from the newest timestamp already seen: no sample counted twice or skipped
    marks = [ts for kind, ts in gpu.seen if kind == "samples"]  # start, window 1, 2 (empty), 3
    assert marks[0] == 0 < marks[1] < marks[2] == marks[3]


def test_nvml_gauges_and_units(gpu):
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with probe:
        samples = probe.collect()
    util = one(samples, "hw.gpu.utilization")
    assert util.value == pytest.approx(0.42) and util.attributes == {"hw.id": UUID_A, "hw.gpu.task": "general"}
    assert one(samples, "hw.gpu.memory.usage").value == 20 * 2**30
    assert one(samples, "hw.gpu.memory.limit").value == 80 * 2**30
    assert one(samples, "hw.gpu.temperature").value == 61
    assert_catalog_samples(samples)


def test_nvlink_bytes_from_the_aggregate_scope_as_deltas(gpu):
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with probe:
        gpu.nvlink_tx_kib += 4096  # 4 MiB sent over all links together
        gpu.nvlink_rx_kib += 1024
        s1 = probe.collect()
        tx = one(s1, "hw.gpu.io", **{"network.io.direction": "transmit"})
        rx = one(s1, "hw.gpu.io", **{"network.io.direction": "receive"})
        assert (tx.value, rx.value) == (4096 * 1024, 1024 * 1024)
        assert tx.kind == "counter_delta" and tx.attributes["sloscope.gpu.link"] == "nvlink"
        assert set(gpu.scopes) == {0xFFFFFFFF}  # never one link's counter

        assert [s.value for s in by(probe.collect(), "hw.gpu.io")] == [0.0, 0.0]  # nothing new
        gpu.nvlink_tx_kib = 10  # driver reloaded: the counter restarted
        s3 = probe.collect()
        assert one(s3, "hw.gpu.io", **{"network.io.direction": "transmit"}).value == 0.0
        gpu.nvlink_tx_kib += 100
        assert one(probe.collect(), "hw.gpu.io", **{"network.io.direction": "transmit"}).value == 100 * 1024


def test_unsupported_fields_are_skipped_once_with_one_log_line(gpu, caplog):
    gpu.field_returns = {fake_nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: fake_nvml.NVML_ERROR_NOT_SUPPORTED,
                         fake_nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: fake_nvml.NVML_ERROR_NOT_SUPPORTED}
    gpu.fail["nvmlDeviceGetTemperature"] = (fake_nvml.NVML_ERROR_NOT_SUPPORTED, None)
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with caplog.at_level(logging.INFO, logger="probes.gpu.nvml"), probe:
        for _ in range(4):
            samples = probe.collect()
    assert by(samples, "hw.gpu.io") == [] and by(samples, "hw.gpu.temperature") == []
    assert by(samples, "hw.gpu.memory.usage")
    assert gpu.calls["nvmlDeviceGetFieldValues"] == 1  # asked at start, never again
    assert gpu.calls["nvmlDeviceGetTemperature"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert sum("nvlink not supported" in m for m in lines) == 1
    assert sum("temperature not supported" in m for m in lines) == 1
    assert len(probe.notes) == 2 and probe.healthy and not probe.error_counts


def test_transient_errors_are_counted_and_retried(gpu):
    gpu.fail["nvmlDeviceGetMemoryInfo"] = (fake_nvml.NVML_ERROR_TIMEOUT, 1)
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with probe:
        first = probe.collect()
        second = probe.collect()
    assert by(first, "hw.gpu.memory.usage") == [] and by(first, "hw.gpu.temperature")
    assert one(second, "hw.gpu.memory.usage").value == gpu.memory_used
    assert probe.error_counts == {"memory": 1} and probe.healthy


def test_a_lost_gpu_marks_the_probe_unhealthy_and_the_rest_go_on(gpu):
    other = FakeGpu(UUID_B, utilization=7)
    probe = NvmlProbe(nvml=FakeNvml([gpu, other]))
    with probe:
        assert {s.attributes["hw.id"] for s in probe.collect()} == {UUID_A, UUID_B}
        gpu.lost = True
        samples = probe.collect()
        assert {s.attributes["hw.id"] for s in samples} == {UUID_B}
        assert not probe.healthy and any(UUID_A in n and "lost" in n for n in probe.notes)
        calls = sum(gpu.calls.values())
        assert one(probe.collect(), "hw.gpu.utilization").value == pytest.approx(0.07)
        assert sum(gpu.calls.values()) == calls  # a lost GPU is not asked again
        other.lost = True
        with pytest.raises(ProbeError, match="every GPU is lost"):
            probe.collect()


def test_per_process_sm_utilization(gpu):
    gpu.add_process_samples(4242, 90)  # before start: not in any window
    probe = NvmlProbe(nvml=FakeNvml([gpu]), per_process=True)
    with probe:
        gpu.add_process_samples(4242, 50, 70)
        gpu.add_process_samples(777, 10)
        samples = probe.collect()
        procs = {s.attributes["process.pid"]: s.value for s in by(samples, "hw.gpu.utilization")
                 if "process.pid" in s.attributes}
        assert procs == {4242: pytest.approx(0.60), 777: pytest.approx(0.10)}
        assert_catalog_samples(samples)
        again = probe.collect()  # no new process samples: NOT_FOUND is "nothing new"
        assert [s for s in by(again, "hw.gpu.utilization") if "process.pid" in s.attributes] == []
        assert not probe.error_counts


def test_nvml_in_a_probe_set_with_injected_module(gpu):
    nv = FakeNvml([gpu])
    with ProbeSet(["nvml"], options={"nvml": {"nvml": nv}}) as probes:
        assert [d.running for d in probes.decisions] == [("nvml",)]
        assert by(probes.collect(), "hw.gpu.temperature")
    assert nv.inits == nv.shutdowns


# -- dcgm-exporter --------------------------------------------------------------------------------------------

@pytest.fixture
def exporter():
    fake = FakeDcgmExporter().start()
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
    assert one(samples, "sloscope.gpu.sm.active.max", **hw).value == pytest.approx(0.8125)
    assert one(samples, "sloscope.gpu.dram.active", **hw).value == pytest.approx(0.4375)
    util = one(samples, "hw.gpu.utilization", **hw)
    assert util.value == pytest.approx(0.87) and util.attributes["hw.gpu.task"] == "general"
    assert one(samples, "hw.gpu.memory.usage", **hw).value == 20500 * 2**20
    assert one(samples, "hw.gpu.memory.limit", **hw).value == (20500 + 60000 + 559) * 2**20
    assert one(samples, "hw.gpu.temperature", **hw).value == 47
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
    assert by(samples, "hw.gpu.memory.usage", **hw) == [] and by(samples, "sloscope.gpu.sm.active.max", **hw) == []
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


def test_dcgm_legacy_spellings_ratio_names_and_mig(exporter):
    exporter.legacy = True
    legacy = DcgmExporterProbe(url=exporter.url, hostname="gpu-node-1")
    with legacy:
        s = legacy.collect()
    assert one(s, "hw.gpu.temperature", **{"hw.id": exporter.gpus[1].uuid}).value == 47
    assert one(s, "hw.gpu.utilization", **{"hw.id": exporter.gpus[1].uuid}).value == pytest.approx(0.87)
    assert one(s, "sloscope.gpu.sm.active.max", **{"hw.id": exporter.gpus[1].uuid}).value == pytest.approx(0.8125)

    exporter.legacy, exporter.ratio_names = False, True
    exporter.gpus.append(DcgmGpu(0, exporter.gpus[0].uuid, mig_instance="3",
                                 fields={"DCGM_FI_PROF_SM_ACTIVE": 0.25}))
    probe = DcgmExporterProbe(url=exporter.url)
    with probe:
        s = probe.collect()
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in exporter.exposition()
    assert one(s, "hw.gpu.utilization", **{"hw.id": exporter.gpus[0].uuid}).value == pytest.approx(0.87)
    assert one(s, "sloscope.gpu.dram.active", **{"hw.id": exporter.gpus[0].uuid}).value == pytest.approx(0.4375)
    assert one(s, "sloscope.gpu.sm.active.max", **{"hw.id": exporter.gpus[0].uuid + "/gi3"}).value == 0.25

    other_host = DcgmExporterProbe(url=exporter.url, hostname="another-node")
    assert not other_host.check().ok  # every row belongs to gpu-node-1


def test_dcgm_unreachable_is_named_and_falls_back_to_nvml(exporter, gpu):
    url = exporter.url
    exporter.stop()  # nothing listens on that port any more
    missing = DcgmExporterProbe(url=url, timeout=1.0).check().missing
    assert missing == (f"dcgm-exporter at {url}: connection refused (dcgm-exporter not running, or on another "
                       "port: --dcgm-url)",)
    nv = FakeNvml([gpu])
    with ProbeSet(["dcgm"], options={"dcgm": {"url": url}, "nvml": {"nvml": nv}}) as probes:
        (decision,) = probes.decisions
        assert decision.running == ("nvml",) and "connection refused" in decision.missing[0]
        assert decision.lost_signals == ("sloscope.gpu.dram.active",)


def test_dcgm_default_fields_cover_every_mapped_field():
    assert set(default_fields()) >= {f for f in dcgm.FIELDS if not f.endswith("_RATIO") and "TOTAL" not in f}


# -- GPU memory-leak rule -------------------------------------------------------------------------------------

GIB = 2**30


def test_leak_rising_is_flagged_on_the_third_growing_sample():
    samples = [(60.0 * i, 10 * GIB * 1.08**i) for i in range(6)]  # +8 %/min
    detector = LeakDetector()
    flags = [detector.add(t, b).leaking for t, b in samples]
    assert flags == [False, False, False, True, True, True]
    verdict = detect_leak(samples)
    assert verdict.leaking and verdict.since == 0.0 and len(verdict.growth_per_min) == 3
    assert verdict.growth_per_min[0] == pytest.approx(0.08)


def test_leak_flat_and_slow_growth_are_not_flagged():
    assert not detect_leak([(10.0 * i, 20 * GIB) for i in range(30)]).leaking
    slow = [(60.0 * i, 10 * GIB * 1.04**i) for i in range(30)]  # +4 %/min: under the 5 %/min threshold
    assert not detect_leak(slow).leaking


def test_leak_allocator_sawtooth_is_not_flagged():
    # a caching allocator: grows fast for two samples, then returns memory; never 3 growing samples in a row
    levels = [10, 11, 12, 10, 11, 12, 10, 11, 12, 10]
    samples = [(30.0 * i, level * GIB) for i, level in enumerate(levels)]
    assert all(growth_per_min(*samples[i], *samples[i + 1]) > 0.05 for i in (0, 1))
    verdict = detect_leak(samples)
    assert not verdict.leaking and verdict.run == 0


def test_leak_growth_is_per_minute_and_series_are_separate():
    d = LeakDetector()
    # +1 % per 6 s is +10 %/min
    for i in range(4):
        d.add(6.0 * i, 100.0 * 1.01**i, key="a")
        d.add(6.0 * i, 100.0 + i * 0.01, key="b")
    assert d.verdict("a").leaking and not d.verdict("b").leaking
    with pytest.raises(ValueError):
        d.add(6.0, 200.0, key="a")  # time must move forward


# -- the GPU check script's NVML path, on the stand-in ---------------------------------------------------------

def test_gpu_check_script_runs_its_windows_on_the_nvml_path(monkeypatch, capsys, gpu):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    nv = FakeNvml([gpu])
    gpu.add_samples(*[55] * 100)
    gpu.add_process_samples(31337, 80, 90)
    monkeypatch.setattr(script, "NvmlProbe", lambda per_process: NvmlProbe(nvml=nv, per_process=per_process))
    monkeypatch.setattr(script, "torch_cuda_problem", lambda: "torch is not installed")
    real_sleep = script.time.sleep

    def sleep(seconds):  # driver samples arriving during the window
        gpu.add_samples(12, 64, 33)
        real_sleep(seconds)

    monkeypatch.setattr(script.time, "sleep", sleep)
    assert script.main(["--seconds", "0.2", "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith(UUID_A))
    assert row.split()[1:3] == ["0.640", "0.420"]  # peak SM activity of the window, mean utilization
    assert "co-tenant window skipped: torch is not installed" in out
    assert nv.inits == nv.shutdowns == 2
