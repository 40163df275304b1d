"""The node collector: samples -> SDK data model -> OTLP (HTTP and gRPC), configuration precedence, and no
data loss while the endpoint is away (spool, replay in order, resume after a restart, clean SIGTERM)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from sloscope.collectors import config as cfgmod
from sloscope.collectors.agent import Agent, resolve_probe_names
from sloscope.collectors.otlp_metrics import MetricsBuilder, count_points, encode, metrics_data_from_request
from sloscope.collectors.spool_format import decode_record
from sloscope.probes import registry
from sloscope.probes.base import Availability, Probe, ProbeError
from sloscope.probes.sample import HistogramSample, Sample, log2_histogram
from tests.conftest import need
from tests.fakes.otlp_sink import OtlpSink, free_port
from tests.collectors.test_collector_config import write_config

REPO = Path(__file__).resolve().parents[2]
CUMULATIVE, DELTA = 2, 1


# -- a deterministic probe ------------------------------------------------------------------------------------

class CountingProbe(Probe):
    """Every collect: tick += 1; a counter increase of 1, a gauge reading `tick`, one histogram observation of
    ~1 ms. So the k-th interval's points are recognisable: gauge k, cumulative counter k, histogram count k."""

    name = "fake_counting"
    source = "procfs"
    signals = ("sloscope.tcp.retransmits", "hw.gpu.temperature", "sloscope.block.io.duration")

    def __init__(self, host=None):
        super().__init__(host)
        self.tick = 0
        self._running = False
        self._last = 0

    def check(self):
        return Availability(self.name)

    def start(self):
        self._running, self._last = True, time.time_ns()

    def collect(self):
        self.tick += 1
        now = time.time_ns()
        start, self._last = self._last, now
        return [Sample("sloscope.tcp.retransmits", {}, now, 1.0, "counter_delta", start),
                Sample("hw.gpu.temperature", {"hw.id": "fake"}, now, float(self.tick), "gauge", start),
                log2_histogram("sloscope.block.io.duration", {"system.device": "fake0"}, {20: 1}, 0.001, start, now)]

    def stop(self):
        self._running = False

    @property
    def running(self):
        return self._running


@pytest.fixture
def counting_probe(monkeypatch):
    monkeypatch.setitem(registry.PROBES, CountingProbe.name, CountingProbe)
    return CountingProbe


def series(points, name):
    return [p for p in points if p[0] == name]


def make_config(tmp_path, sink=None, **over):
    cfg = cfgmod.CollectorConfig(
        endpoint=cfgmod.resolve_endpoint(sink.endpoint if sink else f"http://127.0.0.1:{free_port()}",
                                         "grpc" if sink and sink.protocol == "grpc" else "http/protobuf"),
        protocol="grpc" if sink and sink.protocol == "grpc" else "http/protobuf",
        timeout_s=1.0, interval_s=0.1, probes=("fake_counting",), spool_dir=str(tmp_path / "spool"),
        node_name="node-7", host_name="host-7")
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def wait_for(condition, timeout=15.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def run_in_thread(agent):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", agent.run()), daemon=True)
    thread.start()
    assert wait_for(lambda: agent.shipper is not None)
    return thread, result


# -- samples -> data model --------------------------------------------------------------------------------------

def _hist(offset, counts, start, t, zero=0, scale=0):
    return HistogramSample("sloscope.syscall.duration", {"syscall.name": "read"}, t, start, count=sum(counts) + zero,
                           sum=0.5, scale=scale, zero_count=zero, positive_offset=offset,
                           positive_bucket_counts=list(counts))


def test_counters_are_cumulative_with_a_fixed_start_time():
    b = MetricsBuilder(Resource({}))
    first = encode(b.build([Sample("sloscope.pressure.stall", {"pressure.resource": "io"}, 20, 0.25, "counter_delta", 10)]))
    second = encode(b.build([Sample("sloscope.pressure.stall", {"pressure.resource": "io"}, 30, 0.5, "counter_delta", 20)]))
    m1, m2 = (r.resource_metrics[0].scope_metrics[0].metrics[0] for r in (first, second))
    assert m2.sum.aggregation_temporality == CUMULATIVE and m2.sum.is_monotonic and m2.unit == "s"
    (p1,), (p2,) = m1.sum.data_points, m2.sum.data_points
    assert (p1.start_time_unix_nano, p1.time_unix_nano, p1.as_double) == (10, 20, 0.25)
    assert (p2.start_time_unix_nano, p2.time_unix_nano, p2.as_double) == (10, 30, 0.75)


def test_delta_temporality_passes_the_probes_deltas_through():
    b = MetricsBuilder(Resource({}), temporality="delta")
    b.build([Sample("sloscope.tcp.retransmits", {}, 20, 3.0, "counter_delta", 10)])
    (p,) = encode(b.build([Sample("sloscope.tcp.retransmits", {}, 30, 2.0, "counter_delta", 20)])
                  ).resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points
    assert (p.start_time_unix_nano, p.as_double) == (20, 2.0)


def test_histograms_accumulate_buckets_across_offsets_and_scales():
    b = MetricsBuilder(Resource({}))
    b.build([_hist(-10, [1, 2], 0, 10, zero=1)])  # buckets -10: 1, -9: 2
    md = b.build([_hist(-12, [5, 0, 0, 0, 4], 10, 20)])  # -12: 5, -8: 4
    m = encode(md).resource_metrics[0].scope_metrics[0].metrics[0]
    assert m.exponential_histogram.aggregation_temporality == CUMULATIVE
    (p,) = m.exponential_histogram.data_points
    assert (p.scale, p.count, p.zero_count, p.start_time_unix_nano, p.time_unix_nano) == (0, 13, 1, 0, 20)
    assert p.positive.offset == -12 and list(p.positive.bucket_counts) == [5, 0, 1, 2, 4]
    assert p.sum == pytest.approx(1.0) and not p.HasField("min")
    # a coarser histogram: the running state is rescaled (-12,-11 -> -6; -10,-9 -> -5; -8 -> -4)
    (p,) = encode(b.build([_hist(-3, [1], 20, 30, scale=-1)])).resource_metrics[0].scope_metrics[0].metrics[0] \
        .exponential_histogram.data_points
    assert p.scale == -1 and p.positive.offset == -6 and list(p.positive.bucket_counts) == [5, 3, 4, 1]


def test_gauges_as_read_and_resource_and_scope():
    resource = Resource({"host.name": "h1", "k8s.node.name": "n1", "service.name": "sloscope-collector"})
    md = MetricsBuilder(resource).build([Sample("hw.gpu.temperature", {"hw.id": "GPU-1"}, 50, 71.0, "gauge", 40)])
    rm = encode(md).resource_metrics[0]
    assert {kv.key: kv.value.string_value for kv in rm.resource.attributes} == {
        "host.name": "h1", "k8s.node.name": "n1", "service.name": "sloscope-collector"}
    assert rm.scope_metrics[0].scope.name == "sloscope.collector"
    (m,) = rm.scope_metrics[0].metrics
    assert m.name == "hw.gpu.temperature" and m.unit == "Cel" and m.WhichOneof("data") == "gauge"
    assert m.gauge.data_points[0].as_double == 71.0 and m.gauge.data_points[0].time_unix_nano == 50


def test_nothing_to_export_is_none():
    assert MetricsBuilder(Resource({})).build([]) is None


def test_idle_series_are_forgotten_and_restart_from_a_new_start():
    now = [0.0]
    b = MetricsBuilder(Resource({}), idle_expiry_s=60, clock=lambda: now[0])
    b.build([Sample("sloscope.tcp.retransmits", {}, 20, 3.0, "counter_delta", 10)])
    now[0] = 30.0
    b.build([Sample("hw.gpu.temperature", {"hw.id": "x"}, 21, 1.0, "gauge", 20)])
    assert b.series == 1
    now[0] = 100.0
    b.build([])
    assert b.series == 0
    (p,) = encode(b.build([Sample("sloscope.tcp.retransmits", {}, 90, 2.0, "counter_delta", 80)])
                  ).resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points
    assert (p.start_time_unix_nano, p.as_double) == (80, 2.0)


def test_decoding_a_request_gives_back_what_the_sdk_encodes():
    b = MetricsBuilder(Resource({"host.name": "h", "n": 3, "ok": True}))
    samples = [Sample("sloscope.tcp.retransmits", {}, 20, 3.0, "counter_delta", 10),
               Sample("hw.gpu.temperature", {"hw.id": "g"}, 20, 50.5, "gauge", 10),
               Sample("sloscope.syscall.duration", {"syscall.name": "read", "process.pid": 42}, 20, 1, "gauge", 10),
               _hist(-20, [1, 0, 3], 10, 20, zero=2),
               HistogramSample("sloscope.block.io.duration", {}, 20, 10, 1, 0.1, 0, 0, -4, [1], min=0.1, max=0.1)]
    request = encode(b.build(samples))
    assert encode(metrics_data_from_request(request)) == request
    assert count_points(request) == 5


# -- probe selection -----------------------------------------------------------------------------------------

def test_probe_names(counting_probe):
    assert resolve_probe_names(["node"], {}) == list(registry.NODE_PROBES)
    auto = resolve_probe_names(["auto"], {})
    assert auto[:len(registry.NODE_PROBES)] == list(registry.NODE_PROBES)
    assert "fake_counting" in auto  # an extra registered probe that is available here
    assert "netstat" not in auto  # only a fallback
    with pytest.raises(cfgmod.ConfigError, match="unknown probe 'nosuch'"):
        resolve_probe_names(["nosuch"], {})
    with pytest.raises(cfgmod.ConfigError, match="probe_options for unknown probes: nosuch"):
        resolve_probe_names(["node"], {"nosuch": {}})


# -- the agent, against a real OTLP receiver stub -----------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_agent_exports_one_stream_with_resource_attributes(tmp_path, counting_probe, protocol):
    with OtlpSink(protocol) as sink:
        agent = Agent(make_config(tmp_path, sink, once=True, interval_s=0.2, probes=("fake_counting", "pressure")))
        assert agent.run() == 0
        (req,) = sink.requests
    rm = req.resource_metrics[0]
    attrs = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
    assert attrs["service.name"] == "sloscope-collector" and attrs["host.name"] == "host-7"
    assert attrs["k8s.node.name"] == "node-7"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    assert metrics["hw.gpu.temperature"].gauge.data_points[0].as_double == 1.0
    assert metrics["sloscope.tcp.retransmits"].sum.aggregation_temporality == CUMULATIVE
    hist = metrics["sloscope.block.io.duration"].exponential_histogram
    assert hist.data_points[0].scale == 0 and hist.data_points[0].positive.offset == 20 - 1 - 30
    assert metrics["sloscope.pressure.stall"].sum.is_monotonic  # a real procfs probe in the same stream
    assert agent.points == count_points(req)


def test_headers_reach_the_endpoint(tmp_path, counting_probe):
    with OtlpSink("http") as sink:
        Agent(make_config(tmp_path, sink, once=True, headers={"authorization": "Bearer t0k"})).run()
        assert sink.headers_seen.get("authorization") == "Bearer t0k"


def test_a_failing_probe_does_not_stop_the_others(tmp_path, monkeypatch, counting_probe):
    class Broken(CountingProbe):
        name = "fake_broken"

        def collect(self):
            raise ProbeError("broken on purpose")

    monkeypatch.setitem(registry.PROBES, "fake_broken", Broken)
    with OtlpSink("http") as sink:
        agent = Agent(make_config(tmp_path, sink, duration_s=0.35, probes=("fake_broken", "fake_counting")))
        assert agent.run() == 0
        gauges = [p[4] for p in series(sink.points(), "hw.gpu.temperature")]
    assert agent.intervals >= 2 and gauges == [float(k) for k in range(1, agent.intervals + 1)]
    assert agent.decisions[0].running == ("fake_broken",) and "broken on purpose" in agent.probes.errors["fake_broken"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_no_data_lost_while_the_receiver_is_down(tmp_path, counting_probe, protocol):
    """Stop the receiver for a while during a run, start it answering with a retryable error for a while,
    then let it accept: every data point produced arrives, exactly once and in order (gauge k, cumulative
    counter k and histogram count k for the k-th interval)."""

    sink = OtlpSink(protocol).start()
    agent = Agent(make_config(tmp_path, sink), retry_initial_s=0.1, retry_max_s=0.2)
    thread, result = run_in_thread(agent)
    try:
        assert wait_for(lambda: len(sink.requests) >= 3)
        sink.stop()
        before = len(sink.requests)
        assert wait_for(lambda: len(agent.shipper.spool) >= 8)  # a while: at least 8 intervals spooled
        assert len(sink.requests) == before and agent.shipper.endpoint_up is False
        sink.fail_with = 503 if protocol == "http" else grpc.StatusCode.UNAVAILABLE
        sink.start()
        assert wait_for(lambda: sink.rejected >= 2 and len(agent.shipper.spool) >= 12)
        assert len(sink.requests) == before
        sink.fail_with = None
        assert wait_for(lambda: not agent.shipper.spool and agent.shipper.endpoint_up)
        time.sleep(0.3)
        agent.request_stop()
        thread.join(15)
        assert not thread.is_alive() and result["rc"] == 0
    finally:
        agent.request_stop()
        thread.join(15)
        sink.stop()
    n = agent.intervals
    points = sink.points()
    assert n >= 15 and len(points) == agent.points == 4 * n  # 3 from the probe, 1 its health
    assert [p[4] for p in series(points, "sloscope.probe.health")] == [1.0] * n
    assert [p[4] for p in series(points, "hw.gpu.temperature")] == [float(k) for k in range(1, n + 1)]
    assert [p[4] for p in series(points, "sloscope.tcp.retransmits")] == [float(k) for k in range(1, n + 1)]
    assert [p[4][0] for p in series(points, "sloscope.block.io.duration")] == list(range(1, n + 1))
    times = [p[3] for p in series(points, "hw.gpu.temperature")]
    assert times == sorted(set(times))
    st = agent.shipper.stats
    assert st.replayed_batches >= 12 and st.exported_batches == n and agent.shipper.spool.dropped_batches == 0


def test_a_slow_endpoint_does_not_stall_collection_and_loses_nothing(tmp_path, counting_probe):
    """Answers take longer than the export timeout: collection goes on at its pace, batches are spooled, and
    once the endpoint is quick again every point has arrived. A request that timed out on our side may still
    have been taken by the endpoint, so a point can arrive twice (at least once), but always identical, so the
    store recognises the repeat."""
    sink = OtlpSink("http", delay_s=0.6).start()
    agent = Agent(make_config(tmp_path, sink, timeout_s=0.3), retry_initial_s=0.1, retry_max_s=0.2)
    thread, result = run_in_thread(agent)
    try:
        assert wait_for(lambda: len(agent.shipper.spool) >= 3)
        intervals = agent.intervals
        assert wait_for(lambda: agent.intervals >= intervals + 5)  # while exports hang, intervals go on
        sink.delay_s = 0.0
        assert wait_for(lambda: not agent.shipper.spool and agent.shipper.endpoint_up)
        agent.request_stop()
        thread.join(15)
        assert result["rc"] == 0
    finally:
        agent.request_stop()
        thread.join(15)
        sink.stop()
    gauges = series(sink.points(), "hw.gpu.temperature")
    assert sorted({p[4] for p in gauges}) == [float(k) for k in range(1, agent.intervals + 1)]
    by_value = {}
    for p in gauges:
        assert by_value.setdefault(p[4], p) == p  # a repeat is the very same point


# -- the command, as a process ------------------------------------------------------------------------------------

def collect_cmd(*args):
    return [sys.executable, "-m", "sloscope.collectors.cli", "collect", *args]


def read_spool(directory):
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".pb"):
            out.append(ExportMetricsServiceRequest.FromString(decode_record((Path(directory) / name).read_bytes())))
    return out


def test_a_restarted_collector_resumes_the_spool_first(tmp_path):
    spool = tmp_path / "spool"
    down = f"http://127.0.0.1:{free_port()}"
    common = ["--protocol", "http/protobuf", "--probe", "pressure", "--interval", "0.2", "--timeout", "0.5",
              "--spool-dir", str(spool)]
    first = subprocess.run(collect_cmd(*common, "--endpoint", down, "--duration", "1"), cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert "spooling to" in first.stderr
    spooled = read_spool(spool)
    assert len(spooled) == 5
    with OtlpSink("http") as sink:
        second = subprocess.run(collect_cmd(*common, "--endpoint", sink.endpoint, "--duration", "0.6"), cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "resuming 5 batches" in second.stderr
        # batches collected while it replays queue behind the spooled ones, so more than 5 may be replayed
        assert int(re.search(r"spool drained: (\d+) batches replayed", second.stderr).group(1)) >= 5
        received = list(sink.requests)
    assert received[:5] == spooled  # first, in order, unchanged
    assert len(received) == 5 + 3 and read_spool(spool) == []
    old_start = {p.start_time_unix_nano for m in spooled[0].resource_metrics[0].scope_metrics[0].metrics
                 for p in m.sum.data_points}
    new_start = {p.start_time_unix_nano for m in received[5].resource_metrics[0].scope_metrics[0].metrics
                 for p in m.sum.data_points}
    assert max(old_start) < min(new_start)  # the new process's counters restart from their own start time


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_flushes_to_the_spool(tmp_path, signum):
    spool = tmp_path / "spool"
    proc = subprocess.Popen(collect_cmd("--endpoint", f"http://127.0.0.1:{free_port()}", "--protocol", "http/protobuf",
                                        "--probe", "pressure", "--interval", "0.2", "--timeout", "0.5",
                                        "--spool-dir", str(spool)),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: spool.exists() and len(read_spool(spool)) >= 2, timeout=30)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "stopping (collecting the last interval" in err
        stopped = [line for line in err.splitlines() if "stopped:" in line][0]
        batches = int(stopped.split(" points in ")[1].split(" batches")[0])
        assert len(read_spool(spool)) == batches  # every batch produced is on disk
    finally:
        proc.kill()
        proc.wait()


def test_help_and_usage_errors():
    out = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "collect", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for text in ("OTEL_EXPORTER_OTLP_ENDPOINT", "--spool-max-bytes", "--once", "--duration", "flags > environment"):
        assert text in out.stdout
    bad = subprocess.run(collect_cmd("--probe", "nosuch", "--once"), cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unknown probe 'nosuch'" in bad.stderr
    bad = subprocess.run(collect_cmd("--interval", "-1"), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--interval" in bad.stderr


def test_print_config_shows_the_resolved_values(tmp_path):
    path = write_config(tmp_path, "endpoint: http://file:4317\ninterval: 3s\n")
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT="http://env:4317", NODE_NAME="n3",
               OTEL_EXPORTER_OTLP_HEADERS="authorization=secret")
    out = subprocess.run(collect_cmd("--config", path, "--interval", "2", "--print-config"), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["endpoint"] == "http://env:4317" and shown["interval_s"] == 2.0 and shown["node_name"] == "n3"
    assert shown["sources"]["interval"] == "flag" and shown["headers"] == {"authorization": "<redacted>"}


# -- real eBPF through the collector --------------------------------------------------------------------------------

@pytest.mark.privileged
def test_ebpf_tcp_probe_exports_through_otlp(tmp_path):
    from sloscope.probes.ebpf.tcp import TcpProbe

    availability = TcpProbe().check()
    need(availability.ok, availability.explain())
    with OtlpSink("http") as sink:
        proc = subprocess.Popen(collect_cmd("--endpoint", sink.endpoint, "--protocol", "http/protobuf",
                                            "--probe", "tcp", "--interval", "1.5", "--once",
                                            "--spool-dir", str(tmp_path / "spool")),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 90
            while proc.poll() is None and time.monotonic() < deadline:  # TCP state changes to observe
                with socket.create_connection(("127.0.0.1", sink.port), timeout=1):
                    pass
                time.sleep(0.05)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 0, err
        assert "probe tcp: running" in err
        names = {p[0]: p for p in sink.points()}
    assert "sloscope.tcp.state_transitions" in names
    (req,) = sink.requests
    (m,) = [m for m in req.resource_metrics[0].scope_metrics[0].metrics if m.name == "sloscope.tcp.state_transitions"]
    assert m.sum.is_monotonic and m.sum.aggregation_temporality == CUMULATIVE
    assert sum(p.as_double for p in m.sum.data_points) > 0
