"""The collector's sender: spooled while the endpoint is away, replayed in order; backpressure (a busy
receiver's 503 / UNAVAILABLE) waits as asked and is never a rejection; a refused batch is sent once and set
aside; an endpoint that refuses everything keeps the batches."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.resources import Resource

from sloscope.collectors.otlp_answers import DELIVERED, REFUSED, RETRY, Answer, make_exporter
from sloscope.collectors.otlp_metrics import MetricsBuilder
from sloscope.collectors.shipper import Shipper
from sloscope.collectors.spool import Spool
from sloscope.probes.sample import Sample
from tests.fakes.otlp_sink import OtlpSink
from tests.collectors.test_collector import make_config, series, wait_for

REPO = Path(__file__).resolve().parents[2]


# -- the sender, against an exporter that is told what to do ------------------------------------------------------

class ScriptedExporter:
    """Answers as told per call; records what it delivered (by gauge value)."""

    def __init__(self):
        self.up = True
        self.refuse = set()  # gauge values it refuses for good while up
        self.block = threading.Event()
        self.blocking = False
        self.accepted = []
        self.sent = []  # every gauge value it was sent
        self.shut = False

    def send(self, body):
        if self.blocking and not self.shut:
            self.block.wait(10)
        if self.shut or not self.up:
            return Answer(RETRY, "down")
        request = ExportMetricsServiceRequest.FromString(body)
        if not request.resource_metrics:
            return Answer(DELIVERED)
        value = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double
        self.sent.append(value)
        if value in self.refuse:
            return Answer(REFUSED, "HTTP 400: bad on purpose")
        self.accepted.append(value)
        return Answer(DELIVERED)

    def shutdown(self):
        self.shut = True
        self.block.set()


def gauge_batch(value: float) -> MetricsData:
    return MetricsBuilder(Resource({})).build([Sample("hw.gpu.temperature", {"hw.id": "g"}, 10, value, "gauge", 1)])


def test_sender_spools_while_down_and_replays_in_order(tmp_path):
    exporter = ScriptedExporter()
    shipper = Shipper(exporter, Spool(str(tmp_path)), timeout_s=1, retry_initial_s=0.05, retry_max_s=0.1)
    shipper.start()
    try:
        shipper.submit(gauge_batch(1.0))
        assert wait_for(lambda: exporter.accepted == [1.0])
        exporter.up = False
        shipper.submit(gauge_batch(2.0))
        assert wait_for(lambda: len(shipper.spool) == 1)
        assert shipper.endpoint_up is False
        for v in (3.0, 4.0, 5.0):  # while the spool holds 2, these queue behind it on disk, unsent
            shipper.submit(gauge_batch(v))
        assert wait_for(lambda: len(shipper.spool) == 4)
        exporter.up = True
        assert wait_for(lambda: exporter.accepted == [1.0, 2.0, 3.0, 4.0, 5.0])
        assert wait_for(lambda: not shipper.spool and shipper.endpoint_up is True)  # removed once delivered
        assert shipper.stats.replayed_batches == 4 and shipper.stats.spooled_batches == 4
    finally:
        shipper.close(1)


def test_a_batch_the_endpoint_refuses_is_set_aside(tmp_path):
    exporter = ScriptedExporter()
    exporter.refuse = {2.0}
    shipper = Shipper(exporter, Spool(str(tmp_path)), timeout_s=1, retry_initial_s=0.01, retry_max_s=0.02)
    shipper.start()
    try:
        for v in (1.0, 2.0, 3.0):
            shipper.submit(gauge_batch(v))
        assert wait_for(lambda: exporter.accepted == [1.0, 3.0])
        assert exporter.sent == [1.0, 2.0, 2.0, 3.0]  # a refusal is sent again only to confirm it
        assert shipper.spool.rejected_batches == 1 and shipper.spool.dropped_points == 1
        assert len(os.listdir(tmp_path / "rejected")) == 1 and shipper.stats.refused_exports == 2
    finally:
        shipper.close(1)


def gauges_received(sink):
    return [p[4] for p in series(sink.points(), "hw.gpu.temperature")]


def sink_shipper(tmp_path, sink):
    shipper = Shipper(make_exporter(make_config(tmp_path, sink)), Spool(str(tmp_path / "spool")), timeout_s=1,
                      retry_initial_s=0.01, retry_max_s=0.02)
    shipper.start()
    return shipper


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_busy_receiver_is_backpressure_not_a_rejection(tmp_path, protocol):
    """A receiver whose queue is full answers every batch 503 / UNAVAILABLE, with Retry-After / RetryInfo,
    and takes an empty request (nothing to queue). However long that lasts, no batch is set aside; the sender
    waits as long as it is asked to (not its own 20 ms backoff); every batch arrives in order once there is
    room."""
    busy = 503 if protocol == "http" else grpc.StatusCode.UNAVAILABLE
    with OtlpSink(protocol) as sink:
        sink.retry_after = 0
        sink.refuse = lambda request: busy if request.resource_metrics else None
        shipper = sink_shipper(tmp_path, sink)
        try:
            for v in (1.0, 2.0, 3.0):
                shipper.submit(gauge_batch(v))
            assert wait_for(lambda: sink.rejected >= 12)  # more than any count of failures could excuse
            sink.retry_after = 1
            asked = len(sink.failures)
            assert wait_for(lambda: len(sink.failures) >= asked + 3)
            sink.refuse = None
            assert wait_for(lambda: gauges_received(sink) == [1.0, 2.0, 3.0])
        finally:
            shipper.close(1)
    times = [t for t, _code in sink.failures[asked:]]
    assert min(b - a for a, b in zip(times, times[1:])) >= 0.95  # Retry-After honoured
    assert shipper.spool.rejected_batches == 0 and shipper.spool.dropped_batches == 0
    assert not (tmp_path / "spool" / "rejected").exists() and shipper.stats.refused_exports == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batch_the_receiver_refuses_is_confirmed_and_set_aside(tmp_path, protocol):
    bad = 400 if protocol == "http" else grpc.StatusCode.INVALID_ARGUMENT
    with OtlpSink(protocol) as sink:
        sink.refuse = lambda request: bad if tag_of_request(request) == 2.0 else None
        shipper = sink_shipper(tmp_path, sink)
        try:
            for v in (1.0, 2.0, 3.0):
                shipper.submit(gauge_batch(v))
            assert wait_for(lambda: gauges_received(sink) == [1.0, 3.0])
        finally:
            shipper.close(1)
    assert len(sink.failures) == 2  # sent again only to confirm the refusal, then never again
    assert shipper.spool.rejected_batches == 1 and os.listdir(tmp_path / "spool" / "rejected")


def test_an_endpoint_that_refuses_everything_keeps_the_batches(tmp_path, caplog):
    """Wrong credentials: the empty request is refused too, so the batches are not at fault and wait."""
    with OtlpSink("http") as sink:
        sink.fail_with = 401
        shipper = sink_shipper(tmp_path, sink)
        try:
            for v in (1.0, 2.0):
                shipper.submit(gauge_batch(v))
            assert wait_for(lambda: sink.rejected >= 4 and len(shipper.spool) == 2)
            assert "refuses every request" in caplog.text and "HTTP 401" in caplog.text
            sink.fail_with = None
            assert wait_for(lambda: gauges_received(sink) == [1.0, 2.0])
        finally:
            shipper.close(1)
    assert shipper.spool.rejected_batches == 0 and shipper.spool.dropped_batches == 0


def tag_of_request(request):
    if not request.resource_metrics:
        return None
    return request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double


def test_close_spools_what_a_hung_export_holds(tmp_path):
    exporter = ScriptedExporter()
    exporter.blocking = True
    shipper = Shipper(exporter, Spool(str(tmp_path)), timeout_s=1)
    shipper.start()
    shipper.submit(gauge_batch(1.0))
    shipper.submit(gauge_batch(2.0))
    time.sleep(0.1)
    started = time.monotonic()
    shipper.close(grace_s=0.2)
    assert time.monotonic() - started < 3
    assert exporter.accepted == []
    shipper.spool.close()
    again = Spool(str(tmp_path))
    values = []
    while again:
        seq, body, _ = again.peek()
        request = ExportMetricsServiceRequest.FromString(body)
        values.append(request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double)
        again.remove(seq)
    assert values == [1.0, 2.0]


def test_an_unwritable_spool_drops_counted_and_the_sender_goes_on(tmp_path):
    exporter = ScriptedExporter()
    exporter.up = False
    directory = tmp_path / "spool"
    shipper = Shipper(exporter, Spool(str(directory)), timeout_s=1, retry_initial_s=0.05, retry_max_s=0.05)
    shutil.rmtree(directory)  # the spool's directory vanished (an unmounted volume, say)
    shipper.start()
    try:
        shipper.submit(gauge_batch(1.0))
        assert wait_for(lambda: shipper.spool.dropped_batches == 1)
        assert shipper.spool.dropped_points == 1
        exporter.up = True
        shipper.submit(gauge_batch(2.0))
        assert wait_for(lambda: exporter.accepted == [2.0])
    finally:
        shipper.close(1)


UNREADABLE_FOR_A_WHILE = textwrap.dedent("""
    import os, resource, sys, time
    from sloscope.collectors.otlp_http import HttpExporter
    from sloscope.collectors.shipper import Shipper
    from sloscope.collectors.spool import Spool
    from tests.fakes.otlp_sink import OtlpSink
    from tests.collectors.test_spool import request

    sink = OtlpSink("http").start()
    spool = Spool(sys.argv[1])
    for tag in (1, 2, 3):
        spool.append(request(1, tag))
    shipper = Shipper(HttpExporter(sink.endpoint + "/v1/metrics", {}, 1), spool, timeout_s=1,
                      retry_initial_s=0.05, retry_max_s=0.1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # EMFILE for every open from here
    shipper.start()
    deadline = time.monotonic() + 20
    while spool.read_errors < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    print("while unreadable", spool.read_errors >= 3, len(sink.requests), spool.sequence_numbers())
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    while spool and time.monotonic() < deadline:
        time.sleep(0.02)
    shipper.close(1)
    sink.stop()
    values = [r.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double for r in sink.requests]
    print("after", values, spool.corrupt_batches, spool.dropped_batches, os.listdir(sys.argv[1]))
""")


def test_a_spool_file_unreadable_for_a_while_is_sent_later_not_lost(tmp_path):
    """Out of file descriptors (EMFILE) while replaying: the batch stays, is retried after the backoff, and
    goes out in order once descriptors are back; nothing is set aside or dropped."""
    out = subprocess.run([sys.executable, "-c", UNREADABLE_FOR_A_WHILE, str(tmp_path / "spool")], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["while unreadable True 0 [0, 1, 2]", "after [1.0, 2.0, 3.0] 0 0 ['.lock']"]
    assert "could not be read" in out.stderr


class GatedExporter(ScriptedExporter):
    """Delivers, but each send waits until the test lets one through (an endpoint slower than batches come);
    `in_send` is set while a send waits."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Semaphore(0)
        self.in_send = threading.Event()
        self.open = False

    def send(self, body):
        if not self.open and ExportMetricsServiceRequest.FromString(body).resource_metrics:
            self.in_send.set()
            self.gate.acquire(timeout=10)
            self.in_send.clear()
        return super().send(body)

    def shutdown(self):
        self.open = True
        self.gate.release(100)
        super().shutdown()


def test_a_backlog_behind_a_slow_endpoint_goes_to_the_spool_not_memory(tmp_path):
    """Answers slower than batches come: what queues behind the batch in flight goes to disk (bounded, and
    kept across a crash) instead of growing in memory, and everything still arrives in order."""
    exporter = GatedExporter()
    shipper = Shipper(exporter, Spool(str(tmp_path)), timeout_s=1, retry_initial_s=0.01, retry_max_s=0.02)
    shipper.start()
    try:
        shipper.submit(gauge_batch(1.0))
        assert exporter.in_send.wait(10)
        for v in (2.0, 3.0, 4.0, 5.0, 6.0):  # all five come while batch 1 is in flight
            shipper.submit(gauge_batch(v))
        exporter.gate.release()  # batch 1 answered
        assert wait_for(lambda: exporter.accepted == [1.0] and exporter.in_send.is_set())
        assert shipper.queued == 0 and len(shipper.spool) == 5  # batch 2 is in flight from the spool
        exporter.open = True
        exporter.gate.release()
        assert wait_for(lambda: exporter.accepted == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and not shipper.spool)
        assert shipper.spool.dropped_batches == 0 and shipper.endpoint_up is True
    finally:
        shipper.close(1)
