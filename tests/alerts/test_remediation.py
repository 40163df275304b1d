"""Remediation: allow-list, validation of every label before use, dry-run default, cooldown, budget, per-target
lock, idempotency, undo on resolve, the audit; real nftables in a network namespace; SPDK over its socket."""

import json
import os
import shutil
import subprocess
import threading
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from sloscope.alerts.actions import ActionFailed, ConfigError, Runner
from sloscope.analytics.store import Reader
from sloscope.alerts.audit import AuditStore
from sloscope.alerts.remediation import Engine, active_sampling_overrides
from sloscope.alerts.remediation_config import load_config, parse_config
from sloscope.slo_spec import load_spec, parse_spec
from tests.conftest import need

TIERS = frozenset(load_spec(None).tiers)
START = datetime(2026, 1, 1, 12, 0, 0)
DRAIN_PARAMS = {"table": "lb", "set": "backends", "addresses": {"gpu-node-1": "10.0.0.1", "gpu-node-3": "10.0.0.3"}}


class FakeRunner(Runner):
    """Records argument lists instead of running them; `fail` makes every run fail; `gate` holds runs."""

    def __init__(self, output="", fail=None, gate=None, gate_if=""):
        super().__init__()
        self.calls, self.output, self.fail, self.gate, self.gate_if = [], output, fail, gate, gate_if
        self.started = threading.Event()

    def run(self, argv, netns=None):
        self.calls.append((list(argv), netns))
        if self.gate is not None and self.gate_if in argv:
            self.started.set()
            self.gate.wait(10)
        if self.fail:
            raise ActionFailed(self.fail)
        return self.output


class Clock:
    def __init__(self):
        self.t = START

    def __call__(self):
        return self.t


def config(actions, **top):
    import yaml

    return parse_config(yaml.safe_dump({**top, "actions": actions}))


def make_engine(tmp_path, actions, runner=None, **top):
    clock = Clock()
    engine = Engine(config(actions, **top), AuditStore.at(tmp_path / "audit.duckdb"), TIERS,
                    runner=runner or FakeRunner(), now=clock)
    return engine, clock


def alert(name, status="firing", fp="0a1b2c3d4e5f6789", starts="2026-01-01T11:59:00.123456789Z", **labels):
    return {"status": status, "labels": {"alertname": name, **labels}, "annotations": {"summary": "s"},
            "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z", "fingerprint": fp}


def audit_rows(tmp_path):
    con = duckdb.connect(str(tmp_path / "audit.duckdb"))
    try:
        return [dict(zip(["alert", "fingerprint", "action", "target", "params", "decision", "reason"], r))
                for r in con.execute("SELECT alert, fingerprint, action, target, params, decision, reason "
                                     "FROM remediation_audit ORDER BY ts, rowid").fetchall()]
    finally:
        con.close()


def test_dry_run_is_the_default_and_is_audited_with_what_would_run(tmp_path):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"SloscopeGpuSaturated": {"action": "nft_drain_backend",
                                                                "params": DRAIN_PARAMS}}, runner)
    [result] = engine.handle([alert("SloscopeGpuSaturated", node="gpu-node-3", gpu="GPU-1")])
    assert result["decision"] == "dry_run" and "execution is off" in result["reason"]
    assert runner.calls == []
    [row] = audit_rows(tmp_path)
    assert row["decision"] == "dry_run" and row["target"] == "backend:gpu-node-3"
    assert json.loads(row["params"])["argv"] == ["nft", "delete", "element", "inet", "lb", "backends", "{",
                                                 "10.0.0.3", "}"]
    [undo] = engine.handle([alert("SloscopeGpuSaturated", status="resolved", node="gpu-node-3")])
    assert undo["decision"] == "dry_run" and undo["action"] == "nft_drain_backend.undo" and runner.calls == []


def test_executes_when_enabled_and_resolve_undoes_it_once(tmp_path):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"SloscopeGpuSaturated": {"action": "nft_drain_backend",
                                                                "params": {**DRAIN_PARAMS, "netns": "lbns"}}},
                            runner, execute=True)
    firing = alert("SloscopeGpuSaturated", node="gpu-node-3")
    assert engine.handle([firing])[0]["decision"] == "executed"
    assert engine.handle([firing])[0]["decision"] == "duplicate"  # Alertmanager re-sent the group
    resolved = alert("SloscopeGpuSaturated", status="resolved", node="gpu-node-3")
    assert engine.handle([resolved])[0]["decision"] == "executed"
    assert engine.handle([resolved])[0]["decision"] == "duplicate"
    assert runner.calls == [
        (["nft", "delete", "element", "inet", "lb", "backends", "{", "10.0.0.3", "}"], "lbns"),
        (["nft", "add", "element", "inet", "lb", "backends", "{", "10.0.0.3", "}"], "lbns")]
    # a resolved alert that opened nothing does nothing
    other = alert("SloscopeGpuSaturated", status="resolved", fp="ffff", node="gpu-node-1")
    assert engine.handle([other])[0]["decision"] == "ignored" and len(runner.calls) == 2


def test_dry_run_per_action_even_when_execution_is_on(tmp_path):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"SloscopeGpuSaturated": {"action": "nft_drain_backend", "dry_run": True,
                                                                "params": DRAIN_PARAMS}}, runner, execute=True)
    assert engine.handle([alert("SloscopeGpuSaturated", node="gpu-node-3")])[0]["decision"] == "dry_run"
    assert runner.calls == []


INJECTIONS = [
    {"node": "a; rm -rf /"},
    {"node": "gpu-node-3\nrm -rf /"},
    {"node": "gpu-node-3 }"},
    {"node": "{ 10.0.0.3 }"},
    {"node": "-rf"},
    {"node": "gpu-node-３"},  # fullwidth digit
    {"node": "GPU-NODE-3"},
    {"node": "a" * 300},
    {"node": ""},
    {},  # no node label at all
]
ADDRESS_INJECTIONS = ["10.0.0.3 } ; flush ruleset", "10.0.0.3\n", "fe80::1%eth0; reboot", "10.0.0.256", "０.0.0.1",
                      "$(reboot)", "10.0.0.3,10.0.0.4"]


@pytest.mark.parametrize("labels", INJECTIONS, ids=[repr(i)[:30] for i in INJECTIONS])
def test_injection_in_the_node_label_is_refused_and_audited(tmp_path, labels):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"SloscopeGpuSaturated": {"action": "nft_drain_backend",
                                                                "params": DRAIN_PARAMS}}, runner, execute=True)
    [result] = engine.handle([alert("SloscopeGpuSaturated", **labels)])
    assert result["decision"] == "refused", result
    assert "not valid" in result["reason"] or "no 'node' label" in result["reason"]
    assert runner.calls == []
    [row] = audit_rows(tmp_path)
    assert row["decision"] == "refused" and row["target"] is None
    assert json.loads(row["params"])["labels"] == {"alertname": "SloscopeGpuSaturated", **labels}


@pytest.mark.parametrize("address", ADDRESS_INJECTIONS)
def test_injection_in_an_address_label_is_refused(tmp_path, address):
    runner = FakeRunner()
    params = {"table": "lb", "set": "backends", "address_label": "address"}
    engine, _ = make_engine(tmp_path, {"X": {"action": "nft_drain_backend", "params": params}}, runner, execute=True)
    [result] = engine.handle([alert("X", node="gpu-node-3", address=address)])
    assert result["decision"] == "refused" and "address" in result["reason"] and runner.calls == []
    [ok] = engine.handle([alert("X", fp="beef", node="gpu-node-3", address="2001:DB8::0:1")])
    assert ok["decision"] == "executed"
    assert runner.calls[0][0][-2] == "2001:db8::1"  # canonical form


@pytest.mark.parametrize("bdev", ["Nvme0n1; rm -rf /", "../../etc/passwd", "Nvme0n1\n", "x" * 65, "Nvme0n1 }"])
def test_injection_in_a_bdev_label_is_refused(tmp_path, bdev):
    calls = []
    engine, _ = make_engine(tmp_path, {"SloscopeNvmeHot": {"action": "spdk_qos_limit", "params": {
        "socket": "/nonexistent", "rw_ios_per_sec": 1000}}}, execute=True)
    engine.spdk = lambda path: calls.append(path)
    [result] = engine.handle([alert("SloscopeNvmeHot", node="gpu-node-1", bdev=bdev)])
    assert result["decision"] == "refused" and "bdev name" in result["reason"] and calls == []


def test_unknown_tier_and_unlisted_alerts_are_refused(tmp_path):
    engine, _ = make_engine(tmp_path, {"SloscopeTierLatencyHigh": {"action": "raise_sampling"}}, execute=True)
    [r1] = engine.handle([alert("SloscopeTierLatencyHigh", tier="platinum")])
    assert r1["decision"] == "refused" and "not a tier" in r1["reason"]
    [r2] = engine.handle([alert("SomethingElse", fp="01", node="gpu-node-1")])
    assert r2["decision"] == "refused" and "not in the allow-list" in r2["reason"]
    assert [r["decision"] for r in audit_rows(tmp_path)] == ["refused", "refused"]


def test_cooldown_per_target(tmp_path):
    runner = FakeRunner()
    engine, clock = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS},
                                           "B": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}},
                                runner, execute=True, cooldown="10m")
    assert engine.handle([alert("A", fp="01", node="gpu-node-3")])[0]["decision"] == "executed"
    clock.t += timedelta(minutes=5)
    [again] = engine.handle([alert("B", fp="02", node="gpu-node-3")])
    assert again["decision"] == "refused" and again["reason"].startswith("cooldown") and "300 s" in again["reason"]
    # another target is not cooling down
    assert engine.handle([alert("B", fp="03", node="gpu-node-1")])[0]["decision"] == "executed"
    clock.t += timedelta(minutes=6)
    assert engine.handle([alert("B", fp="04", node="gpu-node-3")])[0]["decision"] == "executed"
    assert len(runner.calls) == 3


def test_global_budget_per_hour_counts_dry_runs(tmp_path):
    nodes = {f"gpu-node-{i}": f"10.0.0.{i}" for i in range(1, 6)}
    engine, clock = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": {
        "table": "lb", "set": "backends", "addresses": nodes}}}, max_actions_per_hour=2, cooldown="1s")
    decisions = [engine.handle([alert("A", fp=f"0{i}", node=f"gpu-node-{i}")])[0] for i in range(1, 4)]
    assert [d["decision"] for d in decisions] == ["dry_run", "dry_run", "refused"]
    assert decisions[2]["reason"].startswith("budget: 2 actions in the last hour")
    clock.t += timedelta(minutes=61)
    assert engine.handle([alert("A", fp="04", node="gpu-node-4")])[0]["decision"] == "dry_run"


def test_notify_only_is_recorded_and_takes_no_budget(tmp_path):
    engine, _ = make_engine(tmp_path, {"N": {"action": "notify_only"}}, execute=True, max_actions_per_hour=0)
    assert engine.handle([alert("N", node="a; rm -rf /")])[0]["decision"] == "executed"
    assert audit_rows(tmp_path)[0]["reason"] == "notified only"


def test_one_action_per_target_at_a_time(tmp_path):
    gate = threading.Event()
    runner = FakeRunner(gate=gate, gate_if="10.0.0.3")  # the action on gpu-node-3 waits for the gate
    engine, _ = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}},
                            runner, execute=True, cooldown="1s")
    results = {}
    first = threading.Thread(target=lambda: results.update(first=engine.handle([alert("A", fp="01",
                                                                                      node="gpu-node-3")])[0]))
    first.start()
    assert runner.started.wait(5)
    [second] = engine.handle([alert("A", fp="02", node="gpu-node-3")])  # while the first still runs
    assert second["decision"] == "refused" and "in progress" in second["reason"]
    [other] = engine.handle([alert("A", fp="03", node="gpu-node-1")])  # another target is free meanwhile
    gate.set()
    first.join(10)
    assert results["first"]["decision"] == "executed" and other["decision"] == "executed"


def test_a_failing_action_is_audited_with_its_reason_and_opens_nothing(tmp_path):
    runner = FakeRunner(fail="nft exited with status 1: Error: Could not process rule: No such file or directory")
    engine, _ = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}},
                            runner, execute=True)
    [r] = engine.handle([alert("A", node="gpu-node-3")])
    assert r["decision"] == "failed" and "No such file" in r["reason"]
    assert engine.handle([alert("A", status="resolved", node="gpu-node-3")])[0]["decision"] == "ignored"


def test_a_command_whose_output_is_not_utf8_is_audited_as_run(tmp_path):
    """A real run: the command has taken effect by the time its output is read, however that output is encoded."""
    fake_nft = tmp_path / "bin" / "nft"
    fake_nft.parent.mkdir()
    fake_nft.write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\nprintf '\\377\\376 done'\n")
    fake_nft.chmod(0o755)

    class OnPath(Runner):
        def run(self, argv, netns=None):
            return super().run([str(fake_nft), *argv[1:]], netns)

    engine, _ = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}}, OnPath(),
                            execute=True)
    [fired] = engine.handle([alert("A", node="gpu-node-3")])
    assert fired["decision"] == "executed" and "done" in fired["reason"]
    [undone] = engine.handle([alert("A", status="resolved", node="gpu-node-3")])
    assert undone["decision"] == "executed"
    assert (tmp_path / "bin" / "calls").read_text().split("\n")[:2] == [
        "delete element inet lb backends { 10.0.0.3 }", "add element inet lb backends { 10.0.0.3 }"]
    assert [r["decision"] for r in audit_rows(tmp_path)] == ["executed", "executed"]


def test_an_unexpected_error_while_acting_is_audited_and_its_undo_kept_open(tmp_path):
    class Broken(FakeRunner):
        def run(self, argv, netns=None):
            self.calls.append((list(argv), netns))
            if argv[1] == "delete":
                raise LookupError("the runner broke after the command ran")
            return ""

    runner = Broken()
    engine, _ = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}}, runner,
                            execute=True)
    [fired] = engine.handle([alert("A", node="gpu-node-3")])
    assert fired["decision"] == "failed" and "unexpected LookupError" in fired["reason"]
    [undone] = engine.handle([alert("A", status="resolved", node="gpu-node-3")])
    assert undone["decision"] == "executed" and runner.calls[-1][0][1] == "add"
    assert [r["decision"] for r in audit_rows(tmp_path)] == ["failed", "executed"]


def test_raise_sampling_records_an_override_until_resolved(tmp_path):
    engine, clock = make_engine(tmp_path, {"SloscopeTierLatencyHigh": {"action": "raise_sampling",
                                                                       "params": {"duration": "30m"}}}, execute=True)
    [r] = engine.handle([alert("SloscopeTierLatencyHigh", tier="p99-latency-critical")])
    assert r["decision"] == "executed" and r["target"] == "tier:p99-latency-critical"
    con = duckdb.connect(str(tmp_path / "audit.duckdb"))
    try:
        assert active_sampling_overrides(Reader(con), START) == {"p99-latency-critical": 1.0}
        assert active_sampling_overrides(Reader(con), START + timedelta(minutes=31)) == {}
        until = con.execute("SELECT until FROM sampling_overrides").fetchone()[0]
        assert until == START + timedelta(minutes=30)
    finally:
        con.close()
    clock.t += timedelta(minutes=2)
    engine.handle([alert("SloscopeTierLatencyHigh", status="resolved", tier="p99-latency-critical")])
    con = duckdb.connect(str(tmp_path / "audit.duckdb"))
    try:
        assert active_sampling_overrides(Reader(con), clock.t) == {}
    finally:
        con.close()


def test_restart_workload_commands_are_argument_lists(tmp_path):
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {
        "K": {"action": "restart_workload", "params": {"runtime": "kubectl", "namespace": "inference",
                                                        "selector": "app=vllm,tier=gpu"}},
        "D": {"action": "restart_workload", "params": {"runtime": "docker", "container": "vllm", "node": "gpu-node-1"}},
    }, runner, execute=True)
    assert engine.handle([alert("K", fp="01", node="gpu-node-3")])[0]["decision"] == "executed"
    assert engine.handle([alert("D", fp="02", node="gpu-node-1")])[0]["decision"] == "executed"
    [elsewhere] = engine.handle([alert("D", fp="03", node="gpu-node-2")])
    assert elsewhere["decision"] == "refused" and "acts on node gpu-node-1 only" in elsewhere["reason"]
    assert [c[0] for c in runner.calls] == [
        ["kubectl", "delete", "pod", "--namespace", "inference", "--selector", "app=vllm,tier=gpu",
         "--field-selector", "spec.nodeName=gpu-node-3", "--wait=false"],
        ["docker", "restart", "--", "vllm"]]


@pytest.mark.parametrize("ps_output, decision", [("0123456789abcdef\n", "executed"),
                                                 ("0123456789abcdef\n--force\n", "failed"),
                                                 ("", "failed")])
def test_crictl_restart_checks_what_crictl_ps_returns(tmp_path, ps_output, decision):
    runner = FakeRunner(output=ps_output)
    engine, _ = make_engine(tmp_path, {"C": {"action": "restart_workload", "params": {
        "runtime": "crictl", "container": "vllm", "node": "gpu-node-1"}}}, runner, execute=True)
    [r] = engine.handle([alert("C", node="gpu-node-1")])
    assert r["decision"] == decision, r
    expected = [["crictl", "ps", "--quiet", "--name", "^vllm$"]]
    if decision == "executed":
        expected.append(["crictl", "stop", "0123456789abcdef"])
    assert [c[0] for c in runner.calls] == expected


# --- SPDK over its JSON-RPC socket (tests/fakes/spdk_target.py answers as spdk_tgt does) -------------------------------

def test_spdk_qos_limit_over_json_rpc_and_restore_on_resolve(tmp_path):
    from tests.fakes.spdk_target import FakeSpdkTarget

    sock = str(tmp_path / "spdk.sock")
    with FakeSpdkTarget(sock) as target:
        engine, _ = make_engine(tmp_path, {"SloscopeNvmeHot": {"action": "spdk_qos_limit", "params": {
            "sockets": {"gpu-node-1": sock}, "rw_ios_per_sec": 20000, "w_mbytes_per_sec": 100}}},
            execute=True, cooldown="1s")
        [r] = engine.handle([alert("SloscopeNvmeHot", node="gpu-node-1", bdev="Nvme0n1")])
        assert r["decision"] == "executed" and r["target"] == "bdev:gpu-node-1/Nvme0n1"
        assert target.bdevs["Nvme0n1"].qos == {"rw_ios_per_sec": 20000, "w_mbytes_per_sec": 100}
        engine.handle([alert("SloscopeNvmeHot", status="resolved", node="gpu-node-1", bdev="Nvme0n1")])
        assert target.bdevs["Nvme0n1"].qos == {"rw_ios_per_sec": 0, "w_mbytes_per_sec": 0}  # unlimited again
        assert [q["method"] for q in target.requests] == ["bdev_set_qos_limit"] * 2
        [missing] = engine.handle([alert("SloscopeNvmeHot", fp="02", node="gpu-node-1", bdev="Missing")])
        assert missing["decision"] == "failed" and "No such device" in missing["reason"]
        [no_socket] = engine.handle([alert("SloscopeNvmeHot", fp="03", node="gpu-node-2", bdev="Nvme0n1")])
        assert no_socket["decision"] == "refused" and "no SPDK socket" in no_socket["reason"]
    [down] = engine.handle([alert("SloscopeNvmeHot", fp="04", node="gpu-node-1", bdev="Malloc0")])
    assert down["decision"] == "failed" and "spdk" in down["reason"].lower()  # the target is gone


# --- config ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("actions: {A: {action: rm_rf}}", "expected one of"),
    ("actions: {A: {action: nft_drain_backend, params: {table: 'lb; flush', set: s, addresses: {}}}}", "nft table"),
    ("actions: {A: {action: nft_drain_backend, params: {table: lb, set: s}}}", "addresses"),
    ("actions: {A: {action: nft_drain_backend, params: {table: lb, set: s, addresses: {n1: '1.2.3.4; x'}}}}",
     "address"),
    ("actions: {A: {action: restart_workload, params: {runtime: kubectl, namespace: ns, selector: 'a=b;c'}}}",
     "selector"),
    ("actions: {A: {action: restart_workload, params: {runtime: sh}}}", "runtime"),
    ("actions: {A: {action: spdk_qos_limit, params: {socket: /s}}}", "at least one"),
    ("actions: {A: {action: raise_sampling, params: {ratio: 2}}}", "ratio"),
    ("actions: {A: {action: notify_only, params: {x: 1}}}", "unknown parameter"),
    ("execute: yes please", "execute"),
    ("budget: 3", "unknown key"),
])
def test_bad_configs_are_refused_with_the_reason(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(text, "r.yaml")


def test_the_example_config_loads_and_is_dry_run():
    cfg = load_config(Path(__file__).parents[2] / "alerts" / "remediation.example.yaml")
    assert cfg.execute is False and cfg.actions["SloscopeGpuSaturated"].action == "nft_drain_backend"
    from sloscope.alerts.rules import alert_names
    from tests.alerts.test_rules import TOKEN_SPEC

    assert set(cfg.actions) <= set(alert_names(parse_spec(TOKEN_SPEC)))


# --- real nftables in a network namespace ------------------------------------------------------------------------------

def _run(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=True).stdout


@pytest.mark.privileged
def test_nft_drain_backend_on_real_nftables_in_a_network_namespace(tmp_path):
    need(os.geteuid() == 0, "network namespaces and nftables need root")
    need(shutil.which("nft") is not None and shutil.which("ip") is not None, "nft and ip (nftables, iproute2)")
    ns = f"sloscope-test-{os.getpid()}"
    try:
        _run("ip", "netns", "add", ns)
        nft = ["ip", "netns", "exec", ns, "nft"]
        _run(*nft, "add table inet lb")
        _run(*nft, "add set inet lb backends { type ipv4_addr; }")
        _run(*nft, "add element inet lb backends { 10.0.0.1, 10.0.0.2, 10.0.0.3 }")
        _run(*nft, "add map inet lb weights { type ipv4_addr : mark; }")
        _run(*nft, "add element inet lb weights { 10.0.0.1 : 10, 10.0.0.3 : 10 }")
        actions = {
            "SloscopeGpuSaturated": {"action": "nft_drain_backend", "params": {**DRAIN_PARAMS, "netns": ns}},
            "SloscopeNodeErrorRatioHigh": {"action": "nft_drain_backend", "params": {
                "table": "lb", "map": "weights", "weight": 0, "restore_weight": 10, "netns": ns,
                "addresses": DRAIN_PARAMS["addresses"]}},
        }
        engine, clock = make_engine(tmp_path, actions, Runner(timeout_s=20), execute=True, cooldown="1s")

        def elements(name):
            return json.loads(_run(*nft, "-j", "list", "set" if name == "backends" else "map", "inet", "lb", name))

        def set_members():
            return {e for item in elements("backends")["nftables"] if "set" in item
                    for e in item["set"].get("elem", [])}

        def weights():
            return {e[0]: e[1] for item in elements("weights")["nftables"] if "map" in item
                    for e in item["map"].get("elem", [])}

        [r] = engine.handle([alert("SloscopeGpuSaturated", node="gpu-node-3")])
        assert r["decision"] == "executed", r
        assert set_members() == {"10.0.0.1", "10.0.0.2"}
        # an injection attempt on the real path changes nothing
        [bad] = engine.handle([alert("SloscopeGpuSaturated", fp="0bad", node="gpu-node-1 } ; flush ruleset ; {")])
        assert bad["decision"] == "refused" and set_members() == {"10.0.0.1", "10.0.0.2"}
        engine.handle([alert("SloscopeGpuSaturated", status="resolved", node="gpu-node-3")])
        assert set_members() == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}

        clock.t += timedelta(minutes=1)
        [w] = engine.handle([alert("SloscopeNodeErrorRatioHigh", fp="0c", node="gpu-node-3")])
        assert w["decision"] == "executed", w
        assert weights() == {"10.0.0.1": 10, "10.0.0.3": 0}
        engine.handle([alert("SloscopeNodeErrorRatioHigh", status="resolved", fp="0c", node="gpu-node-3")])
        assert weights() == {"10.0.0.1": 10, "10.0.0.3": 10}
        assert "10.0.0.3" in _run(*nft, "list", "set", "inet", "lb", "backends")
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)


def test_a_firing_that_arrives_after_its_resolve_is_refused_and_audited(tmp_path):
    """Two Alertmanagers, or a retry overtaken: acting then would drain a node nothing will undo."""
    runner = FakeRunner()
    engine, _ = make_engine(tmp_path, {"A": {"action": "nft_drain_backend", "params": DRAIN_PARAMS}}, runner,
                            execute=True)
    assert engine.handle([alert("A", status="resolved", node="gpu-node-3")])[0]["decision"] == "ignored"
    [late] = engine.handle([alert("A", node="gpu-node-3")])
    assert late["decision"] == "refused" and "already resolved" in late["reason"] and runner.calls == []
    assert [r["decision"] for r in audit_rows(tmp_path)] == ["refused"]
