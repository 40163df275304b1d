"""GPU probes: NVML windowing, units and error handling against an NVML stand-in that behaves as drivers do
(and the real pynvml without a driver); both GPU paths fed the same GPU behaviour; the GPU memory-leak rule
at the probe's own timestamps through promtool; the GPU check script. dcgm-exporter: test_probe_dcgm.py."""

import logging
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sloscope.probes import base as probe_base
from sloscope.probes.base import ProbeError, ProbeUnavailable
from sloscope.probes.gpu.dcgm_exporter import DcgmExporterProbe
from sloscope.probes.gpu.nvml import NvmlProbe
from sloscope.probes.registry import ProbeSet
from sloscope.alerts.node_rules import LEAK_HOLD
from sloscope.alerts.rules import render_rules
from sloscope import catalog, taxonomy
from sloscope.slo_spec import DEFAULT_SPEC_YAML, parse_spec
from tests.conftest import need
from tests.fakes import nvml as fake_nvml
from tests.fakes.dcgm_exporter import FakeDcgmExporter, load_counters
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.probe_asserts import by, one, assert_catalog_samples

REPO = Path(__file__).resolve().parents[2]
UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-66666666-7777-8888-9999-000000000000"


# -- NVML: the stand-in against the real bindings -------------------------------------------------------------

def test_fake_nvml_constants_are_pynvml_values():
    import pynvml  # the bindings import without a driver; only nvmlInit needs libnvidia-ml.so

    for name in fake_nvml.CONSTANTS + list(fake_nvml.STRUCT_VERSIONS):
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


def test_kernel_busy_max_is_the_max_of_new_samples_per_window_and_0_when_idle(gpu):
    gpu.add_samples(99, 98)  # buffered before the probe started: not part of any window
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    probe.start()
    try:
        gpu.add_samples(10, 30, 20)
        first = probe.collect()
        assert one(first, "sloscope.gpu.kernel.busy.max", **{"hw.id": UUID_A}).value == pytest.approx(0.30)

        gpu.run(2.0, busy=0.0)  # idle: the driver records nothing, NVML_ERROR_NOT_FOUND
        second = probe.collect()
        assert one(second, "sloscope.gpu.kernel.busy.max").value == 0.0  # an idle GPU is 0, not a gap
        assert one(second, "hw.gpu.utilization").value == 0.0
        assert not probe.error_counts and probe.healthy

        gpu.add_samples(70, 5)
        third = probe.collect()
        assert one(third, "sloscope.gpu.kernel.busy.max").value == pytest.approx(0.70)
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
    assert one(samples, "sloscope.gpu.memory.reserved").value == 512 * 2**20
    assert one(samples, "hw.gpu.temperature").value == 61
    assert_catalog_samples(samples)
    assert gpu.calls["nvmlDeviceGetTemperature"] == 0  # the current call, not the deprecated one


def test_memory_v1_on_old_drivers_includes_reserved_and_says_so(gpu):
    gpu.memory_v2 = False  # a driver before R510
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with probe:
        first, second = probe.collect(), probe.collect()
    assert one(second, "hw.gpu.memory.usage").value == 20 * 2**30 + 512 * 2**20  # v1: used includes reserved
    assert by(first, "sloscope.gpu.memory.reserved") == []
    assert sum("memory v2 not supported" in n for n in probe.notes) == 1 and not probe.error_counts
    assert probe.missing_signals() == {"sloscope.gpu.memory.reserved": "nvmlDeviceGetMemoryInfo_v2"}
    assert gpu.calls["nvmlDeviceGetMemoryInfo"] == 3  # v2 refused once, then v1 each collect


def test_temperature_falls_back_between_the_current_and_the_deprecated_call(gpu):
    gpu.temperature_v = False  # an old driver: only the deprecated call
    old = NvmlProbe(nvml=FakeNvml([gpu]))
    with old:
        assert one(old.collect(), "hw.gpu.temperature").value == 61
    new_gpu = FakeGpu(UUID_B, temperature=55, legacy_temperature=False)  # the deprecated call is gone
    new = NvmlProbe(nvml=FakeNvml([new_gpu]))
    with new:
        assert one(new.collect(), "hw.gpu.temperature").value == 55
    assert new_gpu.calls["nvmlDeviceGetTemperature"] == 0 and not new.notes


def test_per_process_values_above_100_are_clamped(gpu):
    probe = NvmlProbe(nvml=FakeNvml([gpu]), per_process=True)
    with probe:
        gpu.add_process_samples(4242, 104, 100)  # drivers report more than 100 %
        gpu.add_samples(101)
        samples = probe.collect()
    (proc,) = [s for s in by(samples, "hw.gpu.utilization") if "process.pid" in s.attributes]
    assert proc.value == 1.0
    assert one(samples, "sloscope.gpu.kernel.busy.max").value == 1.0


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
    gpu.fail["nvmlDeviceGetTemperatureV"] = (fake_nvml.NVML_ERROR_NOT_SUPPORTED, None)
    gpu.fail["nvmlDeviceGetTemperature"] = (fake_nvml.NVML_ERROR_NOT_SUPPORTED, None)
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with caplog.at_level(logging.INFO, logger="sloscope.probes.gpu.nvml"), probe:
        for _ in range(4):
            samples = probe.collect()
    assert by(samples, "hw.gpu.io") == [] and by(samples, "hw.gpu.temperature") == []
    assert by(samples, "hw.gpu.memory.usage")
    assert gpu.calls["nvmlDeviceGetFieldValues"] == 1  # asked at start, never again
    assert gpu.calls["nvmlDeviceGetTemperature"] == gpu.calls["nvmlDeviceGetTemperatureV"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert sum("nvlink not supported" in m for m in lines) == 1
    assert sum("temperature not supported" in m for m in lines) == 1
    assert sum("temperature (deprecated call) not supported" in m for m in lines) == 1
    assert len(probe.notes) == 3 and probe.healthy and not probe.error_counts


def test_transient_errors_are_counted_and_retried(gpu):
    gpu.fail["nvmlDeviceGetMemoryInfo"] = (fake_nvml.NVML_ERROR_TIMEOUT, 1)
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    with probe:
        first = probe.collect()
        second = probe.collect()
    assert by(first, "hw.gpu.memory.usage") == [] and by(first, "hw.gpu.temperature")
    assert one(second, "hw.gpu.memory.usage").value == gpu.memory_used
    assert probe.error_counts == {"memory v2": 1} and probe.healthy


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


# -- one GPU behaviour through both paths -------------------------------------------------------------------

@pytest.fixture
def both_paths(gpu):
    """The same GPU seen by NVML (stand-in driver) and by dcgm-exporter with sloscope's counters file."""
    gpu.uuid = UUID_A
    exporter = FakeDcgmExporter(counters=load_counters(REPO / "deploy" / "dcgm-exporter-counters.csv")).start()
    exporter.gpus = exporter.gpus[:1]
    exporter.gpus[0].uuid = UUID_A
    free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
    for field, value in (("FB_USED", gpu.memory_used), ("FB_RESERVED", gpu.memory_reserved), ("FB_FREE", free)):
        exporter.set(0, "DCGM_FI_DEV_" + field, value // 2**20)  # DCGM reports MiB
    try:
        yield gpu, exporter
    finally:
        exporter.stop()


def play(gpu, exporter, seconds, kernel_busy, sm_share):
    gpu.run(seconds, busy=kernel_busy)
    exporter.play(0, kernel_busy, sm_share)


H200_SMS = 132


@pytest.mark.parametrize("phase, kernel_busy, sm_share", [
    ("idle", 0.0, 0.0),
    ("one small kernel", 1.0, 1 / H200_SMS),
    ("saturating co-tenant", 1.0, 0.97),
])
def test_both_paths_give_comparable_series_for_the_same_gpu_behaviour(both_paths, phase, kernel_busy, sm_share):
    gpu, exporter = both_paths
    nvml, dcgm = NvmlProbe(nvml=FakeNvml([gpu])), DcgmExporterProbe(url=exporter.url)
    with nvml, dcgm:
        play(gpu, exporter, 2.0, kernel_busy, sm_share)
        from_nvml, from_dcgm = nvml.collect(), dcgm.collect()
    hw = {"hw.id": UUID_A}
    # the signal both paths have agrees
    assert one(from_nvml, "hw.gpu.utilization", **hw).value == one(from_dcgm, "hw.gpu.utilization", **hw).value \
        == pytest.approx(kernel_busy)
    # each path's SM signal under its own name, with its own meaning
    assert one(from_nvml, "sloscope.gpu.kernel.busy.max", **hw).value == pytest.approx(kernel_busy)
    assert one(from_dcgm, "sloscope.gpu.sm.active", **hw).value == pytest.approx(sm_share, abs=1e-6)
    assert by(from_nvml, "sloscope.gpu.sm.active") == [] and by(from_dcgm, "sloscope.gpu.kernel.busy.max") == []
    # memory: used without the reserved part on both, reserved apart, the same size
    for name in ("hw.gpu.memory.usage", "sloscope.gpu.memory.reserved", "hw.gpu.memory.limit"):
        assert one(from_nvml, name, **hw).value == one(from_dcgm, name, **hw).value, name
    assert_catalog_samples(from_nvml + from_dcgm)


def test_the_taxonomy_reads_both_sm_signals_as_evidence():
    evidence = {e.signal for e in taxonomy.BY_ID["gpu_sm_contention"].evidence}
    assert {"sloscope.gpu.kernel.busy.max", "sloscope.gpu.sm.active"} <= evidence
    assert "sloscope.gpu.sm.active.max" not in catalog.BY_NAME  # the signal that meant two things is gone


# -- the GPU memory-leak rule, at the probe's own timestamps ---------------------------------------------------

COLLECT_EVERY_S = 5  # the node collector's default interval


def probe_memory_series(monkeypatch, gpu, used_at) -> list[tuple[int, float]]:
    """(time_unix_nano, bytes) of hw.gpu.memory.usage as the NVML probe reports it, one collect every 5 s for
    ten minutes, starting now; `used_at(seconds)` is what the workload holds then."""
    clock = [time.time_ns()]
    monkeypatch.setattr(probe_base, "now_ns", lambda: clock[0])  # the probes' one clock
    probe = NvmlProbe(nvml=FakeNvml([gpu]))
    out = []
    with probe:
        for i in range(10 * 60 // COLLECT_EVERY_S + 1):
            clock[0] += COLLECT_EVERY_S * 10**9
            gpu.memory_used = int(used_at(i * COLLECT_EVERY_S))
            s = one(probe.collect(), "hw.gpu.memory.usage")
            out.append((s.time_unix_nano, s.value))
    return out


def seconds(duration: str) -> int:
    """Seconds of a Prometheus duration as promtool prints it (3m15s)."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration))


def leak_alert_times(tmp_path, series: list[tuple[int, float]]) -> list[int]:
    """Seconds after the first sample at which promtool finds SloscopeGpuMemoryLeak firing, the generated rules
    evaluated every 5 s over the series as Prometheus would scrape it."""
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    steps = {b - a for (a, _), (b, _) in zip(series, series[1:])}
    assert steps == {COLLECT_EVERY_S * 10**9}  # the probe's own cadence, in ns
    (tmp_path / "rules.yml").write_text(render_rules(parse_spec(DEFAULT_SPEC_YAML)))
    checks = list(range(0, len(series) * COLLECT_EVERY_S, 15))
    test = {"rule_files": ["rules.yml"], "evaluation_interval": f"{COLLECT_EVERY_S}s", "tests": [{
        "interval": f"{COLLECT_EVERY_S}s",
        "input_series": [{"series": 'sloscope_gpu_memory_used_bytes{node="n1",gpu="GPU-a"}',
                          "values": " ".join(f"{v:.0f}" for _, v in series)}],
        "alert_rule_test": [{"alertname": "SloscopeGpuMemoryLeak", "eval_time": f"{t}s", "exp_alerts": []}
                            for t in checks]}]}
    (tmp_path / "leak.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(["promtool", "test", "rules", "leak.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    # every check expects silence; the ones that fail are the times the alert fired
    report = done.stdout + done.stderr
    fired = [seconds(m) for m in re.findall(r"alertname: SloscopeGpuMemoryLeak, time: (\w+),", report)]
    assert done.returncode == (1 if fired else 0), report
    return sorted(set(fired))


GIB = 2**30


def test_leak_rule_fires_on_steady_growth_three_steps_and_its_hold_after_it_starts(monkeypatch, tmp_path, gpu):
    rate = taxonomy.GPU_MEMORY_LEAK.per_step + 0.03  # 8 % a minute
    series = probe_memory_series(monkeypatch, gpu, lambda t: 10 * GIB * (1 + rate) ** (t / 60))
    fired = leak_alert_times(tmp_path, series)
    rule = taxonomy.GPU_MEMORY_LEAK
    first_possible = rule.in_a_row * rule.step_s + seconds(LEAK_HOLD)  # each step needs the reading one before it
    assert fired == list(range(first_possible, len(series) * COLLECT_EVERY_S, 15))  # from then on, every check


@pytest.mark.parametrize("shape", ["flat", "slow", "sawtooth"])
def test_leak_rule_is_quiet_on_flat_slow_and_allocator_sawtooth(monkeypatch, tmp_path, gpu, shape):
    used = {
        "flat": lambda t: 20 * GIB,
        "slow": lambda t: 10 * GIB * 1.04 ** (t / 60),  # 4 % a minute: under the threshold
        # a caching allocator: +30 % in 40 s, then it gives the memory back
        "sawtooth": lambda t: 10 * GIB * (1 + 0.3 * min(t % 60, 40) / 40 if t % 60 < 40 else 1.0),
    }[shape]
    assert leak_alert_times(tmp_path, probe_memory_series(monkeypatch, gpu, used)) == []


# -- the GPU check script, on the stand-ins --------------------------------------------------------------------

def test_gpu_check_prints_both_sm_signals_for_each_path(monkeypatch, capsys, both_paths):
    import importlib.util

    gpu, exporter = both_paths
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    nv = FakeNvml([gpu])
    monkeypatch.setattr(script, "NvmlProbe", lambda per_process: NvmlProbe(nvml=nv, per_process=per_process))
    monkeypatch.setattr(script, "DcgmExporterProbe", lambda url: DcgmExporterProbe(url=exporter.url))
    monkeypatch.setattr(script, "torch_cuda_problem", lambda: "torch is not installed")
    real_sleep = script.time.sleep

    def sleep(seconds):  # one small kernel running during the window
        play(gpu, exporter, 0.5, 1.0, 1 / H200_SMS)
        real_sleep(seconds)

    monkeypatch.setattr(script.time, "sleep", sleep)
    assert script.main(["--seconds", "0.2", "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[2:5] for line in out.splitlines() if UUID_A in line}
    assert rows["nvml"] == ["1.000", "-", "1.000"]  # kernel busy all the time, no SM share on this path
    assert rows["dcgm"] == ["-", "0.008", "1.000"]  # one SM in 132 has work
    assert "one small kernel: skipped: torch is not installed" in out
    assert nv.inits == nv.shutdowns == 2


def test_gpu_check_without_a_gpu_is_one_line(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "NvmlProbe", lambda per_process: NvmlProbe(
        nvml=FakeNvml([], init_error=fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)))
    assert script.main(["--dcgm-url", "http://127.0.0.1:9/metrics"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("gpu_check: no NVIDIA GPU path to check here (nvml: NVIDIA driver:")
