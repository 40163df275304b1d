"""Signals scraped every 60 s (Prometheus' default, the Collector's receivers) are judged by their own points: the
last point in the window stands for its minute, and no finer step they cannot fill keeps them from counting."""

import random
from datetime import datetime, timedelta

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import explain_moment
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.slo_spec import load_spec
from tests.otlp_builders import gauge, metrics, write_lines

SPEC = load_spec(None)
T0 = datetime(2026, 12, 1, 12, 0, 0)
FAULT_MIN = 15


def _store(tmp_path, fault_minutes: int):
    """k8s.node.cpu.usage of three nodes every 60 s for 20 min; on n1, from FAULT_MIN for fault_minutes, 3 CPUs
    busier."""
    rng, lines = random.Random(5), []
    for node in ("n1", "n2", "n3"):
        points = []
        for minute in range(20):
            busy = node == "n1" and FAULT_MIN <= minute < FAULT_MIN + fault_minutes
            t = T0 + timedelta(minutes=minute, seconds=7)
            points.append((int(t.timestamp() * 1e9), 1.0 + rng.gauss(0, 0.05) + (3.0 if busy else 0.0)))
        lines.append(metrics([gauge("k8s.node.cpu.usage", points)], node=node))
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        Ingestor(store, TierResolver.from_spec(SPEC)).ingest_files([write_lines(tmp_path / "m.jsonl", lines)])
    return Store(path, read_only=True)


def test_a_60s_signal_with_one_point_of_its_fault_names_the_cause(tmp_path):
    """The minute from the fault's start holds one point of it, and the window no later one."""
    with _store(tmp_path, 3) as store:
        moment = explain_moment(store, SPEC, T0 + timedelta(minutes=FAULT_MIN))["moment"]
    first = moment["causes"][0]
    assert (first["node"], first["cause"]) == ("n1", "cpu_contention") and first["score"] >= 0.3
    assert first["evidence"][0]["onset"] is not None


def test_one_high_point_between_normal_ones_is_not_a_change(tmp_path):
    with _store(tmp_path, 1) as store:
        moment = explain_moment(store, SPEC, T0 + timedelta(minutes=FAULT_MIN - 1))["moment"]
    assert moment["causes"] == []
