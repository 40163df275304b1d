"""The trace graph: own times along call trees, entries, and the culprits of an entry's change."""

import json
import random
from datetime import datetime, timedelta

import polars as pl
import pytest

from sloscope.analytics import graph
from sloscope.analytics.frames import SPAN_COLUMNS, SPAN_SCHEMA, Frames
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import explain_moment
from sloscope.analytics.store import Store
from sloscope.analytics.stores import open_store
from sloscope.commands.cli import main
from sloscope.records import SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import load_spec
from tests.otlp_builders import attr, gauge, write_lines

T0 = datetime(2026, 12, 1, 12, 0, 0)
# service -> (pod, node)
PLACES = {"frontend": ("frontend-1", "node-a"), "cart": ("cart-1", "node-b"), "catalog": ("catalog-1", "node-c")}


class Traces:
    """Rows of the spans frame, a trace at a time: frontend calls cart, then catalog."""

    def __init__(self):
        self.rows, self.next_id = [], 1

    def span(self, trace: int, parent: int | None, kind: int, service: str, start: datetime, ms: float,
             failed: bool = False, peer: str | None = None, tier: str = "default") -> int:
        span_id, self.next_id = self.next_id, self.next_id + 1
        pod, node = PLACES.get(service, (None, "unknown"))
        self.rows.append({"trace_hi": 0, "trace_lo": trace, "span_id": span_id, "parent_id": parent, "kind": kind,
                          "start_time": start, "duration_ms": ms, "service": service, "node": node, "pod": pod,
                          "namespace": "shop", "pod_ip": None, "gpu_id": None, "tier": tier, "route": "/",
                          "status_code": None, "failed": failed, "peer": peer})
        return span_id

    def request(self, trace: int, start: datetime, cart_ms: float, gap_ms: float, cart_fails: bool = False,
                rng: random.Random = random.Random(0), cut: str = "") -> None:
        """cut: "frontend" answers with no call, "cart" makes frontend give up after cart answers."""
        own = 2.0 + rng.random()
        cart = cart_ms * (0.9 + 0.2 * rng.random())
        catalog = 5.0 * (0.9 + 0.2 * rng.random())
        total = own + cart + 2 * gap_ms + catalog + 1.0
        if cut == "frontend":
            self.span(trace, None, SPAN_KIND_SERVER, "frontend", start, own, tier="gold")
            return
        if cut == "cart":
            total -= catalog + gap_ms
        entry = self.span(trace, None, SPAN_KIND_SERVER, "frontend", start, total, failed=cart_fails, tier="gold")
        at = start + timedelta(milliseconds=own)
        call = self.span(trace, entry, SPAN_KIND_CLIENT, "frontend", at, cart + gap_ms, failed=cart_fails,
                         peer="cart")
        self.span(trace, call, SPAN_KIND_SERVER, "cart", at + timedelta(milliseconds=gap_ms / 2), cart,
                  failed=cart_fails)
        if cut == "cart":
            return
        at += timedelta(milliseconds=cart + gap_ms)
        call = self.span(trace, entry, SPAN_KIND_CLIENT, "frontend", at, catalog + gap_ms, peer="catalog")
        served = self.span(trace, call, SPAN_KIND_SERVER, "catalog", at + timedelta(milliseconds=gap_ms / 2),
                           catalog)
        self.span(trace, served, SPAN_KIND_INTERNAL, "catalog", at + timedelta(milliseconds=gap_ms / 2), catalog / 2)

    def frames(self) -> Frames:
        spans = pl.DataFrame(self.rows, schema={**SPAN_SCHEMA, "start_time": pl.Datetime("us"),
                                                "duration_ms": pl.Float64}).select(SPAN_COLUMNS)
        frames = Frames.concat([])
        frames.spans = spans
        return frames


def _mesh(cart_ms=20.0, gap_ms=0.5, cart_fails_every=0, seconds=900, fault_at=600, cut="", cut_every=1) -> Traces:
    """A request every 200 ms; from `fault_at` s on, cart takes cart_ms and calls cross gap_ms, and one request in
    `cut_every` is cut short at `cut`."""
    traces, rng = Traces(), random.Random(7)
    for n in range(seconds * 5):
        start = T0 + timedelta(milliseconds=200 * n)
        faulty = n >= fault_at * 5
        fails = faulty and cart_fails_every and n % cart_fails_every == 0
        traces.request(n + 1, start, cart_ms if faulty else 20.0, gap_ms if faulty else 0.5, bool(fails), rng,
                       cut if faulty and n % cut_every == 0 else "")
    return traces


def _store(tmp_path, **mesh) -> Store:
    """A DuckDB store of _mesh(**mesh)."""
    store = Store(tmp_path / "g.duckdb")
    store.write(_mesh(**mesh).frames())
    return store


WINDOWS = graph.Windows(T0, T0 + timedelta(minutes=9), T0 + timedelta(minutes=10), T0 + timedelta(minutes=11))


def test_requests_and_other_spans_go_to_their_tables(tmp_path):
    with _store(tmp_path, seconds=10) as store:
        assert store.scalar("SELECT count(*) FROM requests") == 50 * 3
        assert store.scalar("SELECT count(*) FROM spans") == 50 * 3
        assert store.scalar("SELECT count(*) FROM requests WHERE parent_id IS NULL") == 50  # the entries
        kinds = dict(store.rows("SELECT kind, count(*) FROM spans GROUP BY kind"))
        assert kinds == {SPAN_KIND_CLIENT: 100, SPAN_KIND_INTERNAL: 50}


def test_own_time_leaves_out_the_children_and_a_call_keeps_its_gap(tmp_path):
    with _store(tmp_path, seconds=2) as store:
        spans = graph.own_times(graph.trace_spans(store, T0, T0 + timedelta(hours=1)))
    calls = spans.filter(pl.col("kind") == SPAN_KIND_CLIENT)
    assert calls["own_ms"].to_list() == pytest.approx([0.5] * len(calls), abs=1e-3)
    assert set(calls["callee_service"].to_list()) == {"cart", "catalog"}
    catalog = spans.filter((pl.col("service") == "catalog") & (pl.col("kind") == SPAN_KIND_SERVER))
    internal = spans.filter(pl.col("kind") == SPAN_KIND_INTERNAL)
    assert (catalog["own_ms"] + internal["own_ms"]).to_list() == pytest.approx(catalog["duration_ms"].to_list(), abs=2e-3)
    entries = graph.entries(spans)
    assert entries["entry_service"].unique().to_list() == ["frontend"] and entries["entry_tier"][0] == "gold"


@pytest.mark.parametrize("limit", [graph.LIFT_LIMIT, 0])  # 0: as where spans are long enough to overflow the lift
def test_own_time_counts_parallel_and_nested_calls_once(limit, monkeypatch):
    """Children covering [10, 40], [20, 50] and [60, 70] ms of a 100 ms span leave it 50 ms of its own; a child
    covering all of another span leaves it none; a child running past its parent counts only inside it; one
    parent's calls never count against another's."""
    monkeypatch.setattr(graph, "LIFT_LIMIT", limit)
    rows = [  # (trace, span, parent, start ms, duration ms)
        (1, 1, None, 0, 100), (1, 2, 1, 10, 30), (1, 3, 1, 20, 30), (1, 4, 1, 60, 10),
        (2, 5, None, 0, 100), (2, 6, 5, 0, 100), (2, 7, 6, 90, 50), (3, 8, None, 5, 20), (3, 9, 8, 5, 0.5),
        (4, 10, None, 0, 100), (4, 11, 10, 0, 10), (4, 12, 10, 50, 10)]
    spans = pl.DataFrame({
        "trace": [r[0] for r in rows], "span_id": [r[1] for r in rows], "parent_id": [r[2] for r in rows],
        "kind": [SPAN_KIND_SERVER] * len(rows), "service": "s", "pod": "p", "node": "n", "tier": "gold",
        "start_time": [T0 + timedelta(milliseconds=r[3]) for r in rows], "duration_ms": [float(r[4]) for r in rows],
        "failed": False, "peer": None}, schema_overrides={"trace": pl.UInt64, "span_id": pl.UInt64,
                                                          "parent_id": pl.UInt64, "peer": pl.String})
    own = dict(graph.own_times(spans).select("span_id", "own_ms").iter_rows())
    assert own == pytest.approx({1: 50.0, 2: 30.0, 3: 30.0, 4: 10.0, 5: 0.0, 6: 90.0, 7: 50.0, 8: 19.5, 9: 0.5,
                                 10: 80.0, 11: 10.0, 12: 10.0})


def test_a_slow_deep_service_is_the_culprit_with_its_path(tmp_path):
    with _store(tmp_path, cart_ms=80.0) as store:
        found, entry = graph.culprits(store, WINDOWS)
    assert entry["latency_growth_ms"] == pytest.approx(60, rel=0.1)
    top = found[0]
    assert (top["service"], top["pod"], top["node"], top["kind"]) == ("cart", "cart-1", "node-b", graph.SELF)
    assert top["share"] > 0.9 and top["path"] == ["frontend", "cart"]
    assert top["baseline"] == pytest.approx(20, rel=0.1) and top["observed"] == pytest.approx(80, rel=0.1)
    assert len(found) == 1  # frontend and catalog did not change


def test_a_slower_wire_names_the_pod_its_slowed_calls_share(tmp_path):
    with _store(tmp_path, gap_ms=30.0) as store:
        found, _ = graph.culprits(store, WINDOWS)
    top = found[0]
    assert top["kind"] == graph.NETWORK and top["service"] == "frontend"  # both of its calls slowed
    assert {e["callee"] for e in top["edges"]} == {"cart", "catalog"}


def test_failures_are_placed_where_they_began(tmp_path):
    with _store(tmp_path, cart_fails_every=3) as store:
        found, entry = graph.culprits(store, WINDOWS)
    errors = [c for c in found if c["kind"] == graph.ERRORS]
    assert entry["observed_error_ratio"] == pytest.approx(1 / 3, abs=0.02)
    assert [(c["service"], c["node"]) for c in errors] == [("cart", "node-b")]


def test_requests_answered_without_their_calls_name_where_they_now_end(tmp_path):
    """With no status on any span, a service that stops calling is where its requests end: itself when it calls
    no one, or the callee whose answer it gave up after; half the calls gone is a cut, a tenth a changed mix."""
    with _store(tmp_path, cut="frontend") as store:
        found, entry = graph.culprits(store, WINDOWS)
    assert entry["latency_growth_ms"] < 0 and entry["error_growth"] == 0
    assert [(c["service"], c["kind"], c["cut_at"]["service"]) for c in found] == [("frontend", graph.CUT, "frontend")]
    assert found[0]["baseline"] == pytest.approx(2.0) and found[0]["observed"] == 0 and found[0]["share"] == 1.0
    assert found[0]["onset"] == T0 + timedelta(minutes=10)
    with _store(tmp_path / "cart", cut="cart") as store:
        found, _ = graph.culprits(store, WINDOWS)
        moment = explain_moment(store, load_spec(None), T0 + timedelta(minutes=10))["moment"]
    top = found[0]
    assert (top["service"], top["pod"], top["kind"], top["cut_at"]["service"]) == ("cart", "cart-1", graph.CUT,
                                                                                   "frontend")
    assert top["share"] == pytest.approx(0.5) and top["path"] == ["frontend", "cart"]
    first = moment["causes"][0]
    assert (first["service"], first["cause"], first["culprit"]) == ("cart", "application", graph.CUT)
    assert first["evidence"][0]["signal"] == "trace.calls_made"
    with _store(tmp_path / "mix", cut="cart", cut_every=5) as store:
        assert graph.culprits(store, WINDOWS)[0] == []


def test_a_steady_mesh_has_no_culprit(tmp_path):
    with _store(tmp_path, fault_at=10**6) as store:
        assert graph.culprits(store, WINDOWS)[0] == []


def test_the_service_graph_counts_calls_and_gaps(tmp_path):
    with _store(tmp_path, seconds=60) as store:
        shown = graph.service_graph(store, T0, T0 + timedelta(seconds=60))
    edges = {(e["source"], e["target"]): e for e in shown["edges"]}
    assert set(edges) == {("frontend", "cart"), ("frontend", "catalog")}
    assert edges["frontend", "cart"]["calls_per_s"] == pytest.approx(5.0)
    assert edges["frontend", "cart"]["network_gap_ms"] == pytest.approx(0.5, abs=0.01)
    nodes = {n["service"]: n for n in shown["nodes"]}
    assert nodes["cart"]["pods"] == ["cart-1"] and nodes["cart"]["nodes"] == ["node-b"]


def test_a_moment_names_the_culprit_and_its_cause(tmp_path):
    """With no physical signal anywhere, a slower service is the application's doing; a slower wire is
    network_latency on the pod its slowed calls share."""
    at = T0 + timedelta(minutes=10)
    with _store(tmp_path, cart_ms=80.0) as store:
        moment = explain_moment(store, load_spec(None), at)["moment"]
    first = moment["causes"][0]
    assert (first["service"], first["pod"], first["node"], first["cause"]) == ("cart", "cart-1", "node-b",
                                                                               "application")
    assert moment["culprits"][0]["path"] == ["frontend", "cart"] and "cart" in first["remediation"]
    assert moment["diagnosis"]["verdict"] == "ranked"
    with _store(tmp_path / "wire", gap_ms=30.0) as store:
        moment = explain_moment(store, load_spec(None), at)["moment"]
    assert [(c["service"], c["cause"]) for c in moment["causes"]][:1] == [("frontend", "network_latency")]


def test_clickhouse_reads_the_same_graph(tmp_path):
    """The exporter's otel_traces hold every kind with ParentSpanId: the culprits and the service graph are the
    DuckDB store's."""
    pytest.importorskip("chdb")
    traces, rng = Traces(), random.Random(3)
    for n in range(900 * 5):
        traces.request(n + 1, T0 + timedelta(milliseconds=200 * n), 80.0 if n >= 3000 else 20.0, 0.5, rng=rng)
    with Store(tmp_path / "d.duckdb") as duck, open_store(f"chdb:///{tmp_path}/ch") as house:
        for store in (duck, house):
            store.write(traces.frames())
        found = [graph.culprits(store, WINDOWS)[0] for store in (duck, house)]
        shown = [graph.service_graph(store, T0, T0 + timedelta(minutes=1)) for store in (duck, house)]
    assert found[0] == found[1] and found[0][0]["service"] == "cart"
    assert shown[0]["edges"] == shown[1]["edges"] and shown[0]["nodes"] == shown[1]["nodes"]
    assert shown[0]["kinds"] == shown[1]["kinds"] == {"1": "internal", "2": "server", "3": "client"}


def test_the_graph_command_and_rca_at_through_the_cli(tmp_path, capsys):
    with _store(tmp_path, cart_ms=80.0) as store:
        path = store.path
    assert main(["graph", "--db", str(path), "--at", "2026-12-01T12:10:00Z"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["since"] == "2026-12-01T12:10:00Z" and {e["target"] for e in shown["edges"]} == {"cart", "catalog"}
    assert main(["graph", "--db", str(path), "--at", "5m", "--since", "10m"]) == 2
    assert "--at asks for a minute" in capsys.readouterr().err
    assert main(["rca", "--db", str(path), "--at", "2026-12-01T12:10:00Z", "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert "culprit frontend -> cart (cart-1 on node-b): self: 19.97 -> 80.17 ms" in table and "application" in table


def _cpu(minutes: int, busy_from: int, node: str, pod: str | None, level: float, added: float) -> dict:
    """kubeletstats' CPU usage every 10 s: the node's (no pod) or a pod's."""
    name = "k8s.pod.cpu.usage" if pod else "k8s.node.cpu.usage"
    rng = random.Random(hash((node, pod)) % 1000)
    points = [(int((T0 + timedelta(seconds=s)).timestamp() * 1e9),
               level + rng.gauss(0, level / 20) + (added if s >= busy_from * 60 else 0.0))
              for s in range(0, minutes * 60, 10)]
    attrs = [attr("k8s.node.name", node)] + ([attr("k8s.pod.name", pod), attr("k8s.namespace.name", "shop")]
                                            if pod else [])
    return {"resourceMetrics": [{"resource": {"attributes": attrs},
                                 "scopeMetrics": [{"metrics": [gauge(name, points)]}]}]}


def test_the_culprit_pods_own_cpu_names_cpu_contention_on_a_node_that_hardly_moved(tmp_path):
    """The node's CPU usage (a stronger rank) goes from 12 to 12.5 CPUs, lost in its noise; the culprit pod's goes
    from nothing to half a CPU: its own series count for the culprit."""
    with _store(tmp_path, cart_ms=80.0) as store:
        path = store.path
    lines = [_cpu(15, 10, "node-b", None, 12.0, 0.5), _cpu(15, 10, "node-b", "cart-1", 0.01, 0.5),
             _cpu(15, 10, "node-b", "noisy-1", 0.5, 0.0)]
    with Store(path) as store:
        Ingestor(store, TierResolver.from_spec(load_spec(None))).ingest_files(
            [write_lines(tmp_path / "cpu.jsonl", lines)])
        moment = explain_moment(store, load_spec(None), T0 + timedelta(minutes=10))["moment"]
    first = moment["causes"][0]
    assert (first["service"], first["pod"], first["node"], first["cause"]) == ("cart", "cart-1", "node-b",
                                                                               "cpu_contention")
    assert any(ev["attributes"].get("k8s.pod.name") == "cart-1" for ev in first["evidence"])


def test_a_culprits_onset_is_where_its_change_began(tmp_path):
    with _store(tmp_path, cart_ms=80.0) as store:
        moment = explain_moment(store, load_spec(None), T0 + timedelta(minutes=11), lookback=timedelta(minutes=2))
    assert moment["moment"]["culprits"][0]["onset"] == "2026-12-01T12:10:00Z"
    json.dumps(moment)  # every value is JSON's
