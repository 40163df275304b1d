"""SPDK: the JSON-RPC client (unframed streaming JSON, split and coalesced writes, errors, timeouts) and the
probe's deltas, restarts and NVMe temperatures, against a fake target on a Unix socket in a tmp dir."""

import json
import os
import shutil
import socket
import tempfile
import time

import pytest

from sloscope.probes.base import ProbeError, ProbeUnavailable
from sloscope.probes.cli import main
from sloscope.probes.registry import ProbeSet
from sloscope.probes.sample import Sample
from sloscope.probes.spdk.nvme_sysfs import read_nvme_temperatures
from sloscope.probes.spdk.rpc_client import (INVALID_STATE, JsonStreamDecoder, SpdkConnectionError, SpdkProtocolError,
                                             SpdkRpcClient, SpdkRpcError, SpdkTimeout)
from sloscope.probes.spdk.spdk import SpdkProbe, health_temperature
from sloscope import catalog
from tests.fakes.spdk_target import FakeSpdkTarget, TICK_RATE
from tests.probe_asserts import by, one


@pytest.fixture
def sockdir():
    path = tempfile.mkdtemp(prefix="spdk-", dir="/tmp")  # short: Unix socket paths are limited to 107 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def target(sockdir):
    fake = FakeSpdkTarget(os.path.join(sockdir, "spdk.sock")).start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def client(target):
    c = SpdkRpcClient(target.path, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


# -- streaming JSON without framing ---------------------------------------------------------------------------

def test_decoder_takes_values_split_anywhere_and_several_per_chunk():
    a = {"jsonrpc": "2.0", "id": 1, "result": {"s": 'brace } in "string" \\ and ünïcode', "n": [1, {"x": 2}]}}
    b = {"jsonrpc": "2.0", "id": 2, "result": True}
    wire = (json.dumps(a, indent=2, ensure_ascii=False) + json.dumps(b)).encode()
    d = JsonStreamDecoder()
    got = []
    for i in range(len(wire)):  # one byte at a time, splitting multi-byte characters too
        got.extend(d.feed(wire[i:i + 1]))
    assert got == [a, b] and d.pending == ""
    assert JsonStreamDecoder().feed(wire) == [a, b]  # both in one chunk


def test_decoder_reports_malformed_json_at_once():
    with pytest.raises(SpdkProtocolError, match="malformed JSON"):
        JsonStreamDecoder().feed(b'{"tick_rate": tru}')
    with pytest.raises(SpdkProtocolError, match="expected an object"):
        JsonStreamDecoder().feed(b"Method not found\n")
    d = JsonStreamDecoder()
    assert d.feed(b'{"a": "unterminated }') == []  # incomplete, not malformed: wait for more
    assert d.feed(b'"}') == [{"a": "unterminated }"}]


# -- the client against the fake target -----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["whole", "split", "coalesce"])
def test_pipelined_calls_in_every_write_mode(target, client, mode):
    target.write_mode = mode
    iostat, reactors, health = client.call_many([("bdev_get_iostat", None), ("framework_get_reactors", None),
                                                 ("bdev_nvme_get_controller_health_info", {"name": "Nvme0"})])
    assert iostat["tick_rate"] == TICK_RATE and {b["name"] for b in iostat["bdevs"]} == {"Nvme0n1", "Malloc0"}
    assert [r["lcore"] for r in reactors["reactors"]] == [0, 1]
    assert health["temperature_celsius"] == 38
    sent = {r["method"]: r for r in target.requests}
    assert "params" not in sent["framework_get_reactors"]  # SPDK rejects any params for it
    assert "params" not in sent["bdev_get_iostat"]  # nothing version-specific
    assert target.connections == 1


def test_jsonrpc_errors_are_clear(target, client):
    target.errors["bdev_get_iostat"] = (-32603, "spdk_json_decode_object failed")
    with pytest.raises(SpdkRpcError) as err:
        client.bdev_get_iostat()
    assert (err.value.code, err.value.message) == (-32603, "spdk_json_decode_object failed")
    assert str(err.value) == "SPDK bdev_get_iostat: error -32603: spdk_json_decode_object failed"
    with pytest.raises(SpdkRpcError) as err:
        client.call("no_such_method")
    assert err.value.code == -32601
    assert client.framework_get_reactors()["tick_rate"] == TICK_RATE  # the connection is still in step
    with pytest.raises(SpdkRpcError, match="requires no arguments"):
        client.call("framework_get_reactors", {})


def test_a_silent_target_times_out_and_the_next_call_reconnects(target):
    target.silent = {"bdev_get_iostat"}
    c = SpdkRpcClient(target.path, timeout=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(SpdkTimeout, match="bdev_get_iostat: no response within 0.3 s"):
            c.bdev_get_iostat()
        assert time.monotonic() - t0 < 10.0  # the timeout is honoured (generous bound for a loaded machine)
        target.silent = set()
        assert c.bdev_get_iostat()["bdevs"]
        assert target.connections == 2
    finally:
        c.close()


@pytest.mark.parametrize("raw, match", [
    (b'{"jsonrpc": "2.0", "id": {id}, "result": {"tick_rate": }}', "malformed JSON"),
    (b'[{"jsonrpc": "2.0", "id": {id}, "result": {}}]', "not an object"),
    (b'{"jsonrpc": "2.0", "id": 999, "result": {}}', "unexpected id"),
    (b'{"id": {id}, "result": {}}', "not a JSON-RPC 2.0 response"),
    (b'{"jsonrpc": "2.0", "id": {id}}', "exactly one of"),
])
def test_malformed_responses_are_protocol_errors(target, raw, match):
    target.raw["bdev_get_iostat"] = raw
    c = SpdkRpcClient(target.path, timeout=60.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(SpdkProtocolError, match=match):
            c.bdev_get_iostat()
        assert time.monotonic() - t0 < 30.0  # reported at once, not after the 60 s timeout
        del target.raw["bdev_get_iostat"]
        assert c.bdev_get_iostat()["bdevs"]  # a new connection, in step again
    finally:
        c.close()


def test_connection_closed_mid_response(target, client):
    target.raw["framework_get_reactors"] = b'{"jsonrpc": "2.0", "id": {id}, "result": {"tick_rate": 24'
    target.close_after_raw = True
    with pytest.raises(SpdkProtocolError, match="closed the connection in the middle of a response"):
        client.framework_get_reactors()


def test_a_restarted_target_is_reconnected_without_an_error(target, client):
    assert client.bdev_get_iostat()["bdevs"]
    target.stop()  # the kept connection is closed under the client
    target.start()
    assert client.bdev_get_iostat()["bdevs"]
    assert target.connections == 2


def test_bdev_set_qos_limit_sends_what_spdk_documents(target, client):
    assert client.bdev_set_qos_limit("Nvme0n1", rw_ios_per_sec=20000, w_mbytes_per_sec=50) is True
    request = target.requests[-1]
    assert request["method"] == "bdev_set_qos_limit"
    assert request["params"] == {"name": "Nvme0n1", "rw_ios_per_sec": 20000, "w_mbytes_per_sec": 50}
    assert target.bdevs["Nvme0n1"].qos == {"rw_ios_per_sec": 20000, "w_mbytes_per_sec": 50}
    assert client.bdev_set_qos_limit("Nvme0n1", rw_mbytes_per_sec=0) is True  # 0 = unlimited
    with pytest.raises(SpdkRpcError) as err:
        client.bdev_set_qos_limit("NoSuchBdev", rw_ios_per_sec=1000)
    assert err.value.code == -19
    for bad in ({}, {"rw_ios_per_sec": -1}, {"rw_mbytes_per_sec": 1.5}, {"r_mbytes_per_sec": True}):
        with pytest.raises(ValueError):
            client.bdev_set_qos_limit("Nvme0n1", **bad)


def test_connection_errors_name_the_problem(sockdir):
    missing = os.path.join(sockdir, "none.sock")
    with pytest.raises(SpdkConnectionError, match="not found"):
        SpdkRpcClient(missing).bdev_get_iostat()
    stale = os.path.join(sockdir, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()  # the file stays, nobody listens: what a crashed spdk_tgt leaves behind
    with pytest.raises(SpdkConnectionError, match="connection refused"):
        SpdkRpcClient(stale).bdev_get_iostat()
    assert "connection refused" in SpdkProbe(socket_path=stale).check().missing[0]
    regular = os.path.join(sockdir, "file")
    open(regular, "w").close()
    assert SpdkProbe(socket_path=regular).check().missing == (f"SPDK socket {regular}: not a Unix socket",)
    assert "not found (is spdk_tgt running?" in SpdkProbe(socket_path=missing).check().missing[0]


# -- the probe ------------------------------------------------------------------------------------------------

@pytest.fixture
def probe(target, sockdir):
    sysfs = os.path.join(sockdir, "sys")
    os.makedirs(sysfs)
    p = SpdkProbe(socket_path=target.path, timeout=2.0, sysfs=sysfs)
    try:
        yield p
    finally:
        p.stop()


def test_bdev_and_reactor_signals_from_deltas(target, client, probe):
    assert client.bdev_set_qd_sampling_period("Nvme0n1", 100) is True  # µs: io_time appears
    probe.start()
    nvme = target.bdevs["Nvme0n1"]
    with target.lock:
        nvme.io("read", 1000, 200e-6)
        nvme.io("write", 500, 1e-3)
        nvme.busy(polls_busy=4000, depth=8)  # 4000 periods of 100 µs busy at depth 8: 0.4 s
    target.advance(1.0)
    target.run_reactor(0, busy_s=0.75, idle_s=0.25)
    target.run_reactor(1, busy_s=0.10, idle_s=0.90)
    samples = probe.collect()
    for s in samples:
        sig = catalog.signal(s.name)
        assert isinstance(s, Sample) and s.kind == "gauge" and set(s.attributes) <= set(sig.attributes)
    bdev = {"spdk.bdev.name": "Nvme0n1"}
    assert one(samples, "spdk.bdev.io.wait", **bdev, **{"disk.io.direction": "read"}).value == pytest.approx(200e-6)
    assert one(samples, "spdk.bdev.io.wait", **bdev, **{"disk.io.direction": "write"}).value == pytest.approx(1e-3)
    assert one(samples, "spdk.bdev.queue_depth", **bdev).value == pytest.approx(8.0)
    assert one(samples, "spdk.bdev.utilization", **bdev).value == pytest.approx(0.4)
    assert one(samples, "spdk.reactor.busy", **{"spdk.reactor.lcore": 0}).value == pytest.approx(0.75)
    assert one(samples, "spdk.reactor.busy", **{"spdk.reactor.lcore": 1}).value == pytest.approx(0.10)
    # Malloc0 has no queue-depth sampling (no io_time in its answer) and did no I/O: nothing to say
    assert by(samples, "spdk.bdev.queue_depth", **{"spdk.bdev.name": "Malloc0"}) == []
    assert by(samples, "spdk.bdev.io.wait", **{"spdk.bdev.name": "Malloc0"}) == []
    temp = one(samples, "sloscope.nvme.temperature")
    assert temp.value == 38.0 and temp.attributes == {"spdk.bdev.name": "Nvme0"}

    target.advance(1.0)  # idle second: queue depth 0, utilization 0, no wait samples
    idle = probe.collect()
    assert one(idle, "spdk.bdev.queue_depth", **bdev).value == 0.0
    assert one(idle, "spdk.bdev.utilization", **bdev).value == 0.0
    assert by(idle, "spdk.bdev.io.wait") == []


@pytest.mark.parametrize("bigger_after_restart", [False, True])
def test_target_restart_gives_no_negative_or_huge_values(target, client, probe, bigger_after_restart):
    client.bdev_set_qd_sampling_period("Nvme0n1", 100)
    nvme = target.bdevs["Nvme0n1"]
    with target.lock:
        nvme.io("read", 50, 100e-6)
    target.run_reactor(0, 1.0, 1.0)
    probe.start()
    target.advance(0.5)
    target.restart()
    client.bdev_set_qd_sampling_period("Nvme0n1", 100)
    with target.lock:
        nvme.io("read", 5000 if bigger_after_restart else 5, 300e-6)  # more than before the restart, or less
        nvme.busy(1000, 2)
    target.run_reactor(0, 3.0 if bigger_after_restart else 0.1, 3.0 if bigger_after_restart else 0.1)
    target.advance(0.5)
    samples = probe.collect()
    assert probe.restarts == 1
    assert [s.name for s in samples] == ["sloscope.nvme.temperature"]  # no deltas across the restart
    with target.lock:
        nvme.io("read", 100, 250e-6)
    target.advance(1.0)
    after = probe.collect()
    assert one(after, "spdk.bdev.io.wait", **{"disk.io.direction": "read"}).value == pytest.approx(250e-6)
    assert all(0 <= s.value < 1e3 for s in after)


def test_one_bdev_reset_is_rebaselined_alone(target, probe):
    with target.lock:
        target.bdevs["Nvme0n1"].io("read", 100, 1e-4)
        target.bdevs["Malloc0"].io("read", 100, 1e-5)
    probe.start()
    with target.lock:
        target.bdevs["Nvme0n1"].reset()  # bdev_reset_iostat, or deleted and re-created
        target.bdevs["Malloc0"].io("read", 10, 2e-5)
    target.advance(1.0)
    samples = probe.collect()
    assert by(samples, "spdk.bdev.io.wait", **{"spdk.bdev.name": "Nvme0n1"}) == []
    assert one(samples, "spdk.bdev.io.wait", **{"spdk.bdev.name": "Malloc0"}).value == pytest.approx(2e-5)
    assert probe.resets["Nvme0n1"] == 1 and probe.restarts == 0


def test_old_target_without_ticks_uses_the_wall_clock(sockdir):
    with FakeSpdkTarget(os.path.join(sockdir, "old.sock"), old=True) as target:
        c = SpdkRpcClient(target.path)
        try:
            with pytest.raises(SpdkRpcError):  # why nothing version-specific is sent
                c.call("bdev_get_iostat", {"per_channel": False})
            c.bdev_set_qd_sampling_period("Nvme0n1", 1000)
        finally:
            c.close()
        probe = SpdkProbe(socket_path=target.path, sysfs=os.path.join(sockdir, "nosys"))
        with probe:
            time.sleep(0.2)
            with target.lock:
                target.bdevs["Nvme0n1"].busy(100, 1)  # 100 ms busy in >= 200 ms of wall time
            samples = probe.collect()
        util = one(samples, "spdk.bdev.utilization").value
        assert 0.0 < util <= 0.5


def test_malformed_iostat_entries_are_counted_and_the_rest_goes_on(target, probe):
    probe.start()
    good = target.bdevs["Malloc0"]
    with target.lock:
        good.io("write", 10, 1e-3)
        entry = good.iostat()
    bad = {"name": "Broken0", "num_read_ops": "many"}
    target.raw["bdev_get_iostat"] = json.dumps(
        {"jsonrpc": "2.0", "id": 0, "result": {"tick_rate": TICK_RATE, "ticks": target.ticks + TICK_RATE,
                                               "bdevs": [bad, entry]}}).replace('"id": 0', '"id": {id}').encode()
    samples = probe.collect()
    assert one(samples, "spdk.bdev.io.wait", **{"spdk.bdev.name": "Malloc0"}).value == pytest.approx(1e-3)
    assert probe.error_counts["malformed bdev entry"] == 1

    target.raw["bdev_get_iostat"] = b'{"jsonrpc": "2.0", "id": {id}, "result": [{"tick_rate": 1}]}'
    with pytest.raises(ProbeError, match="not an object"):
        probe.collect()
    del target.raw["bdev_get_iostat"]
    probe.collect()  # recovers
    assert probe.error_counts["malformed bdev_get_iostat"] == 1


def test_nvme_temperature_sources(target, probe, sockdir):
    target.controllers["Nvme1"] = {"traddr": "0000:5f:00.0", "kelvin": 0}  # no sensor: SPDK's value wraps
    target.controllers["Nvme2"] = {"traddr": "0000:60:00.0", "kelvin": 330, "no_health": True}
    probe.start()
    for _ in range(3):
        temps = by(probe.collect(), "sloscope.nvme.temperature")
    assert [(s.attributes, s.value) for s in temps] == [({"spdk.bdev.name": "Nvme0"}, 38.0)]
    assert probe.error_counts["implausible NVMe temperature"] == 3
    asked = [r["params"]["name"] for r in target.requests if r["method"] == "bdev_nvme_get_controller_health_info"]
    assert asked.count("Nvme2") == 1  # no health page: noted once, not asked again
    assert sum("Nvme2" in n for n in probe.notes) == 1

    # a target without the bdev_nvme module: kernel-attached drives from sysfs instead
    sysfs = probe.sysfs
    for ctrl, rel, milli in (("nvme0", "hwmon2", "45850"), ("nvme1", "device/hwmon/hwmon5", "39000")):
        os.makedirs(os.path.join(sysfs, "class", "nvme", ctrl, rel))
        with open(os.path.join(sysfs, "class", "nvme", ctrl, rel, "temp1_input"), "w") as f:
            f.write(milli + "\n")
    assert read_nvme_temperatures(sysfs) == {"nvme0": 45.85, "nvme1": 39.0}
    target.nvme_module = False
    temps = by(probe.collect(), "sloscope.nvme.temperature")
    assert {s.attributes["system.device"]: s.value for s in temps} == {"nvme0": 45.85, "nvme1": 39.0}
    assert any("sysfs" in n for n in probe.notes)


def test_health_temperature_shapes():
    assert health_temperature({"temperature_celsius": 41}) == 41.0
    assert health_temperature({"temperature_celsius": 2**64 - 273}) is None  # wrapped: sensor reported 0 K
    assert health_temperature({"temperature": 313.15}) == pytest.approx(40.0)  # raw Kelvin
    assert health_temperature({"temperature_celsius": "hot"}) is None and health_temperature([]) is None


def test_target_going_away_is_a_probe_error_and_it_comes_back(target, probe):
    probe.start()
    target.stop()
    with pytest.raises(ProbeError, match="spdk:"):
        probe.collect()
    assert sum(probe.error_counts.values()) == 1
    target.start()
    target.advance(1.0)
    probe.collect()  # reconnects


# -- registry and CLI -----------------------------------------------------------------------------------------

def test_spdk_falls_back_to_nvme_sysfs(sockdir):
    sysfs = os.path.join(sockdir, "sys")
    os.makedirs(os.path.join(sysfs, "class", "nvme", "nvme0", "hwmon1"))
    with open(os.path.join(sysfs, "class", "nvme", "nvme0", "hwmon1", "temp1_input"), "w") as f:
        f.write("51000\n")
    options = {"spdk": {"socket_path": os.path.join(sockdir, "absent.sock")}, "nvme": {"sysfs": sysfs}}
    with ProbeSet(["spdk"], options=options) as probes:
        (decision,) = probes.decisions
        assert decision.running == ("nvme",) and "not found" in decision.missing[0]
        assert "sloscope.nvme.temperature" not in decision.lost_signals
        (temp,) = probes.collect()
    assert (temp.attributes, temp.value) == ({"system.device": "nvme0"}, 51.0)


def test_cli_spdk_socket_option(target, capsys):
    target.run_reactor(0, 0.5, 0.5)
    assert main(["probe", "spdk", "--spdk-socket", target.path, "--duration", "0.4", "--interval", "0.2",
                 "--format", "json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records[0]["record"] == "status" and records[0]["running"] == ["spdk"]
    temps = [r for r in records if r["record"] == "sample" and r["name"] == "sloscope.nvme.temperature"]
    assert len(temps) == 2 and temps[0]["unit"] == "Cel" and temps[0]["value"] == 38.0


def test_probe_unavailable_when_the_target_errors(target):
    target.errors["bdev_get_iostat"] = (INVALID_STATE, "Method may only be called after framework is initialized "
                                                       "using framework_start_init RPC.")
    probe = SpdkProbe(socket_path=target.path)
    assert "framework is initialized" in probe.check().missing[0]
    with pytest.raises(ProbeUnavailable, match="framework is initialized"):
        probe.start()


# -- a stock target: queue-depth sampling off, bdev_get_iostat's parameters by release ------------------------

def test_a_stock_target_has_sampling_off_and_the_probe_says_what_is_missing(target, sockdir):
    assert all(b.qd_period_us == 0 for b in target.bdevs.values())  # as spdk_tgt starts
    options = {"spdk": {"socket_path": target.path, "sysfs": os.path.join(sockdir, "nosys")}}
    with ProbeSet(["spdk"], options=options) as probes:
        target.advance(1.0)
        samples = probes.collect()
        spdk = probes.probes["spdk"]
        assert by(samples, "spdk.bdev.queue_depth") == [] and by(samples, "spdk.bdev.utilization") == []
        assert any("queue-depth sampling is off on bdev Malloc0, Nvme0n1" in n for n in spdk.notes)
        health = {s.attributes["sloscope.signal.name"]: (s.value, s.attributes.get("probe.needs"))
                  for s in probes.health(1) if s.name == "sloscope.probe.signal.health"}
    assert health["spdk.bdev.queue_depth"] == health["spdk.bdev.utilization"] == (0.0, "bdev_set_qd_sampling_period")
    assert health["spdk.bdev.io.wait"] == (1.0, None)
    assert not [r for r in target.requests if r["method"] == "bdev_set_qd_sampling_period"]  # nothing changed


def test_the_probe_turns_sampling_on_and_again_after_a_restart(target, sockdir):
    probe = SpdkProbe(socket_path=target.path, sysfs=os.path.join(sockdir, "nosys"), qd_sampling_period_us=10_000)
    with probe:
        assert {n: b.qd_period_us for n, b in target.bdevs.items()} == {"Nvme0n1": 10_000, "Malloc0": 10_000}
        nvme = target.bdevs["Nvme0n1"]
        with target.lock:
            nvme.busy(polls_busy=50, depth=4)  # 0.5 s busy at depth 4
        target.advance(1.0)
        first = probe.collect()
        assert one(first, "spdk.bdev.queue_depth", **{"spdk.bdev.name": "Nvme0n1"}).value == pytest.approx(4.0)
        assert one(first, "spdk.bdev.utilization", **{"spdk.bdev.name": "Nvme0n1"}).value == pytest.approx(0.5)
        assert probe.missing_signals() == {}

        target.restart()  # sampling off again, as after every spdk_tgt restart
        target.advance(1.0)
        probe.collect()
        assert probe.restarts == 1 and nvme.qd_period_us == 10_000
        assert probe.qd_sampling_enabled == {"Nvme0n1": 2, "Malloc0": 2}
        target.advance(1.0)
        probe.collect()  # the first answer with sampling on again is the new baseline
        with target.lock:
            nvme.busy(polls_busy=25, depth=2)
        target.advance(1.0)
        again = probe.collect()
        assert one(again, "spdk.bdev.queue_depth", **{"spdk.bdev.name": "Nvme0n1"}).value == pytest.approx(2.0)


def test_a_period_someone_else_set_is_left_alone(target, client, sockdir):
    client.bdev_set_qd_sampling_period("Nvme0n1", 500)
    with SpdkProbe(socket_path=target.path, sysfs=os.path.join(sockdir, "nosys"), qd_sampling_period_us=10_000):
        pass
    assert (target.bdevs["Nvme0n1"].qd_period_us, target.bdevs["Malloc0"].qd_period_us) == (500, 10_000)


@pytest.mark.parametrize("version, takes_names", [("26.05", True), ("26.01", True), ("25.09", False)])
def test_the_client_speaks_the_iostat_parameters_the_target_takes(sockdir, version, takes_names):
    with FakeSpdkTarget(os.path.join(sockdir, "v.sock"), version=version) as target:
        with SpdkRpcClient(target.path) as c:
            answer = c.bdev_get_iostat(["Nvme0n1", "Malloc0"])
            assert [b["name"] for b in answer["bdevs"]] == ["Nvme0n1", "Malloc0"]
            assert c.iostat_takes_names is takes_names
            c.bdev_get_iostat(["Malloc0"])  # the form the target took is kept: no second refusal
            sent = [r["params"] for r in target.requests if r["method"] == "bdev_get_iostat"]
            both = {"names": ["Nvme0n1", "Malloc0"]}
            if takes_names:
                assert sent == [both, {"names": ["Malloc0"]}]
            else:
                assert sent == [both, {"name": "Nvme0n1"}, {"name": "Malloc0"}, {"name": "Malloc0"}]
            with pytest.raises(SpdkRpcError) as err:
                c.bdev_get_iostat(["Nvme9n1"])
            assert (err.value.code, err.value.message) == (-19, "No such device")


def test_a_new_target_refuses_the_old_name_parameter_with_spdks_code(sockdir):
    with FakeSpdkTarget(os.path.join(sockdir, "new.sock"), version="26.05") as target, \
            SpdkRpcClient(target.path) as c:
        with pytest.raises(SpdkRpcError) as err:
            c.call("bdev_get_iostat", {"name": "Nvme0n1"})
        assert (err.value.code, err.value.message) == (-32603, "spdk_json_decode_object failed")
        with pytest.raises(SpdkRpcError) as err:
            c.bdev_set_qd_sampling_period("Nvme9n1", 1000)
        assert (err.value.code, err.value.message) == (-19, "No such device")


def test_cli_turns_sampling_on(target, capsys):
    assert main(["probe", "spdk", "--spdk-socket", target.path, "--spdk-qd-sampling-us", "2000",
                 "--duration", "0.2", "--interval", "0.1", "--format", "json"]) == 0
    assert target.bdevs["Nvme0n1"].qd_period_us == 2000
