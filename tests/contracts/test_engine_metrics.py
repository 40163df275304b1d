"""Inference engines' metrics as catalog signals: a vLLM scrape as the Collector's prometheus receiver sends it (an
explicit-bucket histogram under its base name, a gauge, a counter that keeps its _total, the pod and node on the
resource) is kept without any SLO spec, by both decoders, and stored as the other receivers' signals are; in
ClickHouse, the rows the Collector's exporter writes for it read as the same steps and histograms."""

import json
from datetime import datetime

import numpy as np
import polars as pl
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sloscope import catalog
from sloscope.analytics.attribution import Window, signal_steps
from sloscope.analytics.frames import Frames
from sloscope.analytics.intake import Enrichment
from sloscope.analytics.store import Store
from sloscope.enrich.pods import PodDirectory
from sloscope.enrich.tiers import TierResolver
from sloscope.metric_rules import kept_metrics
from sloscope.receiver.otlp_json import Decoder
from sloscope.receiver.server import Decoders
from sloscope.records import HISTOGRAM_BUCKETS, HISTOGRAM_OFFSET
from sloscope.slo_spec import load_spec
from tests.otlp_builders import attr
from tests.receiver_otlp import cumulative, explicit_histogram, gauge, prometheus_scrape

T0 = 1_764_410_400_000_000_000  # 2025-11-29T10:00:00Z
S = 1_000_000_000
START = T0 - 3600 * S  # the engine's start: the receiver's start time of its cumulative series
NODE, POD, NAMESPACE = "gpu-node-3", "vllm-llama-0", "inference"
LABELS = {"model_name": "llama-3.1-8b", "engine": "0"}
BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]  # vLLM's TTFT
STEPS = 12  # one scrape every 15 s
WINDOW = Window(datetime(2025, 11, 29, 9, 59), datetime(2025, 11, 29, 10, 1), datetime(2025, 11, 29, 10, 2),
                datetime(2025, 11, 29, 10, 5), 10.0)


def _ttft_counts(k: int) -> list[int]:
    """The cumulative buckets of the k-th scrape: 20 first tokens more each time, most in (0.04, 0.06]."""
    per_scrape = [0, 0, 0, 1, 3, 10, 4, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    return [n * (k + 1) for n in per_scrape]


def vllm_scrape(node: str | None = NODE) -> dict:
    """A vLLM pod's scrapes as the prometheus receiver sends them, with kubernetes_sd_configs (role pod) naming the
    pod and, unless `node` is None, its node; an uncatalogued vLLM metric beside the catalog's."""
    times = [T0 + k * 15 * S for k in range(STEPS)]
    metrics = [
        explicit_histogram("vllm:time_to_first_token_seconds", START,
                           [(t, 1.0 * (k + 1) + 0.05 * k, BOUNDS, _ttft_counts(k)) for k, t in enumerate(times)],
                           LABELS),
        gauge("vllm:num_requests_waiting", "", [(t, float(k % 3)) for k, t in enumerate(times)], LABELS),
        cumulative("vllm:num_preemptions_total", "", START, [(t, 40.0 + 2 * k) for k, t in enumerate(times)], LABELS),
        gauge("vllm:something_else", "", [(t, 1.0) for t in times], LABELS),
    ]
    scrape = prometheus_scrape("10.4.3.17:8000", metrics, job="vllm", times=times)
    resource = scrape["resourceMetrics"][0]["resource"]["attributes"]
    resource += [attr("k8s.pod.name", POD), attr("k8s.namespace.name", NAMESPACE)]
    if node is not None:
        resource.append(attr("k8s.node.name", node))
    return scrape


def _decoded(encoding: str, request: dict):
    if encoding == "json":
        decoder = Decoder()
        return decoder.decode(request), decoder.skipped
    body = ParseDict(request, ExportMetricsServiceRequest()).SerializeToString()
    return Decoders(frozenset()).decode("metrics", body, False)


KEPT_ATTRIBUTES = {**LABELS, "k8s.pod.name": POD, "k8s.namespace.name": NAMESPACE}


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_a_vllm_scrape_is_kept_without_any_spec_and_only_its_catalog_metrics(encoding):
    batch, skipped = _decoded(encoding, vllm_scrape())
    h, p = batch.histograms, batch.points
    assert set(h.metric) == {"vllm:time_to_first_token_seconds"} and len(h) == STEPS
    assert set(h.node) == {NODE} and set(h.cumulative) == {True}
    assert {json.loads(a) == KEPT_ATTRIBUTES for a in (*h.attributes, *p.attributes)} == {True}
    assert h.count[-1] == 20 * STEPS and h.sum[-1] == pytest.approx(STEPS + 0.05 * (STEPS - 1))
    # Each bucket goes to the store's bucket (2**j, 2**(j+1)] of its upper bound: (0.01, 0.02] to j = -6,
    # (0.02, 0.04] and (0.04, 0.06] to -5, (0.06, 0.08] and (0.08, 0.1] to -4, (0.1, 0.25] to -3.
    slot = {j: j - HISTOGRAM_OFFSET for j in range(-6, -2)}
    expected = [0] * HISTOGRAM_BUCKETS
    expected[slot[-6]], expected[slot[-5]], expected[slot[-4]], expected[slot[-3]] = 1, 13, 5, 1
    assert h.buckets[0] == expected
    assert sorted(set(p.metric)) == ["vllm:num_preemptions_total", "vllm:num_requests_waiting"]
    by_metric = {m: (s, c) for m, s, c in zip(p.metric, p.is_sum, p.cumulative)}
    assert by_metric == {"vllm:num_requests_waiting": (False, False), "vllm:num_preemptions_total": (True, True)}
    assert set(p.node) == {NODE}
    # vllm:something_else, and the receiver's own up and scrape_duration_seconds
    assert skipped["points_not_in_catalog"] == 3
    assert "points_unsupported_type" not in skipped and "points_node_unknown" not in skipped


def test_the_stored_scrape_reads_as_deltas_and_levels_per_pod(tmp_path):
    batch, _ = _decoded("json", vllm_scrape())
    with Store(tmp_path / "e.duckdb") as store:
        store.write(Frames.of(batch))
        samples = store.frame("SELECT metric, node, attributes, value, interval_s FROM samples ORDER BY metric, ts")
        histograms = store.frame("SELECT node, attributes, interval_s, count::BIGINT AS count, sum FROM histograms "
                                 "WHERE metric = 'vllm:time_to_first_token_seconds' ORDER BY ts")
        steps = signal_steps(store, WINDOW)
    preemptions = samples.filter(pl.col("metric") == "vllm:num_preemptions_total")
    # the first point counts from the engine's start, an hour before; each later one is the 15 s increase
    assert preemptions["value"].to_list() == [40.0] + [2.0] * (STEPS - 1)
    assert preemptions["interval_s"].to_list() == pytest.approx([3600.0] + [15.0] * (STEPS - 1))
    waiting = samples.filter(pl.col("metric") == "vllm:num_requests_waiting")
    assert waiting["interval_s"].null_count() == STEPS and waiting["value"].to_list()[:3] == [0.0, 1.0, 2.0]
    assert histograms["count"].to_list() == [20] * STEPS and set(histograms["node"]) == {NODE}
    assert histograms["sum"].to_list()[1:] == pytest.approx([1.05] * (STEPS - 1))
    assert {json.loads(a) == KEPT_ATTRIBUTES for a in samples["attributes"]} == {True}
    means = dict(steps.group_by("metric").agg(pl.col("value").median()).iter_rows())
    assert means["vllm:time_to_first_token_seconds"] == pytest.approx(1.05 / 20)
    assert means["vllm:num_preemptions_total"] == pytest.approx(2 / 15)  # preemptions per second
    assert "vllm:something_else" not in means


def test_a_scrape_that_names_only_its_pod_is_placed_on_the_pods_node():
    """Without k8s.node.name on the resource, the gauge and the counter are placed by the pod their series keeps,
    as kubeletstats' pod series are."""
    batch, skipped = _decoded("json", vllm_scrape(node=None))
    assert set(batch.points.node) == {catalog.UNKNOWN_NODE} and skipped["points_node_unknown"] > 0
    pods = PodDirectory()
    pods.apply("ADDED", {"metadata": {"uid": "u-vllm", "name": POD, "namespace": NAMESPACE,
                                      "creationTimestamp": "2025-11-29T08:00:00Z"},
                         "spec": {"nodeName": NODE}, "status": {"podIP": "10.4.3.17"}})
    enrichment = Enrichment(TierResolver.from_spec(load_spec(None)), pods=pods)
    frames, _ = enrichment.frames(batch)
    counts = enrichment.place(frames)
    assert set(frames.points["node"]) == {NODE} and counts["points_node_from_pod_name"] == 2 * STEPS


def test_every_engine_histogram_keeps_explicit_buckets_and_every_engine_series_its_pod():
    rules = kept_metrics()
    engines = [s for s in catalog.SIGNALS if s.source.endswith("through the prometheus receiver")
               and not s.name.startswith(catalog.DCGM_PREFIX)]
    assert {s.source.split(" ")[0] for s in engines} == {"vLLM", "SGLang", "TGI", "Triton"}
    for s in engines + [catalog.signal(n) for n in ("gen_ai.server.time_to_first_token",
                                                    "gen_ai.server.time_per_output_token",
                                                    "gen_ai.server.request.duration")]:
        rule = rules[s.name]
        assert rule.explicit_histograms == (s.instrument is catalog.Instrument.HISTOGRAM), s.name
        assert rule.resource_attributes == catalog.POD_RESOURCE and s.noise_floor > 0 and s.description, s.name
    # counters as the receiver names them: prometheus_client's keep their _total, TGI's and Triton's never had one
    counters = {s.name for s in engines if s.instrument is catalog.Instrument.COUNTER}
    assert {n for n in counters if not n.endswith("_total")} == {
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
        "nv_inference_request_duration_us", "nv_inference_count", "nv_inference_request_success"}


def test_the_clickhouse_store_reads_the_collectors_rows_as_the_decoders_stored_them(tmp_path):
    """The Collector's clickhouseexporter writes the histogram to otel_metrics_histogram, the gauge and the counter
    to its gauge and sum tables; the ClickHouse store reads the same signal steps and histograms from them as the
    DuckDB store from the decoded scrape."""
    pytest.importorskip("chdb")
    from sloscope.analytics.stores import open_store
    from tests.collector_exporter import rows

    scrape = vllm_scrape()
    batch, _ = _decoded("json", scrape)
    with Store(tmp_path / "e.duckdb") as duck:
        duck.write(Frames.of(batch))
        stored = signal_steps(duck, WINDOW).sort("node", "metric", "attributes", "step")
        stored_histograms = duck.frame("SELECT ts, node, metric, attributes, interval_s, count::BIGINT AS count, "
                                       "sum, buckets FROM histograms ORDER BY ts")
    open_store(f"chdb:///{tmp_path}/ch").close()  # made as ingest makes it: its tables and sloscope's columns
    with open_store(f"chdb:///{tmp_path}/ch", read_only=True) as ch:
        for table, data in rows(scrape).items():
            ch.backend.insert(table, data)
        # (the exporter writes every metric it is sent, and the store reads them all: the catalog's are compared)
        engine = signal_steps(ch, WINDOW).filter(pl.col("metric").cast(pl.String).is_in(list(catalog.BY_NAME))).sort(
            "node", "metric", "attributes", "step")
        dense = "arrayMap(slot -> arraySum(arrayFilter((n, s) -> s = slot, bucket_counts, bucket_slots)), range(48))"
        engine_histograms = ch.frame(f"SELECT ts, node, metric, attributes, interval_s, count, sum, {dense} AS buckets "
                                     f"FROM ({ch.sql('histograms')}) ORDER BY ts",
                                     {"since": datetime(2000, 1, 1), "until": datetime(2100, 1, 1)})
    assert set(stored["metric"]) == {"vllm:time_to_first_token_seconds", "vllm:num_requests_waiting",
                                      "vllm:num_preemptions_total"}
    assert engine.select("node", "metric", "attributes", "step").equals(
        stored.select("node", "metric", "attributes", "step"))
    assert np.allclose(engine["value"].to_numpy(), stored["value"].to_numpy(), rtol=1e-12)
    assert stored_histograms.height == STEPS
    for name in stored_histograms.columns:  # floats to within an ulp or two (polars divides by 1e9 as x * 1e-9)
        if stored_histograms.schema[name] == pl.Float64:
            assert np.allclose(engine_histograms[name].to_numpy(), stored_histograms[name].to_numpy(), rtol=1e-12)
        else:
            assert engine_histograms[name].to_list() == stored_histograms[name].to_list(), name
