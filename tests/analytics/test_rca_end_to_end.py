"""Simulate a fleet with each physical cause of the taxonomy, ingest it, and require rca to name the cause on the right node."""

import json

import pytest

from sloscope.analytics.ingest import Ingestor
from sloscope.analytics.rca import analyse
from sloscope.analytics.store import Store
from sloscope.enrich.tiers import TierResolver
from sloscope.simulator.fleet import SimulationConfig, simulate
from sloscope.simulator.faults import PHYSICAL_CAUSES
from sloscope.commands.cli import main
from sloscope.slo_spec import load_spec

SPEC = load_spec(None)
RFC3339 = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"


def _fleet(tmp_path, cause, seed=3):
    out = tmp_path / "otlp"
    truth = simulate(SimulationConfig(out=out, nodes=3, seed=seed, fault=cause, rate=4.0, duration_s=1080))
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        report = Ingestor(store, TierResolver.from_spec(SPEC)).ingest_files(sorted(out.glob("*.jsonl*")))
    assert report.rejected_count == 0
    return truth, db


@pytest.mark.slow
@pytest.mark.parametrize("cause", PHYSICAL_CAUSES)  # those a node's signals show; the mesh has the rest
def test_rca_names_the_injected_cause_on_the_right_node(tmp_path, cause):
    truth, db = _fleet(tmp_path, cause)
    with Store(db, read_only=True) as store:
        incidents = analyse(store, SPEC)["incidents"]
    assert incidents, f"no incident found for {cause}"
    assert {i["node"] for i in incidents} == {truth.fault["node"]}
    for incident in incidents:
        assert incident["causes"][0]["cause"] == cause, incident["causes"][:3]


@pytest.mark.slow
def test_a_healthy_fleet_has_no_incident(tmp_path, capsys):
    _, db = _fleet(tmp_path, None)
    assert main(["rca", "--db", str(db), "--format", "table"]) == 0
    assert "No SLO violations" in capsys.readouterr().out


@pytest.mark.slow
def test_rca_json_follows_contract_4(tmp_path, capsys):
    truth, db = _fleet(tmp_path, "storage_queue", seed=5)
    assert main(["rca", "--db", str(db), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    incident = doc["incidents"][0]
    assert set(incident) == {"tier", "service", "node", "start", "end", "sli", "causes", "culprits", "diagnosis"}
    baseline = incident["diagnosis"]["baseline"]  # the run starts 10 min before the fault: all of that history is used
    assert incident["diagnosis"]["verdict"] == "ranked" and 500 < baseline["used_s"] <= baseline["requested_s"] == 600
    assert incident["tier"] in SPEC.tiers
    import re
    assert re.match(RFC3339, incident["start"]) and re.match(RFC3339, incident["end"])
    assert incident["sli"]["kind"] in ("latency", "availability")
    scores = [c["score"] for c in incident["causes"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    top = incident["causes"][0]
    assert top["cause"] == "storage_queue" and top["layer"] == "storage" and truth.fault["node"] in top["remediation"]
    ev = top["evidence"][0]
    assert {"signal", "attributes", "baseline", "observed", "onset"} <= set(ev)
    assert ev["signal"] in ("spdk.bdev.io.wait", "spdk.bdev.queue_depth", "spdk.reactor.busy")
    # --since/--until narrow the analysis: a range before the fault has no incident.
    assert main(["rca", "--db", str(db), "--format", "json", "--until", truth.fault["onset"]]) == 0
    assert json.loads(capsys.readouterr().out) == {"incidents": []}
