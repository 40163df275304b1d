"""Episodes that follow their evidence, and causes that say how sure they are: two faults on one node 40 s
apart are two episodes, each explained by its own cause; an incident whose node's signals did not move says
"no clear cause" and why; a short history is used down to a stated minimum, and the JSON says how much."""

import random

from sloscope.analytics.attribution import CLEAR_CAUSE_FLOOR
from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse, format_table
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import load_spec
from tests.otlp_builders import gauge, metrics, span, traces, write_lines

T0 = 1_764_410_400_000_000_000
S = 1_000_000_000
SPEC = load_spec(None)
DISK = (600, 640)  # seconds into the run
LOSS = (680, 730)  # starts 40 s after the disk fault ended


def _signals(node, rng, seconds, disk=None, loss=None):
    block, retransmits = [], []
    for s in seconds:
        t = T0 + s * S
        block.append((t, rng.gauss(0.002, 0.0002) * (8 if disk and disk[0] <= s < disk[1] else 1)))
        retransmits.append((t, rng.gauss(5, 1) + (200 if loss and loss[0] <= s < loss[1] else 0)))
    return metrics([gauge("sloscope.block.io.duration", block, {"system.device": "nvme0n1"}),
                    gauge("sloscope.tcp.retransmits", retransmits)], node=node)


def _requests(node, rng, seconds, slow_spans, base):
    spans = []
    for i in range(len(seconds) * 5):
        s = seconds[0] + i / 5
        slow = any(a + 8 <= s < b for a, b in slow_spans)
        ms = rng.lognormvariate(5.2, 0.25) * (6 if slow else 1)  # median ~180 ms against p99 <= 800 ms
        spans.append(span(f"{base + i:032x}", f"{base + i:016x}", T0 + int(s * S), ms, tier=["p99-latency-critical"]))
    return traces(spans, node=node)


def _store(tmp_path, first_second, faults_on_n1, quiet_signals=False):
    rng = random.Random(11)
    seconds = range(first_second, 800)
    lines = []
    for k, node in enumerate(["n1", "n2", "n3"]):
        mine = faults_on_n1 if node == "n1" else {}
        lines.append(_signals(node, rng, seconds, **({} if quiet_signals else mine)))
        lines.append(_requests(node, rng, seconds, list(mine.values()), base=k * 10**6))
    with Store(tmp_path / "c.duckdb") as store:
        Ingestor(store, TierResolver.from_spec(SPEC)).ingest_files([write_lines(tmp_path / "c.jsonl", lines)])
    return Store(tmp_path / "c.duckdb", read_only=True)


def test_two_faults_on_one_node_40_s_apart_are_two_episodes_each_with_its_own_cause(tmp_path):
    with _store(tmp_path, 0, {"disk": DISK, "loss": LOSS}) as store:
        incidents = analyse(store, SPEC)["incidents"]
    assert [i["node"] for i in incidents] == ["n1", "n1"]
    disk, loss = incidents
    assert disk["causes"][0]["cause"] == "disk_io" and loss["causes"][0]["cause"] == "network_loss"
    # Each is explained from its own onset: the packet loss's evidence starts with the packet loss.
    assert loss["causes"][0]["evidence"][0]["onset"] >= "2025-11-29T10:11:15Z"
    assert all(c["score"] >= CLEAR_CAUSE_FLOOR for c in (disk["causes"][0], loss["causes"][0]))


def test_an_incident_without_moved_evidence_says_no_clear_cause_and_why(tmp_path, capsys):
    with _store(tmp_path, 0, {"disk": DISK}, quiet_signals=True) as store:
        result = analyse(store, SPEC)
    [incident] = result["incidents"]
    diagnosis = incident["diagnosis"]
    assert incident["causes"] == [] and diagnosis["verdict"] == "no_clear_cause"
    assert diagnosis["floor"] == CLEAR_CAUSE_FLOOR and "floor" in diagnosis["reason"]
    candidates = diagnosis["candidates"]
    assert {c["cause"] for c in candidates} >= {"disk_io", "network_loss"}
    assert all(c["score"] < CLEAR_CAUSE_FLOOR and c["falls_short"] for c in candidates)
    assert any("robust deviations" in reason for c in candidates for reason in c["falls_short"])
    assert "no clear cause" in format_table(result) and "disk_io" in format_table(result)


def test_a_short_history_is_used_down_to_its_minimum_and_the_json_says_how_much(tmp_path):
    with _store(tmp_path, DISK[0] - 60, {"disk": DISK}) as store:  # one minute of history before the fault
        [incident] = analyse(store, SPEC)["incidents"]
    baseline = incident["diagnosis"]["baseline"]
    assert incident["causes"][0]["cause"] == "disk_io"
    assert baseline["requested_s"] == 600 and baseline["minimum_s"] <= baseline["used_s"] < 600
    assert baseline["lookback_s"] < 60


def test_too_short_a_history_is_an_insufficient_baseline_with_a_reason(tmp_path):
    with _store(tmp_path, DISK[0] - 5, {"disk": DISK}) as store:
        [incident] = analyse(store, SPEC)["incidents"]
    diagnosis = incident["diagnosis"]
    assert incident["causes"] == [] and diagnosis["verdict"] == "insufficient_baseline"
    assert diagnosis["baseline"]["used_s"] < diagnosis["baseline"]["minimum_s"]
    assert "needed" in diagnosis["reason"]
