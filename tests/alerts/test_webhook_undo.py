"""The webhook's undo on resolve, over HTTP: an alert about a target holds back the undo of that target's open
actions while it fires, whether its own action was taken or refused (cooldown, budget, another action in
progress); the last of them to resolve undoes what was actually done, and nothing else."""

import threading
from datetime import timedelta

import duckdb
import pytest

from sloscope.alerts.audit import AuditStore
from sloscope.alerts.remediation import Engine
from sloscope.alerts.remediation_config import parse_config
from sloscope.alerts.webhook import WebhookApp, WebhookServer
from sloscope.slo_spec import load_spec
from tests.alerts.test_remediation import Clock, FakeRunner
from tests.alerts.test_webhook import TOKEN, payload, post

CONFIG = """
execute: true
actions:
  SloscopeGpuSaturated:
    action: nft_drain_backend
    params: {table: lb, set: backends, addresses: {gpu-node-1: 10.0.0.1, gpu-node-3: 10.0.0.3}}
"""
ACTING, REFUSED = "0a1b2c3d4e5f6789", "0b1b2c3d4e5f6789"  # two GPUs of gpu-node-3: one target, backend:gpu-node-3
HELD = "undo deferred: still needed by SloscopeGpuSaturated"
# A config under which the second alert's own action is refused, the minutes between the two alerts, and the
# reason the refusal starts with. 'in progress': the second comes while the first one's command still runs.
REFUSALS = {
    "cooldown": ("", 5, "cooldown: backend:gpu-node-3 was acted on"),
    "budget": ("cooldown: 1m\nmax_actions_per_hour: 1\n", 5, "budget: 1 actions in the last hour"),
    "in progress": ("", 0, "another action on backend:gpu-node-3 is in progress"),
}


@pytest.fixture
def serve(tmp_path):
    """A webhook server for a remediation config and a clock, answering on 127.0.0.1; stopped after the test."""
    servers = []

    def start(config: str, runner: FakeRunner, clock: Clock | None = None) -> WebhookServer:
        engine = Engine(parse_config(config), AuditStore.at(tmp_path / "audit.duckdb"), load_spec(None).tiers,
                        runner=runner, now=clock)
        srv = WebhookServer(("127.0.0.1", 0), WebhookApp(engine, TOKEN, max_body=8192))
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def decide(server, status, fingerprint) -> dict:
    """POST one alert about gpu-node-3 (each fingerprint its own GPU) and return its result."""
    gpu = "GPU-1" if fingerprint == ACTING else "GPU-2"
    code, body, _ = post(server, payload(status=status, fp=fingerprint, gpu=gpu))
    assert code == 200, body
    [result] = body["results"]
    return result


def act_then_refuse(server, runner: FakeRunner, gate: threading.Event, clock: Clock, refusal: str) -> None:
    """The first alert drains the node; the second, about the same node, is refused for `refusal`."""
    _, minutes, reason = REFUSALS[refusal]
    results = {}
    first = threading.Thread(target=lambda: results.update(first=decide(server, "firing", ACTING)))
    first.start()
    if refusal == "in progress":
        assert runner.started.wait(5)
    else:
        gate.set()
        first.join(10)
    clock.t += timedelta(minutes=minutes)
    refused = decide(server, "firing", REFUSED)
    gate.set()
    first.join(10)
    assert results["first"]["decision"] == "executed"
    assert refused["decision"] == "refused" and refused["reason"].startswith(reason), refused


def undos(db, fingerprint) -> list[tuple]:
    with duckdb.connect(str(db)) as con:
        return con.execute("SELECT decision, reason FROM remediation_audit WHERE fingerprint = ? AND action = "
                           "'nft_drain_backend.undo' ORDER BY ts, rowid", [fingerprint]).fetchall()


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_an_alert_whose_action_was_refused_holds_back_the_undo_while_it_fires(serve, tmp_path, refusal):
    """Two alerts about one node; the second one's drain is refused. The first to resolve must not put the node
    back while the second still fires; the second's resolve puts it back, and undoes nothing it did not do."""
    gate = threading.Event()
    runner = FakeRunner(gate=gate, gate_if="delete")  # the drain waits for the gate; the undo does not
    clock = Clock()
    server = serve(REFUSALS[refusal][0] + CONFIG, runner, clock)
    act_then_refuse(server, runner, gate, clock, refusal)

    deferred = decide(server, "resolved", ACTING)
    assert (deferred["decision"], deferred["reason"]) == ("deferred", HELD)
    assert [argv[1] for argv, _ in runner.calls] == ["delete"]  # the node is still out of the backends

    last = decide(server, "resolved", REFUSED)
    assert last["decision"] == "ignored" and "the undos it held back on backend:gpu-node-3 were run" in last["reason"]
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "add"]  # put back once: the only drain done
    db = tmp_path / "audit.duckdb"
    assert undos(db, ACTING) == [("deferred", HELD),
                                 ("executed", "deferred undo, no firing alert needs the target now: done")]
    assert undos(db, REFUSED) == []  # its own drain was refused: nothing of it to undo


def test_a_refused_alert_that_resolves_first_holds_nothing_back(serve):
    gate = threading.Event()
    runner = FakeRunner(gate=gate, gate_if="delete")
    clock = Clock()
    server = serve(CONFIG, runner, clock)
    act_then_refuse(server, runner, gate, clock, "cooldown")

    first = decide(server, "resolved", REFUSED)
    assert (first["decision"], first["reason"]) == ("ignored", "nothing was opened for this alert")
    assert [argv[1] for argv, _ in runner.calls] == ["delete"]  # the other alert still fires: the node stays out
    undone = decide(server, "resolved", ACTING)
    assert (undone["decision"], undone["action"]) == ("executed", "nft_drain_backend.undo")
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "add"]


def test_a_refused_alert_about_another_node_holds_nothing_back(serve):
    runner = FakeRunner()
    server = serve("max_actions_per_hour: 1\n" + CONFIG, runner)
    assert decide(server, "firing", ACTING)["decision"] == "executed"
    code, body, _ = post(server, payload(fp="0c1b2c3d4e5f6789", node="gpu-node-1"))
    [other] = body["results"]
    assert code == 200 and (other["decision"], other["target"]) == ("refused", "backend:gpu-node-1")
    assert decide(server, "resolved", ACTING)["decision"] == "executed"
    assert [argv[1] for argv, _ in runner.calls] == ["delete", "add"]
