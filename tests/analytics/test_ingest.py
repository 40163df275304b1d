import gzip
import json

import pytest

from sloscope.analytics.cli import EXIT_OK, EXIT_REJECTED
from sloscope.analytics.store import Store
from sloscope.commands.cli import main
from tests.otlp_builders import TRACE_ID, counter, exp_histogram, gauge, metrics, span, traces, write_lines

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000


def trace_id(i):
    return f"{i:032x}"


def span_id(i):
    return f"{i:016x}"


def ingest(tmp_path, *files, db="x.duckdb"):
    return main(["ingest", "--db", str(tmp_path / db), *map(str, files)])


def query(tmp_path, q, db="x.duckdb"):
    with Store(tmp_path / db, read_only=True) as store:
        return store.rows(q)


def test_spans_load_with_tiers_resolved_against_the_allow_list(tmp_path):
    spans = [
        span(trace_id(1), span_id(1), T0, 120, tier=["p99-latency-critical"]),
        span(trace_id(2), span_id(2), T0, 130, tier="standard"),  # Envoy custom tag: plain string
        span(trace_id(3), span_id(3), T0, 140, tier=["platinum"]),  # not in the spec
        span(trace_id(4), span_id(4), T0, 150, tier="x" * 10_000),  # oversized
        span(trace_id(5), span_id(5), T0, 160),  # no header
        span(trace_id(6), span_id(6), T0, 170, tier=["standard", "p99-latency-critical"]),  # ambiguous
        span(trace_id(7), span_id(7), T0, 180, extra={"slo.tier": "p99-latency-critical"}),  # Istio tag
        span(trace_id(8), span_id(8), T0, 190, kind=3),  # CLIENT: not a request, kept in the spans table
        span(trace_id(9), span_id(9), T0, 200, status=503),
    ]
    f = write_lines(tmp_path / "t.jsonl", [traces(spans)])
    assert ingest(tmp_path, f) == EXIT_OK
    rows = dict(query(tmp_path, f"SELECT {TRACE_ID}, tier FROM requests"))
    assert rows[trace_id(1)] == "p99-latency-critical"
    assert rows[trace_id(2)] == "standard"
    assert rows[trace_id(3)] == rows[trace_id(4)] == rows[trace_id(5)] == rows[trace_id(6)] == "standard"
    assert rows[trace_id(7)] == "p99-latency-critical"
    assert trace_id(8) not in rows
    assert query(tmp_path, f"SELECT {TRACE_ID}, kind FROM spans") == [(trace_id(8), 3)]
    assert query(tmp_path, "SELECT failed FROM requests WHERE status_code = 503") == [(True,)]
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        c = store.counters()
    # The CLIENT span names no tier either: every span's header is resolved, whatever its kind.
    assert c["tier_invalid"] == 3 and c["tier_missing"] == 3 and c["spans_loaded"] == 1 and "spans_not_server" not in c


def test_malformed_lines_are_reported_counted_and_the_rest_loads(tmp_path, capsys):
    good = traces([span(trace_id(1), span_id(1), T0, 100)])
    bad_id = traces([span("nothex", span_id(2), T0, 100)])
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([json.dumps(good), "{not json", json.dumps(bad_id), json.dumps({"x": 1}),
                            json.dumps(traces([span(trace_id(3), span_id(3), T0, 100)]))]) + "\n")
    assert ingest(tmp_path, f) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert f"{f}:2: not valid JSON" in err
    assert f"{f}:3: traceId: expected 32 hex digits" in err
    assert f"{f}:4: not an OTLP export request" in err
    assert query(tmp_path, "SELECT count(*) FROM requests") == [(2,)]
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        assert store.counters()["lines_rejected"] == 3


def test_gzip_is_recognised_and_a_second_ingest_adds_nothing(tmp_path):
    lines = [traces([span(trace_id(i), span_id(i), T0 + i * S, 100) for i in range(50)]),
             metrics([gauge("hw.gpu.temperature", [(T0 + i * S, 60.0 + i) for i in range(10)], {"hw.id": "GPU-a"}),
                      counter("sloscope.tcp.retransmits", T0 - S, [(T0 + i * S, 10 * i) for i in range(10)]),
                      exp_histogram("sloscope.cpu.runqueue.delay", T0 - S,
                                    [(T0 + i * S, 3 * i, 1e-4 * i, -14, [i, 2 * i]) for i in range(1, 10)])])]
    f = tmp_path / "data.otlp"  # no .gz suffix: recognised by content
    with gzip.open(f, "wt") as out:
        out.writelines(json.dumps(x) + "\n" for x in lines)
    assert ingest(tmp_path, f) == EXIT_OK
    counts = query(tmp_path, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM samples), "
                             "(SELECT count(*) FROM histograms)")
    assert ingest(tmp_path, f) == EXIT_OK
    assert query(tmp_path, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM samples), "
                           "(SELECT count(*) FROM histograms)") == counts
    assert counts[0][0] == 50 and counts[0][1] == 20 and counts[0][2] == 9


def test_cumulative_counters_become_deltas_across_files_and_resets(tmp_path):
    start, restart = T0 - S, T0 + 5 * S + S // 2
    first = metrics([counter("sloscope.tcp.retransmits", start, [(T0, 100), (T0 + S, 110), (T0 + 2 * S, 130)])])
    # The producer restarted (new start time) between the 3rd and 4th point; then a plain drop (reset
    # without a new start time) before the last one.
    second = metrics([counter("sloscope.tcp.retransmits", start, [
        (T0 + 3 * S, 135), (T0 + 6 * S, 4, restart), (T0 + 7 * S, 9, restart), (T0 + 8 * S, 2, restart)])])
    ingest(tmp_path, write_lines(tmp_path / "a.jsonl", [first]))
    ingest(tmp_path, write_lines(tmp_path / "b.jsonl", [second]))
    rows = query(tmp_path, "SELECT value, interval_s FROM samples ORDER BY ts")
    assert rows == [(100.0, 1.0), (10.0, 1.0), (20.0, 1.0), (5.0, 1.0), (4.0, 0.5), (5.0, 1.0), (2.0, 1.0)]


def test_cumulative_histograms_become_bucket_deltas(tmp_path):
    hist = exp_histogram("sloscope.syscall.duration", T0 - S, [
        (T0, 3, 0.003, -10, [1, 2]), (T0 + S, 7, 0.010, -11, [1, 2, 4])], attrs={"syscall.name": "read"})
    ingest(tmp_path, write_lines(tmp_path / "h.jsonl", [metrics([hist])]))
    rows = query(tmp_path, "SELECT count, round(sum, 6), buckets FROM histograms ORDER BY ts")
    (c1, s1, b1), (c2, s2, b2) = rows
    assert (c1, s1, c2, s2) == (3, 0.003, 4, 0.007)
    offset = -40
    assert b1[-10 - offset] == 1 and b1[-9 - offset] == 2
    assert b2[-11 - offset] == 1 and b2[-10 - offset] == 1 and b2[-9 - offset] == 2 and sum(b2) == 4


def test_a_sum_and_a_histogram_of_one_name_keep_their_own_cumulative_state(tmp_path):
    # A producer's two instruments of one name, node and attributes, each loaded after the other has a state.
    name, start = "sloscope.syscall.duration", T0 - S
    for i, (t, total, count) in enumerate([(T0, 100, 3), (T0 + S, 130, 7), (T0 + 2 * S, 160, 12)]):
        hist = exp_histogram(name, start, [(t, count, count / 1000, 0, [count])])
        total_point = counter(name, start, [(t + S // 2, total)])
        ingest(tmp_path, write_lines(tmp_path / f"h{i}.jsonl", [metrics([hist])]))
        assert ingest(tmp_path, write_lines(tmp_path / f"s{i}.jsonl", [metrics([total_point])])) == EXIT_OK
    assert query(tmp_path, "SELECT value, interval_s FROM samples ORDER BY ts") == [
        (100.0, 1.5), (30.0, 1.0), (30.0, 1.0)]
    assert query(tmp_path, "SELECT count, interval_s FROM histograms ORDER BY ts") == [(3, 1.0), (4, 1.0), (5, 1.0)]


def test_node_is_k8s_node_name_else_host_name(tmp_path):
    a = metrics([gauge("hw.gpu.temperature", [(T0, 50.0)])], node="ip-10-0-0-1", k8s_node="gpu-node-7")
    b = metrics([gauge("hw.gpu.temperature", [(T0, 51.0)])], node="gpu-node-8")
    ingest(tmp_path, write_lines(tmp_path / "n.jsonl", [a, b]))
    assert sorted(query(tmp_path, "SELECT node FROM samples")) == [("gpu-node-7",), ("gpu-node-8",)]


def test_metrics_outside_the_catalog_are_counted_not_stored(tmp_path):
    ingest(tmp_path, write_lines(tmp_path / "o.jsonl", [metrics([gauge("process.cpu.utilization", [(T0, 0.5)])])]))
    assert query(tmp_path, "SELECT count(*) FROM samples") == [(0,)]
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        assert store.counters()["points_not_in_catalog"] == 1


@pytest.mark.parametrize("mutate,reason", [
    (lambda m: m["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0].update(
        asDouble="hot"), "expected a number"),
    (lambda m: m["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0].update(
        timeUnixNano="yesterday"), "timeUnixNano"),
])
def test_bad_metric_payloads_are_rejected_with_a_reason(tmp_path, capsys, mutate, reason):
    m = metrics([gauge("hw.gpu.temperature", [(T0, 50.0)])])
    mutate(m)
    assert ingest(tmp_path, write_lines(tmp_path / "bad.jsonl", [m])) == EXIT_REJECTED
    assert reason in capsys.readouterr().err


def test_an_unreadable_file_is_reported_and_the_others_load(tmp_path, capsys):
    good = write_lines(tmp_path / "good.jsonl", [traces([span(trace_id(1), span_id(1), T0, 100)])])
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b'{"resourceSpans": []}\n' * 100)[:40])
    assert ingest(tmp_path, broken, good) == EXIT_REJECTED
    assert "broken.gz" in capsys.readouterr().err
    assert query(tmp_path, "SELECT count(*) FROM requests") == [(1,)]


def test_usage_errors_exit_2_with_a_message(tmp_path, capsys):
    bad = tmp_path / "slo.yaml"
    bad.write_text("default_tier: gold\ntiers: {}\n")
    f = write_lines(tmp_path / "t.jsonl", [traces([span(trace_id(1), span_id(1), T0, 100)])])
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), "--slo", str(bad), str(f)]) == 2
    assert "tiers: expected a non-empty mapping" in capsys.readouterr().err
    assert main(["rca", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no such database" in capsys.readouterr().err
    assert ingest(tmp_path, f) == EXIT_OK
    assert main(["rca", "--db", str(tmp_path / "x.duckdb"), "--since", "yesterday"]) == 2
    assert "neither an RFC 3339 time nor a duration" in capsys.readouterr().err


def test_the_spec_given_at_ingest_is_remembered_for_later_commands(tmp_path):
    spec = tmp_path / "slo.yaml"
    spec.write_text("default_tier: bulk\ntiers:\n  bulk: {latency: {percentile: 90, threshold_ms: 5000}, "
                    "availability: 99}\n  gold: {latency: {percentile: 99, threshold_ms: 100}, availability: 99.9}\n")
    f = write_lines(tmp_path / "t.jsonl", [traces([span(trace_id(1), span_id(1), T0, 100, tier="gold"),
                                                   span(trace_id(2), span_id(2), T0, 100, tier="standard")])])
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), "--slo", str(spec), str(f)]) == EXIT_OK
    assert sorted(query(tmp_path, "SELECT tier FROM requests")) == [("bulk",), ("gold",)]
    g = write_lines(tmp_path / "u.jsonl", [traces([span(trace_id(3), span_id(3), T0, 100, tier="gold")])])
    assert ingest(tmp_path, g) == EXIT_OK  # no --slo: the remembered spec still allows "gold"
    assert query(tmp_path, f"SELECT tier FROM requests WHERE {TRACE_ID} = '{trace_id(3)}'") == [("gold",)]


def _exporter_files(tmp_path) -> tuple[list[dict], dict]:
    """The same requests in each layout the Collector's file exporter writes with format: json."""
    from sloscope.receiver.zstd_module import zstd

    docs = [traces([span(trace_id(i), span_id(i), T0 + i * S, 100) for i in range(n, n + 20)]) for n in (0, 20)]
    docs.append(metrics([gauge("hw.gpu.temperature", [(T0 + i * S, 60.0 + i) for i in range(5)], {"hw.id": "G"})]))
    encoded = [json.dumps(d).encode() for d in docs]
    native = zstd.ZstdCompressor()
    layouts = {
        "native.zst": b"".join(native.compress(e + b"\n", native.FLUSH_FRAME) for e in encoded),
        "prefixed.zst": b"".join(len(z).to_bytes(4, "big") + z for z in map(zstd.compress, encoded)),
    }
    for name, data in layouts.items():
        (tmp_path / name).write_bytes(data)
    return docs, layouts


@pytest.mark.parametrize("layout", ["native.zst", "prefixed.zst"])
def test_the_file_exporters_zstd_layouts_load_as_its_lines_do(tmp_path, layout):
    docs, _ = _exporter_files(tmp_path)
    assert ingest(tmp_path, tmp_path / layout, db=f"{layout}.duckdb") == EXIT_OK
    assert ingest(tmp_path, write_lines(tmp_path / "plain.jsonl", docs), db="plain.duckdb") == EXIT_OK
    counted = "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM samples)"
    assert query(tmp_path, counted, db=f"{layout}.duckdb") == query(tmp_path, counted, db="plain.duckdb") == [(40, 5)]


def test_protobuf_requests_of_no_signal_are_refused_saying_so(tmp_path, capsys):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    from sloscope.receiver.zstd_module import zstd

    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[{}]).SerializeToString()
    proto = tmp_path / "spans.proto"
    proto.write_bytes(len(request).to_bytes(4, "big") + request)
    native = tmp_path / "spans.proto.zst"
    native.write_bytes(zstd.compress(len(request).to_bytes(4, "big") + request))
    cut = tmp_path / "cut.zst"
    z = zstd.compress(json.dumps(traces([span(trace_id(1), span_id(1), T0, 100)])).encode())
    cut.write_bytes(len(z).to_bytes(4, "big") + z[:-2])
    assert ingest(tmp_path, proto, native, cut) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert err.count("a protobuf request holding no span, metric or log record") == 2
    assert "cut.zst:1: request cut off" in err


def test_damaged_length_prefixed_files_are_refused_without_allocating_their_lengths(tmp_path, capsys):
    from sloscope.receiver.zstd_module import zstd

    huge = tmp_path / "huge.zst"
    huge.write_bytes(b"\x00\xff\xff\xff" + zstd.compress(b"{}"))  # a length of 16 MiB before a tiny frame
    proto = tmp_path / "proto.zst"  # native zstd around protobuf whose length holds a newline byte
    request = b"\x0a" + b"\x00" * 9
    proto.write_bytes(zstd.compress(len(request).to_bytes(4, "big") + request))
    first = zstd.compress(json.dumps(traces([span(trace_id(1), span_id(1), T0, 100)])).encode())
    beyond = tmp_path / "beyond.zst"  # a second length of 2 GiB
    beyond.write_bytes(len(first).to_bytes(4, "big") + first + b"\x80\x00\x00\x00" + first)
    assert ingest(tmp_path, huge, proto, beyond) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert "huge.zst:1: request cut off" in err and "proto.zst:1: neither JSON nor protobuf" in err
    assert "beyond.zst:2: a request of 2147483648 bytes" in err
    assert query(tmp_path, "SELECT count(*) FROM requests") == [(1,)]
