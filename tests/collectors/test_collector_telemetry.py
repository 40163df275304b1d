"""The collector as an operator sees it: /healthz and /metrics on --listen over real HTTP, following an
endpoint that goes away and comes back; JSON logs; and, as root, eBPF probes that still load in a fresh mount
namespace without tracefs (`ip netns exec` remounts /sys), because the collector mounts it."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope.addresses import address_text
from sloscope.collectors.agent import Agent
from sloscope.collectors.spool import Spool
from tests.conftest import need
from tests.fakes.otlp_sink import OtlpSink, free_port
from tests.collectors.test_collector import counting_probe, make_config, run_in_thread, wait_for  # noqa: F401 (a fixture)

SLOSCOPE = [sys.executable, "-m", "sloscope.commands.cli"]


def get(port, path, host="127.0.0.1"):
    """(status, body) of GET http://HOST:PORT/path."""
    try:
        with urllib.request.urlopen(f"http://{address_text((host, port))}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text, name, **labels):
    """The value of one sample in a Prometheus exposition."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"(?:,[^}]*)?\}" if want else "") + r" ([0-9.e+-]+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name} {labels} not in:\n{text}"
    return float(found.group(1))


def test_health_and_metrics_follow_the_endpoint(tmp_path, counting_probe):  # noqa: F811
    port = free_port()
    sink = OtlpSink("http").start()
    agent = Agent(make_config(tmp_path, sink, listen=f"127.0.0.1:{port}"), retry_initial_s=0.1, retry_max_s=0.2)
    thread, result = run_in_thread(agent)
    try:
        assert wait_for(lambda: len(sink.requests) >= 2)
        assert get(port, "/healthz") == (200, "ok\n")
        status, text = get(port, "/metrics")
        assert status == 200 and metric(text, "sloscope_collector_probe_up", probe="fake_counting") == 1
        assert metric(text, "sloscope_collector_batches_exported_total") >= 2
        assert metric(text, "sloscope_collector_export_duration_seconds_count") >= 2
        assert metric(text, "sloscope_collector_endpoint_up") == 1

        sink.stop()  # down: batches spool, and the collector stays healthy, since restarting it would not help
        assert wait_for(lambda: metric(get(port, "/metrics")[1], "sloscope_collector_spool_batches") >= 3)
        text = get(port, "/metrics")[1]
        assert metric(text, "sloscope_collector_endpoint_up") == 0
        assert metric(text, "sloscope_collector_batches_spooled_total") >= 3
        assert metric(text, "sloscope_collector_export_failures_total") >= 1
        assert get(port, "/healthz")[0] == 200

        sink.start()
        assert wait_for(lambda: metric(get(port, "/metrics")[1], "sloscope_collector_batches_replayed_total") >= 3)
        text = get(port, "/metrics")[1]
        assert metric(text, "sloscope_collector_batches_dropped_total", reason="other") == 0
        assert get(port, "/nope")[0] == 404
    finally:
        agent.request_stop()
        thread.join(30)
        sink.stop()
    assert result["rc"] == 0
    with pytest.raises(OSError):  # gone with the collector
        get(port, "/healthz")


def test_telemetry_listens_on_ipv6_loopback(tmp_path, counting_probe, caplog, ipv6_loopback):  # noqa: F811
    caplog.set_level(logging.INFO, logger="sloscope.collectors.telemetry")
    with OtlpSink("http") as sink:
        agent = Agent(make_config(tmp_path, sink, listen=f"[{ipv6_loopback}]:0"), retry_initial_s=0.1,
                      retry_max_s=0.2)
        thread, result = run_in_thread(agent)
        try:
            assert wait_for(lambda: agent.telemetry is not None and agent.telemetry.port)
            port = agent.telemetry.port
            assert wait_for(lambda: get(port, "/healthz", ipv6_loopback) == (200, "ok\n"))
            assert get(port, "/metrics", ipv6_loopback)[0] == 200
        finally:
            agent.request_stop()
            thread.join(30)
    assert result["rc"] == 0
    assert f"telemetry: /healthz and /metrics on http://[::1]:{port}" in caplog.text


def test_a_port_in_use_costs_the_telemetry_not_the_collection(tmp_path, counting_probe, caplog):  # noqa: F811
    with OtlpSink("http") as sink, OtlpSink("http") as occupant:
        assert Agent(make_config(tmp_path, sink, once=True, listen=f"127.0.0.1:{occupant.port}")).run() == 0
        assert len(sink.requests) == 1
    assert "telemetry: cannot listen on 127.0.0.1:" in caplog.text


def test_json_logs_and_bad_listen_from_the_command_line(tmp_path):
    with OtlpSink("http") as sink:
        done = subprocess.run(SLOSCOPE + ["collect", "--protocol", "http/protobuf", "--endpoint", sink.endpoint,
                                          "--probe", "pressure", "--once", "--interval", "0.2", "--listen", "off",
                                          "--spool-dir", str(tmp_path / "spool"), "--log-format", "json",
                                          "--log-level", "info"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stderr.splitlines()]
        assert {"time", "level", "logger", "message"} <= set(lines[0]) and len(sink.requests) == 1
        assert any(line["message"].startswith("sloscope collect: endpoint") for line in lines)
    bad = subprocess.run(SLOSCOPE + ["collect", "--listen", "nowhere"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--listen: expected HOST:PORT" in bad.stderr


@pytest.mark.privileged
def test_ebpf_probes_load_in_a_fresh_mount_namespace_without_tracefs(tmp_path):
    need(os.geteuid() == 0, "network namespaces and eBPF need root")
    need(shutil.which("ip") is not None, "needs iproute2")
    namespace = f"slo-tracefs-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        spool = tmp_path / "spool"
        # In the namespace /sys is a fresh sysfs, so /sys/kernel/tracing is an empty directory until mounted.
        script = ("test ! -e /sys/kernel/tracing/events || { echo tracefs already there; exit 9; }; "
                  f'exec "$@"')
        done = subprocess.run(
            ["ip", "netns", "exec", namespace, "sh", "-c", script, "sh", *SLOSCOPE, "collect", "--once",
             "--interval", "1", "--probe", "syscall", "--probe", "runqueue", "--listen", "off",
             "--endpoint", f"http://127.0.0.1:{free_port()}", "--timeout", "1", "--spool-dir", str(spool)],
            capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "tracefs was not mounted: mounted tracefs on /sys/kernel/tracing" in done.stderr
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=False)
    _, body, _ = Spool(str(spool)).peek()  # the endpoint was unreachable from there: the batch is spooled
    health = {dict((kv.key, kv.value.string_value) for kv in p.attributes)["probe.name"]: p.as_double
              for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics if m.name == "sloscope.probe.health"
              for p in m.gauge.data_points}
    assert health == {"syscall": 1.0, "runqueue": 1.0}


def test_partial_successes_are_counted_at_most_the_batch(tmp_path, counting_probe):  # noqa: F811
    port = free_port()
    sink = OtlpSink("http").start()
    sink.partially_rejected = 10**9  # more than any batch holds
    agent = Agent(make_config(tmp_path, sink, listen=f"127.0.0.1:{port}"), retry_initial_s=0.1, retry_max_s=0.2)
    thread, result = run_in_thread(agent)
    try:
        assert wait_for(lambda: len(sink.requests) >= 2)
        assert metric(get(port, "/metrics")[1], "sloscope_collector_points_rejected_total") > 0
        agent.request_stop()
        thread.join(30)
    finally:
        sink.stop()
    assert result["rc"] == 0
    sent = sum(1 for request in sink.requests for _ in _points(request))
    assert agent.shipper.stats.partially_rejected_points == sent > 0
    assert agent.shipper.spool.dropped_batches == 0  # a partial success is delivered: nothing retried or kept


def _points(request: ExportMetricsServiceRequest):
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for m in scope.metrics:
                yield from getattr(m, m.WhichOneof("data")).data_points


def test_metrics_keep_every_digit_and_pass_promtool():
    """Counters past a million keep every digit (six significant digits would make rate() step); the text is
    what prometheus-client writes and promtool accepts."""
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from sloscope.collectors.shipper import LatencyHistogram, ShipperStats
    from sloscope.collectors.spool import SpoolStats
    from sloscope.collectors.telemetry import exposition

    latency = LatencyHistogram()
    for seconds in (0.003, 0.007, 0.3, 42.0):
        latency.observe(seconds)
    stats = ShipperStats(exported_batches=1_234_567, exported_points=98_765_432_101, failed_exports=3,
                         export_latency=latency)
    spool = SpoolStats(batches=7, bytes=1_234_567_891, dropped_batches=5, dropped_points=50, rejected_batches=1,
                       corrupt_batches=1, disk_full_batches=1, read_errors=0)
    shipper = SimpleNamespace(stats=stats, spool=SimpleNamespace(stats=lambda: spool), endpoint_up=True)
    agent = SimpleNamespace(probes=None, intervals=10_000_001, shipper=shipper)
    text = exposition(agent).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("sloscope_collector_batches_exported_total", ())] == 1_234_567
    assert samples[("sloscope_collector_points_exported_total", ())] == 98_765_432_101
    assert samples[("sloscope_collector_intervals_total", ())] == 10_000_001
    assert samples[("sloscope_collector_spool_bytes", ())] == 1_234_567_891
    assert samples[("sloscope_collector_batches_dropped_total", (("reason", "other"),))] == 2
    assert samples[("sloscope_collector_export_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("sloscope_collector_export_duration_seconds_bucket", (("le", "0.5"),))] == 3
    assert samples[("sloscope_collector_export_duration_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("sloscope_collector_export_duration_seconds_sum", ())] == pytest.approx(42.31)
    need(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
