"""The remediation audit: what each row says of its decision (client, dry_run), an older audit table brought up
to date, an undo that waits while another firing alert still needs its target or while its own action still
runs, and the audit's retention."""

import threading
from datetime import timedelta

import duckdb
import pytest

from sloscope.alerts.actions import ConfigError
from sloscope.alerts.remediation_config import parse_config
from tests.alerts.test_remediation import DRAIN_PARAMS, FakeRunner, alert, make_engine

DRAIN = {"action": "nft_drain_backend", "params": DRAIN_PARAMS}
AUDITED = "alert, action, decision, reason, client, dry_run"


def audit(tmp_path, columns=AUDITED):
    with duckdb.connect(str(tmp_path / "audit.duckdb")) as con:
        return con.execute(f"SELECT {columns} FROM remediation_audit ORDER BY ts, rowid").fetchall()


def test_each_row_says_whether_its_decision_was_taken_under_a_dry_run_config(tmp_path):
    engine, _ = make_engine(tmp_path, {"Live": DRAIN, "Rehearsal": {**DRAIN, "dry_run": True}}, execute=True)
    engine.handle([alert("Live", fp="01", node="gpu-node-1"), alert("Rehearsal", fp="03", node="gpu-node-3"),
                   alert("Unlisted", fp="04", node="gpu-node-3")], client="10.1.2.3")
    engine.handle([alert("Rehearsal", status="resolved", fp="03", node="gpu-node-3")])
    assert [(a, d, c, dry) for a, _, d, _, c, dry in audit(tmp_path)] == [
        ("Live", "executed", "10.1.2.3", False), ("Rehearsal", "dry_run", "10.1.2.3", True),
        ("Unlisted", "refused", "10.1.2.3", False),
        ("Rehearsal", "dry_run", None, True)]  # the undo of a rehearsal; handled without a request here


def test_an_audit_table_of_an_older_sloscope_gets_the_new_columns(tmp_path):
    with duckdb.connect(str(tmp_path / "audit.duckdb")) as con:
        con.execute("CREATE TABLE remediation_audit (ts TIMESTAMP NOT NULL, alert VARCHAR NOT NULL, fingerprint "
                    "VARCHAR NOT NULL, starts_at TIMESTAMP, action VARCHAR, target VARCHAR, params VARCHAR, "
                    "decision VARCHAR NOT NULL, reason VARCHAR)")
        con.execute("INSERT INTO remediation_audit VALUES ('2025-12-31 00:00:00', 'Old', 'ab', NULL, 'notify_only', "
                    "'notify', '{}', 'executed', 'notified only')")
    engine, _ = make_engine(tmp_path, {"New": DRAIN})
    assert engine.handle([alert("New", node="gpu-node-3")], client="10.1.2.3")[0]["decision"] == "dry_run"
    assert audit(tmp_path, "alert, decision, client, dry_run") == [("Old", "executed", None, None),
                                                                   ("New", "dry_run", "10.1.2.3", True)]


def test_an_undo_waits_while_another_firing_alert_needs_its_target(tmp_path):
    """Two alerts drain one node: the first to resolve must not put the node back while the other fires."""
    runner = FakeRunner()
    engine, clock = make_engine(tmp_path, {"GpuSaturated": DRAIN, "NodeErrors": DRAIN}, runner, execute=True,
                                cooldown="1m")
    assert engine.handle([alert("GpuSaturated", fp="0a", node="gpu-node-3")])[0]["decision"] == "executed"
    clock.t = clock.t.replace(minute=5)  # past the cooldown: the second alert drains the node too
    assert engine.handle([alert("NodeErrors", fp="0b", node="gpu-node-3")])[0]["decision"] == "executed"

    resolved = alert("GpuSaturated", status="resolved", fp="0a", node="gpu-node-3")
    [deferred] = engine.handle([resolved])
    assert (deferred["decision"], deferred["reason"]) == ("deferred", "undo deferred: still needed by NodeErrors")
    assert engine.handle([resolved])[0]["decision"] == "duplicate"
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "delete"]  # the node is still out

    [last] = engine.handle([alert("NodeErrors", status="resolved", fp="0b", node="gpu-node-3")])
    assert last["decision"] == "executed"
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "delete", "add", "add"]  # both undone, newest first
    assert audit(tmp_path, "alert, action, decision, reason")[2:] == [
        ("GpuSaturated", "nft_drain_backend.undo", "deferred", "undo deferred: still needed by NodeErrors"),
        ("NodeErrors", "nft_drain_backend.undo", "executed", "done"),
        ("GpuSaturated", "nft_drain_backend.undo", "executed",
         "deferred undo, no firing alert needs the target now: done")]


def test_an_undo_on_another_target_is_not_held_back(tmp_path):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"GpuSaturated": DRAIN}, runner, execute=True)
    engine.handle([alert("GpuSaturated", fp="0a", node="gpu-node-3"),
                   alert("GpuSaturated", fp="0b", node="gpu-node-1")])
    [undo] = engine.handle([alert("GpuSaturated", status="resolved", fp="0a", node="gpu-node-3")])
    assert undo["decision"] == "executed" and runner.calls[-1][0][1] == "add"


def test_a_resolve_that_comes_while_the_action_runs_undoes_it_once_it_ends(tmp_path):
    """The firing's drain is slow; its resolve arrives meanwhile. The node must not stay drained: the resolve is
    recorded against the running action, which is undone as soon as it is recorded open."""
    gate = threading.Event()
    runner = FakeRunner(gate=gate, gate_if="delete")  # the drain waits for the gate; its undo does not
    engine, _ = make_engine(tmp_path, {"GpuSaturated": DRAIN}, runner, execute=True)
    fired = {}
    firing = threading.Thread(target=lambda: fired.update(engine.handle([alert("GpuSaturated",
                                                                               node="gpu-node-3")])[0]))
    firing.start()
    assert runner.started.wait(5)
    resolved = alert("GpuSaturated", status="resolved", node="gpu-node-3")
    [early] = engine.handle([resolved])
    assert early["decision"] == "deferred" and "still running" in early["reason"]
    gate.set()
    firing.join(10)
    assert fired["decision"] == "executed"
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "add"]  # drained, then put back
    assert engine.handle([resolved])[0]["decision"] == "duplicate"
    assert audit(tmp_path, "action, decision, reason") == [  # in the order they were decided
        ("nft_drain_backend.undo", "deferred", "the firing's action is still running; it is undone as soon as it "
                                               "ends"),
        ("nft_drain_backend", "executed", "done"),
        ("nft_drain_backend.undo", "executed", "its alert resolved while the action ran: done")]
    with duckdb.connect(str(tmp_path / "audit.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM remediation_open WHERE closed_at IS NULL").fetchone()[0] == 0


def test_the_audit_keeps_its_retention_and_every_open_action(tmp_path):
    """Decisions, deliveries and undone actions older than audit_retention go, checked at most hourly; an action
    still open stays however old, and its resolve still undoes it."""
    runner = FakeRunner()
    engine, clock = make_engine(tmp_path, {"GpuSaturated": DRAIN}, runner, execute=True, audit_retention="2d")
    engine.handle([alert("GpuSaturated", fp="0a", node="gpu-node-3"), alert("GpuSaturated", fp="0b",
                                                                            node="gpu-node-1")])
    engine.handle([alert("GpuSaturated", status="resolved", fp="0b", node="gpu-node-1")])
    clock.t += timedelta(days=3)
    engine.handle([alert("Unlisted", fp="0c")])  # the first request in three days prunes before it is handled
    assert audit(tmp_path, "alert, decision") == [("Unlisted", "refused")]
    with duckdb.connect(str(tmp_path / "audit.duckdb")) as con:
        assert con.execute("SELECT fingerprint, closed_at FROM remediation_open").fetchall() == [("0a", None)]
    [undo] = engine.handle([alert("GpuSaturated", status="resolved", fp="0a", node="gpu-node-3")])
    assert undo["decision"] == "executed" and runner.calls[-1][0][1] == "add"


def test_an_audit_retention_under_a_day_is_refused():
    with pytest.raises(ConfigError, match="audit_retention.*at least 1d"):
        parse_config("audit_retention: 1h\n")
