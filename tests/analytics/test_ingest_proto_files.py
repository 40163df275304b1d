"""The Collector file exporter's `format: proto` files, ingested as the same requests in OTLP/JSON lines are.

The files are written as the exporter writes them (exporter/fileexporter in opentelemetry-collector-contrib):
each request's protobuf after its length, 4 bytes big-endian; with `compression: zstd` each request a zstd frame
after the frame's length, or, with the exporter.file.nativeCompression gate, the whole file a zstd stream.
"""

import base64
import subprocess
import sys

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sloscope.analytics.cli import EXIT_OK, EXIT_REJECTED
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from sloscope.enrich.tiers import TierResolver
from sloscope.receiver.otlp_common import DecodeError
from sloscope.receiver.otlp_proto_signal import signal_of
from sloscope.receiver.zstd_module import zstd
from tests.declared_specs import BOUNDS, QUEUE_TIME
from tests.otlp_builders import counter, exp_histogram, gauge, metrics, span, traces, write_lines
from tests.receiver_otlp import explicit_histogram

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000
REQUEST_TYPES = {"resourceSpans": ExportTraceServiceRequest, "resourceMetrics": ExportMetricsServiceRequest,
                 "resourceLogs": ExportLogsServiceRequest}
IDS = ("traceId", "spanId", "parentSpanId")
TABLES = ("requests", "samples", "histograms")
LAYOUTS = ["plain", "zstd", "native"]


# --- the exporter's format: proto, written as its source does -------------------------------------------------------

def protobuf(request: dict) -> bytes:
    """An OTLP/JSON request in protobuf: protobuf's own JSON mapping reads it once the hex ids are base64."""
    (key,) = request
    return json_format.ParseDict(_base64_ids(request), REQUEST_TYPES[key]()).SerializeToString()


def _base64_ids(value):
    if isinstance(value, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in IDS else _base64_ids(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_base64_ids(v) for v in value]
    return value


def framed(bodies: list[bytes], compress_each: bool = False) -> bytes:
    """Each body after its length; compressed alone first, as compression: zstd has the exporter do by default."""
    bodies = [zstd.compress(b) if compress_each else b for b in bodies]
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies)


def write_proto(path, requests: list[dict], layout: str = "plain"):
    bodies = [protobuf(r) for r in requests]
    data = framed(bodies, compress_each=layout == "zstd")
    path.write_bytes(zstd.compress(data) if layout == "native" else data)
    return path


# --- data and reading back --------------------------------------------------------------------------------------------

def trace_requests() -> list[dict]:
    def one(i):
        return span(f"{i:032x}", f"{i:016x}", T0 + i * S, 100 + i, status=503 if i % 4 == 0 else 200,
                    tier="p99-latency-critical" if i % 2 else None, kind=3 if i % 5 == 0 else 2)
    return [traces([one(i) for i in range(n, n + 10)], node=f"gpu-node-{n}") for n in (1, 11)]


def metric_requests() -> list[dict]:
    temperature = gauge("hw.gpu.temperature", [(T0 + i * S, 60.0 + i) for i in range(5)], {"hw.id": "GPU-0"})
    retransmits = counter("sloscope.tcp.retransmits", T0 - S, [(T0 + i * S, 10 * i) for i in range(5)])
    runqueue = exp_histogram("sloscope.cpu.runqueue.delay", T0 - S,
                             [(T0 + i * S, 3 * i, 0.5 * i, 0, [i, 2 * i]) for i in range(1, 4)])
    queue_time = explicit_histogram("myllm:queue_time_seconds", T0 - S,
                                    [(T0 + i * S, 1.5 * i, BOUNDS, [i, 1, 0, 0, 0, 0, i]) for i in range(1, 4)])
    unknown = gauge("not.in.the.catalog", [(T0, 1.0)])
    return [metrics([temperature, retransmits]), metrics([runqueue, queue_time, unknown], node="gpu-node-2")]


def log_request() -> dict:
    record = {"timeUnixNano": str(T0), "severityNumber": 9, "body": {"stringValue": "model loaded"},
              "traceId": f"{1:032x}", "spanId": f"{1:016x}"}
    return {"resourceLogs": [{"resource": {}, "scopeLogs": [{"scope": {"name": "test"}, "logRecords": [record]}]}]}


def mixed_requests() -> list[dict]:
    (t1, t2), (m1, m2) = trace_requests(), metric_requests()
    return [t1, m1, log_request(), t2, m2]


def slo_spec(tmp_path):
    spec = tmp_path / "slo.yaml"  # declares vllm's queue time, so that its explicit histogram is kept
    spec.write_text(QUEUE_TIME)
    return spec


def ingest(tmp_path, db, *files):
    return main(["ingest", "--db", str(tmp_path / db), "--slo", str(slo_spec(tmp_path)), *map(str, files)])


def stored(tmp_path, db) -> dict:
    """Every stored row, and the ingest counters."""
    with Store(tmp_path / db, read_only=True) as store:
        rows = {table: store.rows(f"SELECT * FROM {table} ORDER BY ALL") for table in TABLES}
        return rows | {"counters": store.counters()}


def as_json_lines(tmp_path, requests) -> dict:
    assert ingest(tmp_path, "json.duckdb", write_lines(tmp_path / "requests.jsonl", requests)) == EXIT_OK
    return stored(tmp_path, "json.duckdb")


# --- whole files --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_traces_file_loads_as_its_json_lines_do(tmp_path, layout):
    requests = trace_requests()
    assert ingest(tmp_path, "proto.duckdb", write_proto(tmp_path / "traces.pb", requests, layout)) == EXIT_OK
    rows = stored(tmp_path, "proto.duckdb")
    assert rows == as_json_lines(tmp_path, requests)
    assert len(rows["requests"]) == 16 and rows["counters"]["spans_loaded"] == 4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_metrics_file_of_gauges_sums_and_histograms_loads_as_its_json_lines_do(tmp_path, layout):
    requests = metric_requests()
    assert ingest(tmp_path, "proto.duckdb", write_proto(tmp_path / "metrics.pb", requests, layout)) == EXIT_OK
    rows = stored(tmp_path, "proto.duckdb")
    assert rows == as_json_lines(tmp_path, requests)
    metrics_stored = {metric for table in ("samples", "histograms") for metric in
                      {row[2] for row in rows[table]}}
    assert metrics_stored == {"hw.gpu.temperature", "sloscope.tcp.retransmits", "sloscope.cpu.runqueue.delay",
                              "myllm:queue_time_seconds"}
    assert rows["counters"]["points_not_in_catalog"] == 1


def test_a_mixed_file_of_plain_and_compressed_requests_loads_through_the_command(tmp_path):
    requests = mixed_requests()
    bodies = [protobuf(r) for r in requests]
    mixed = tmp_path / "mixed.pb"  # every other request zstd-compressed
    mixed.write_bytes(b"".join(framed([b], compress_each=i % 2 == 1) for i, b in enumerate(bodies)))
    done = subprocess.run([sys.executable, "-m", "sloscope.commands.cli", "ingest", "--db", str(tmp_path / "proto.duckdb"),
                           "--slo", str(slo_spec(tmp_path)), str(mixed)], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert "ingested 5 lines" in done.stderr and "lines rejected: 0, partly refused: 0" in done.stderr
    rows = stored(tmp_path, "proto.duckdb")
    assert rows == as_json_lines(tmp_path, requests)
    assert all(rows[table] for table in TABLES)


def test_the_python_api_reads_a_mixed_file_as_json_lines_in_worker_processes(tmp_path):
    requests = mixed_requests()
    reports = {}
    for name, path in (("proto", write_proto(tmp_path / "mixed.pb", requests, "zstd")),
                       ("json", write_lines(tmp_path / "mixed.jsonl", requests))):
        with Store(tmp_path / f"{name}.duckdb") as store:
            spec = store.spec(slo_spec(tmp_path))
            reports[name] = Ingestor(store, TierResolver.from_spec(spec), jobs=2,
                                     declared=spec.taxonomy.declared_metrics).ingest_files([path])
    proto, json_lines = reports["proto"], reports["json"]
    assert (proto.lines, proto.rejected_count, proto.rejected) == (5, 0, [])
    assert proto.counts == json_lines.counts and proto.rows_loaded > 0
    assert stored(tmp_path, "proto.duckdb") == stored(tmp_path, "json.duckdb")


# --- damage ---------------------------------------------------------------------------------------------------------

def _loaded(rows: dict) -> dict:
    return {table: rows[table] for table in TABLES} | {"lines_read": rows["counters"]["lines_read"]}


def test_a_request_cut_off_keeps_those_before_and_says_where(tmp_path, capsys):
    requests = mixed_requests()
    whole = framed([protobuf(r) for r in requests[:3]])
    cut = tmp_path / "cut.pb"
    cut.write_bytes(whole[:-7])
    assert ingest(tmp_path, "proto.duckdb", cut) == EXIT_REJECTED
    assert f"{cut}:3: request cut off before its end" in capsys.readouterr().err
    assert _loaded(stored(tmp_path, "proto.duckdb")) == _loaded(as_json_lines(tmp_path, requests[:2]))


def test_a_native_zstd_stream_cut_in_its_last_frame_keeps_the_flushed_requests(tmp_path, capsys):
    requests = mixed_requests()
    bodies = [protobuf(r) for r in requests]
    cut = tmp_path / "cut.pb.zst"  # the exporter ends a frame at each flush; the last one was being written
    cut.write_bytes(zstd.compress(framed(bodies[:2])) + zstd.compress(framed(bodies[2:]))[:-9])
    assert ingest(tmp_path, "proto.duckdb", cut) == EXIT_REJECTED
    assert f"{cut}:3: cannot read further" in capsys.readouterr().err
    assert _loaded(stored(tmp_path, "proto.duckdb")) == _loaded(as_json_lines(tmp_path, requests[:2]))


def test_a_length_past_the_file_keeps_the_requests_before_it(tmp_path, capsys):
    requests = trace_requests()
    body = protobuf(requests[0])
    past = tmp_path / "past.pb"
    past.write_bytes(framed([body]) + (len(body) + 100).to_bytes(4, "big") + body)
    assert ingest(tmp_path, "proto.duckdb", past) == EXIT_REJECTED
    assert f"{past}:2: request cut off before its end ({len(body)} of its {len(body) + 100} bytes)" in \
        capsys.readouterr().err
    assert _loaded(stored(tmp_path, "proto.duckdb")) == _loaded(as_json_lines(tmp_path, requests[:1]))


def test_garbage_among_good_requests_is_refused_alone(tmp_path, capsys):
    (t1, t2), (m1, _) = trace_requests(), metric_requests()
    short_ids = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [
        Span(trace_id=b"abc", span_id=b"d", kind=Span.SPAN_KIND_SERVER)]}]}]).SerializeToString()
    bodies = [protobuf(t1), b"\x0a\xff\xff\xff\x0f garbage", short_ids, zstd.compress(b"\x08" + b"\xff" * 12), b"",
              protobuf(m1), protobuf(t2)]
    mixed = tmp_path / "mixed.pb"
    mixed.write_bytes(framed(bodies))
    assert ingest(tmp_path, "proto.duckdb", mixed) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert f"{mixed}:2: neither JSON nor protobuf: a field running past the end" in err
    assert f"{mixed}:3: a protobuf request whose 1 items are neither spans, metrics nor log records" in err
    assert f"{mixed}:4: neither JSON nor protobuf: a number cut off" in err
    assert f"{mixed}:5: a protobuf request holding no span, metric or log record" in err
    assert "lines rejected: 4, partly refused: 0" in err
    rows = stored(tmp_path, "proto.duckdb")
    assert rows["counters"]["lines_rejected"] == 4 and rows["counters"]["lines_read"] == 7
    assert {t: rows[t] for t in TABLES} == {t: as_json_lines(tmp_path, [t1, m1, t2])[t] for t in TABLES}


# --- telling the signal apart ---------------------------------------------------------------------------------------

def test_items_that_fit_no_signal_are_passed_over_and_the_decoder_refuses_them_alone(tmp_path, capsys):
    good = _base64_ids(span(f"{7:032x}", f"{7:016x}", T0, 100))
    request = json_format.ParseDict(_base64_ids(traces([])), ExportTraceServiceRequest())
    request.resource_spans[0].scope_spans[0].spans.extend([Span(trace_id=b"short", span_id=b"s", kind=2),
                                                           json_format.ParseDict(good, Span())])
    assert signal_of(request.SerializeToString()) == "traces"
    path = tmp_path / "one.pb"
    path.write_bytes(framed([request.SerializeToString()]))
    assert ingest(tmp_path, "proto.duckdb", path) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert f"{path}:1: span: trace_id must be 16 bytes" in err and "partly refused: 1" in err
    assert len(stored(tmp_path, "proto.duckdb")["requests"]) == 1


def test_a_metric_without_a_name_does_not_pass_for_a_log_record():
    nameless = Metric(gauge=Gauge(data_points=[NumberDataPoint(as_double=1.0)]))
    named = Metric(name="hw.gpu.temperature", gauge=Gauge(data_points=[NumberDataPoint(as_double=1.0)]))
    request = ExportMetricsServiceRequest(resource_metrics=[{"scope_metrics": [{"metrics": [nameless, named]}]}])
    assert signal_of(request.SerializeToString()) == "metrics"


def test_a_log_record_of_length_delimited_fields_alone_is_refused_rather_than_guessed():
    request = ExportLogsServiceRequest(resource_logs=[{"scope_logs": [{"log_records": [
        {"body": {"string_value": "no time, no severity"}}]}]}])
    with pytest.raises(DecodeError, match="1 items are neither spans, metrics nor log records"):
        signal_of(request.SerializeToString())


def test_an_item_that_could_be_a_span_or_a_metric_is_refused_rather_than_guessed():
    # 16 and 8 bytes of text: a span's ids or a metric's name and description; attributes, or a histogram
    both = Span(trace_id=b"gpu.utilization.", span_id=b"per card", attributes=[KeyValue(key="k")])
    request = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [both]}]}])
    with pytest.raises(DecodeError, match="1 of them could each be more than one of span, metric and log record"):
        signal_of(request.SerializeToString())
