import polars as pl

from sloscope.analytics.store import Store
from sloscope.enrich.tiers import MAX_HEADER_LENGTH, TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.catalog import UNKNOWN_NODE
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec
from tests.otlp_builders import attr, gauge, metrics, resource, span, traces, write_lines

T0 = 1_764_410_400_000_000_000


def test_tier_resolution_rules():
    resolver = TierResolver.from_spec(load_spec(None))
    assert resolver.resolve(["p99-latency-critical"]) == "p99-latency-critical"
    assert resolver.resolve("standard") == "standard"
    for hostile in (["gold"], "", "x" * (MAX_HEADER_LENGTH + 1), ["standard", "standard"], 42, ["P99-LATENCY-CRITICAL"]):
        assert resolver.resolve(hostile) == "standard"
    assert resolver.resolve(None) == "standard"
    assert resolver.counts == {"tier_invalid": 6, "tier_missing": 1}


def test_gpu_topology_places_spans_that_only_name_their_gpu():
    topology = GpuTopology()
    topology.learn(pl.DataFrame({"node": ["n1", "n2"], "attributes": ['{"hw.id":"GPU-a"}', '{"hw.id":"GPU-b"}']}))
    requests = pl.DataFrame({"node": [None, "n9", None], "gpu_id": ["GPU-b", None, "GPU-zzz"]},
                            schema={"node": pl.String, "gpu_id": pl.String})
    assert topology.place(requests)["node"].to_list() == ["n2", "n9", "unknown"]
    assert topology.counts == {"spans_node_from_gpu": 1, "spans_node_unknown": 1}


def test_pod_namespace_and_gpu_placement_through_ingest(tmp_path):
    gpu_metrics = metrics([gauge("hw.gpu.utilization", [(T0, 0.5)], {"hw.id": "GPU-7", "hw.gpu.task": "general"})],
                          node="gpu-node-7")
    gpu_only = span("a" * 32, "b" * 16, T0, 100, extra={"hw.id": "GPU-7", "k8s.pod.name": "llm-0"})
    spans = {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "llm"),
                                                            attr("k8s.namespace.name", "inference")]},
                                "scopeSpans": [{"spans": [gpu_only]}]}]}
    f = write_lines(tmp_path / "f.jsonl", [gpu_metrics, spans])
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(f)]) == 0
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        assert store.rows("SELECT node, pod, namespace, gpu_id FROM requests") == [
            ("gpu-node-7", "llm-0", "inference", "GPU-7")]
        assert store.counters()["spans_node_from_gpu"] == 1
        assert store.gpu_nodes() == {"GPU-7": "gpu-node-7"}


def test_a_span_with_no_node_and_no_gpu_is_kept_on_the_unknown_node(tmp_path):
    bare = {"resourceSpans": [{"resource": resource(service_name="llm", k8s_pod_name="llm-0"),
                               "scopeSpans": [{"spans": [span("c" * 32, "d" * 16, T0, 100)]}]}]}
    assert main(["ingest", "--db", str(tmp_path / "x.duckdb"), str(write_lines(tmp_path / "g.jsonl", [bare]))]) == 0
    with Store(tmp_path / "x.duckdb", read_only=True) as store:
        assert store.rows("SELECT node, pod FROM requests") == [(UNKNOWN_NODE, "llm-0")]
        assert store.counters()["spans_node_unknown"] == 1


def test_the_gpu_map_keeps_the_gpus_seen_last_and_places_by_lookup():
    """Past its bound the map forgets the GPU seen longest ago (counted); a GPU seen again is kept; a batch is
    placed by looking up its own GPUs, whatever the map holds."""
    topology = GpuTopology({"GPU-old": "n0", "GPU-a": "n1"}, max_gpus=3)
    topology.learn(pl.DataFrame({"node": ["n2", "n1"], "attributes": ['{"hw.id":"GPU-b"}', '{"hw.id":"GPU-old"}']}))
    topology.learn(pl.DataFrame({"node": ["n3"], "attributes": ['{"hw.id":"GPU-c"}']}))
    assert list(topology.node_of) == ["GPU-b", "GPU-old", "GPU-c"]  # GPU-a, seen longest ago, forgotten
    assert topology.node_of["GPU-old"] == "n1" and topology.counts == {"gpus_forgotten": 1}
    requests = pl.DataFrame({"node": [None, None, None], "gpu_id": ["GPU-c", "GPU-a", None]},
                            schema={"node": pl.String, "gpu_id": pl.String})
    assert topology.place(requests)["node"].to_list() == ["n3", "unknown", "unknown"]
