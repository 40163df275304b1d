"""Attribution from the Collector's receivers: alone they find the cause on the right node, and beside sloscope's own
probes the stronger measure is the one used, with no second score."""

import random

import pytest

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope import catalog
from sloscope.slo_spec import load_spec
from tests.otlp_builders import counter as own_counter
from tests.otlp_builders import gauge as own_gauge
from tests.otlp_builders import metrics as own_metrics
from tests.otlp_builders import span, traces, write_lines
from tests.receiver_otlp import cumulative, dcgm_labels, gauge, hostmetrics, kubeletstats, prometheus_scrape

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000
MINUTES = 16
FAULT_AT = 12 * 60  # seconds into the run
STEP = 5  # the receivers' collection interval, s
TIMES = range(0, MINUTES * 60, STEP)
SPEC = load_spec(None)


def _t(s):
    return T0 + s * S


def _level(rng, base, sd, fault_value=None, at=FAULT_AT):
    return [(_t(s), fault_value if fault_value is not None and s >= at else max(0.0, rng.gauss(base, sd)))
            for s in TIMES]


def _running(rng, rate, sd, fault_rate=None):
    """A cumulative counter's points from per-second rates."""
    total, out = 1000.0, []
    for s in TIMES:
        r = fault_rate if fault_rate is not None and s >= FAULT_AT else max(0.0, rng.gauss(rate, sd))
        total += r * STEP
        out.append((_t(s), total))
    return out


def _host(node, rng, fault=None):
    busy = fault == "cpu"
    cpus = [gauge("system.cpu.utilization", "1", _level(rng, 0.25, 0.02, 0.97 if busy and cpu == 1 else None),
                  {"cpu": f"cpu{cpu}", "state": "user"}) for cpu in range(2)]
    cpus += [gauge("system.cpu.utilization", "1", _level(rng, 0.05, 0.005), {"cpu": f"cpu{cpu}", "state": "system"})
             for cpu in range(2)]
    return hostmetrics(node, {
        "cpu": cpus,
        "load": [gauge("system.cpu.load_average.1m", "{thread}", _level(rng, 1.2, 0.1, 4.5 if busy else None))],
        "memory": [gauge("system.memory.utilization", "1", _level(rng, 0.55, 0.005), {"state": "used"})],
        "paging": [cumulative("system.paging.faults", "{faults}", _t(-3600), _running(
            rng, 2.0, 0.5, 400.0 if fault == "memory" else None), {"type": "major"}, True)],
        "disk": [cumulative("system.disk.io_time", "s", _t(-3600), _running(
            rng, 0.1, 0.01, 0.95 if fault == "disk" else None), {"device": "nvme0n1"})],
    })


def _kubelet(node, rng, fault=None):
    pods = [(f"vllm-{node}", "inference", [gauge("k8s.pod.cpu.usage", "{cpu}", _level(rng, 2.0, 0.1))], {}),
            (f"batch-{node}", "jobs", [gauge("k8s.pod.cpu.usage", "{cpu}", _level(
                rng, 0.5, 0.05, 7.5 if fault == "neighbour" else None))], {})]
    return kubeletstats(node, [gauge("k8s.node.memory.working_set", "By", _level(rng, 50e9, 1e8), integer=True)],
                        pods)


def _dcgm(node, rng, fault=None):
    labels = dcgm_labels(node)
    hot = fault == "gpu"
    return prometheus_scrape(f"10.4.2.{len(node)}:9400", [
        gauge("DCGM_FI_DEV_GPU_UTIL", "", _level(rng, 50.0, 3.0, 99.0 if hot else None), labels),
        gauge("DCGM_FI_PROF_SM_ACTIVE", "", _level(rng, 0.3, 0.02, 0.92 if hot else None), labels),
        gauge("DCGM_FI_DEV_GPU_TEMP", "", _level(rng, 60.0, 0.5), labels),
    ], times=list(map(_t, TIMES)))


def _requests(node, rng, slow, base):
    spans = []
    for i in range(MINUTES * 60 * 5):
        s = i / 5
        ms = rng.lognormvariate(5.2, 0.25) * (4 if slow and s >= FAULT_AT + 8 else 1)
        spans.append(span(f"{base + i:032x}", f"{base + i:016x}", T0 + int(s * S), ms, tier=["p99-latency-critical"]))
    return traces(spans, node=node)


def _store(path, lines):
    with Store(path) as store:
        report = Ingestor(store, TierResolver.from_spec(SPEC)).ingest_files([write_lines(path.with_suffix(".jsonl"),
                                                                                         lines)])
        assert report.rejected_count == 0
    return path


def _top(path):
    with Store(path, read_only=True) as store:
        return {i["node"]: i for i in analyse(store, SPEC)["incidents"]}


# One fleet with no sloscope probe at all: each faulty node shows its fault only in the receivers' metrics. On n4
# only kubeletstats runs (no hostmetrics, whose node-wide CPU measures would rank above a pod's usage).
FAULTS = {"n1": "cpu", "n2": "gpu", "n3": "memory", "n4": "neighbour", "n5": None}
EXPECTED = {"n1": ("cpu_contention", catalog.HOSTMETRICS), "n2": ("gpu_sm_contention", catalog.PROMETHEUS),
            "n3": ("memory_pressure", catalog.HOSTMETRICS), "n4": ("cpu_contention", catalog.KUBELETSTATS)}


@pytest.fixture(scope="module")
def receivers_only(tmp_path_factory):
    rng = random.Random(11)
    lines = []
    for k, (node, fault) in enumerate(FAULTS.items()):
        host = _host(node, rng, fault)
        lines += [host] if node != "n4" else []
        lines += [_kubelet(node, rng, fault), _dcgm(node, rng, fault), _requests(node, rng, fault is not None,
                                                                                 k * 1_000_000)]
    return _top(_store(tmp_path_factory.mktemp("receivers") / "r.duckdb", lines))


@pytest.mark.parametrize("node", sorted(EXPECTED))
def test_receiver_metrics_alone_name_the_cause_on_the_right_node(receivers_only, node):
    cause, producer = EXPECTED[node]
    top = receivers_only[node]["causes"][0]
    assert top["cause"] == cause, receivers_only[node]["causes"][:3]
    assert top["score"] >= 0.5
    assert {ev["source"] for ev in top["evidence"]} == {producer}


def test_a_healthy_node_has_no_incident_from_receiver_metrics(receivers_only):
    assert set(receivers_only) == set(EXPECTED)


def test_evidence_names_the_series_it_used_and_where_it_came_from(receivers_only):
    ev = receivers_only["n2"]["causes"][0]["evidence"][0]
    assert ev["signal"] in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE")
    assert ev["attributes"]["Hostname"] == "n2" and ev["attributes"]["UUID"].startswith("GPU-")
    assert ev["measure"] == "gpu.sm_busy" and ev["rank"] == 2
    cpu = receivers_only["n1"]["causes"][0]["evidence"]
    assert {(e["signal"], e["attributes"].get("cpu")) for e in cpu} >= {("system.cpu.utilization", "cpu1")}
    neighbour = receivers_only["n4"]["causes"][0]["evidence"][0]  # a pod's series counts for its node
    assert neighbour["signal"] == "k8s.pod.cpu.usage" and neighbour["attributes"] == {
        "k8s.pod.name": "batch-n4", "k8s.namespace.name": "jobs"}


# sloscope's own probes beside hostmetrics and dcgm-exporter on the same nodes.
def _own(node, rng, fault, own_moves):
    runq = [(_t(s), rng.gauss(4e-4, 4e-5) * (6 if fault == "cpu" and own_moves and s >= FAULT_AT else 1))
            for s in TIMES]
    busy = [(_t(s), 0.97 if fault == "gpu" and own_moves and s >= FAULT_AT else rng.gauss(0.55, 0.03))
            for s in TIMES]
    block = [(_t(s), rng.gauss(2.5e-4, 2e-5) * (8 if fault == "disk" and own_moves and s >= FAULT_AT else 1))
             for s in TIMES]
    stall, psi = 0.0, []
    for s in TIMES:
        stall += max(0.0, rng.gauss(0.01, 0.002)) * STEP
        psi.append((_t(s), stall))
    # histograms as gauges of their mean: attribution reads any instrument as a level
    return own_metrics([own_gauge("sloscope.cpu.runqueue.delay", runq),
                        own_gauge("sloscope.gpu.kernel.busy.max", busy, {"hw.id": dcgm_labels(node)["UUID"]}),
                        own_gauge("sloscope.block.io.duration", block, {"system.device": "nvme0n1"}),
                        own_counter("sloscope.pressure.stall", _t(-3600), psi,
                                    {"pressure.resource": "cpu", "pressure.kind": "some"})], node=node)


BOTH = {"m1": "cpu", "m2": "gpu", "m3": "disk", "m4": None, "m5": None}
MODES = {"own": (True, False), "own+receivers": (True, True), "quiet own+receivers": (False, True),
         "receivers": (None, True)}  # (own probe: moves with the fault / stays quiet / absent, receivers there)


def _fleet(path, own_moves, with_receivers):
    own_rng, other_rng, traffic_rng = random.Random(5), random.Random(6), random.Random(7)
    lines = []
    for k, (node, fault) in enumerate(BOTH.items()):
        own = _own(node, own_rng, fault, own_moves)  # drawn whether kept or not: every mode sees the same series
        lines += [own] if own_moves is not None else []
        receivers = [_host(node, other_rng, fault), _dcgm(node, other_rng, fault)]
        lines += receivers if with_receivers else []
        lines.append(_requests(node, traffic_rng, fault is not None, k * 1_000_000))
    return _top(_store(path, lines))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("both")
    return {mode: _fleet(tmp / f"{n}.duckdb", *args) for n, (mode, args) in enumerate(MODES.items())}


def _considered(incident, cause):
    """The cause as ranked, or as a candidate below the floor; None when it is neither."""
    if incident is None:
        return None
    ranked = incident["causes"] + incident["diagnosis"].get("candidates", [])
    return next((c for c in ranked if c["cause"] == cause), None)


CASES = [("m1", "cpu_contention"), ("m2", "gpu_sm_contention"), ("m3", "disk_io")]


@pytest.mark.parametrize("node, cause", CASES)
def test_beside_sloscopes_own_probe_the_receiver_neither_adds_to_nor_replaces_the_score(both, node, cause):
    alone, beside = _considered(both["own"][node], cause), _considered(both["own+receivers"][node], cause)
    assert both["own+receivers"][node]["causes"][0]["cause"] == cause
    # The same series give the same parts. Only what other causes explain may differ: the receivers give
    # memory_pressure evidence of its own, which explains part of a disk's movement.
    parts = {k: v for k, v in beside["score_parts"].items() if k != "unexplained"}
    assert parts == {k: v for k, v in alone["score_parts"].items() if k != "unexplained"}
    assert beside["score"] / beside["score_parts"]["unexplained"] == pytest.approx(
        alone["score"] / alone["score_parts"]["unexplained"], abs=2e-3)
    assert beside["evidence"] == alone["evidence"]
    assert {ev["source"] for ev in beside["evidence"]} == {catalog.OWN}
    assert {ev["rank"] for ev in beside["evidence"]} == {1}


@pytest.mark.parametrize("node, cause", CASES)
def test_a_receiver_that_moved_does_not_stand_in_for_an_own_probe_that_did_not(both, node, cause):
    """The receivers alone name the cause; beside an own probe that saw nothing, their weaker measure is not
    read, so the cause stays below the floor on the own probe's evidence."""
    assert both["receivers"][node]["causes"][0]["cause"] == cause
    quiet = _considered(both["quiet own+receivers"].get(node), cause)
    assert quiet is None or (quiet["score"] < 0.3 and {ev["source"] for ev in quiet["evidence"]} == {catalog.OWN})
