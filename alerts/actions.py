"""Remediation actions, and the validation every alert label passes before an action may use it.

Labels come from Alertmanager, which got them from Prometheus, which got them from whatever the exporter saw
in spans and samples: they are untrusted. Every label an action uses as a parameter is validated against a
strict pattern (`Refused` otherwise) before anything is built from it, and commands are argument lists run
without a shell, so a label can never become a command, an option or nftables syntax.

An action turns (alert labels, configured parameters) into a `Plan`: the target it acts on (the key for
cooldown and locking), the details recorded in the audit, a callable that executes it, and the data needed
to undo it when the alert resolves.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from sloscope.durations import parse_duration
from sloscope.errors import ConfigError
from sloscope.times import rfc3339

from sloscope.probes.spdk.rpc_client import SpdkError

DRAIN = "nft_drain_backend"
QOS = "spdk_qos_limit"
RESTART = "restart_workload"
RAISE_SAMPLING = "raise_sampling"
NOTIFY = "notify_only"
ACTIONS = (DRAIN, QOS, RESTART, RAISE_SAMPLING, NOTIFY)


class Refused(Exception):
    """The action may not run for this alert; the message says why (recorded in the audit)."""


class ActionFailed(Exception):
    """The action ran and did not succeed; the message says why."""


# --- validation of untrusted values ----------------------------------------------------------------------------------

_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
NODE_NAME = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*", re.ASCII)  # RFC 1123 subdomain
DNS_LABEL = re.compile(_DNS_LABEL, re.ASCII)  # RFC 1123 label (namespaces)
BDEV_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
NFT_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}", re.ASCII)
NETNS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}", re.ASCII)
_SELECTOR_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_SELECTOR_VALUE = r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?"
LABEL_SELECTOR = re.compile(rf"{_SELECTOR_KEY}={_SELECTOR_VALUE}(?:,{_SELECTOR_KEY}={_SELECTOR_VALUE})*", re.ASCII)
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,63}", re.ASCII)


def shown(value) -> str:
    """An untrusted value as a reason or a log line may quote it: its repr (control characters escaped, quoted),
    at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _match(pattern: re.Pattern, value, what: str, max_len: int | None = None) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or (max_len and len(value) > max_len):
        raise Refused(f"{what} {shown(value)} is not valid")
    return value


def valid_node(value) -> str:
    """An RFC 1123 subdomain (Kubernetes node names): lower-case letters, digits, '-' and '.', <= 253."""
    return _match(NODE_NAME, value, "node name", 253)


def valid_namespace(value) -> str:
    return _match(DNS_LABEL, value, "namespace", 63)


def valid_bdev(value) -> str:
    return _match(BDEV_NAME, value, "bdev name")


def valid_container(value) -> str:
    return _match(CONTAINER_NAME, value, "container name")


def valid_tier(value, tiers) -> str:
    if not isinstance(value, str) or value not in tiers:
        raise Refused(f"tier {shown(value)} is not a tier of the SLO spec")
    return value


def valid_ip(value) -> str:
    """An IPv4 or IPv6 address without zone index, in canonical form."""
    if not isinstance(value, str) or not value or len(value) > 45 or "%" in value or not value.isascii():
        raise Refused(f"address {shown(value)} is not valid")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise Refused(f"address {shown(value)} is not valid") from None


def label(labels: dict, name: str) -> str:
    if name not in labels:
        raise Refused(f"the alert has no {name!r} label")
    return labels[name]


# --- running commands ----------------------------------------------------------------------------------------------

class Runner:
    """Runs commands as argument lists (never through a shell), optionally inside a network namespace
    (`ip netns exec NAME ...`), with a timeout; a non-zero exit is ActionFailed with stderr's first lines."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s

    def run(self, argv: list[str], netns: str | None = None) -> str:
        if netns is not None:
            argv = ["ip", "netns", "exec", _match(NETNS_NAME, netns, "network namespace"), *argv]
        if not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise ActionFailed(f"refusing to run a malformed argument list {shown(argv)}")
        try:
            # Output that is not UTF-8 is read with replacement characters: the command has run by then, and an
            # error here would leave its effect unaudited.
            done = subprocess.run(argv, shell=False, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  errors="replace", timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            raise ActionFailed(f"{argv[0]}: command not found") from None
        except subprocess.TimeoutExpired:
            raise ActionFailed(f"{argv[0]}: timed out after {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ActionFailed(f"{argv[0]}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            err = " ".join((done.stderr or done.stdout or "").split())[:300]
            raise ActionFailed(f"{argv[0]} exited with status {done.returncode}: {err}")
        return done.stdout


# --- plans and context -----------------------------------------------------------------------------------------------

@dataclass
class Context:
    runner: Runner
    spdk: Callable[[str], Any]  # socket path -> an SPDK JSON-RPC client (context manager)
    sampling: Any  # the audit store: add_sampling_override / end_sampling_override
    tiers: frozenset[str]
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc).replace(tzinfo=None)
    alert: dict = field(default_factory=dict)  # alertname, fingerprint, starts_at of the alert being handled


@dataclass
class Plan:
    target: str
    details: dict  # what will be done, recorded in the audit as JSON
    execute: Callable[[], str]
    undo: dict | None = None  # JSON-able data for Action.undo when the alert resolves


class Action:
    name = ""
    exclusive = True  # subject to per-target lock, cooldown and budget
    keys: tuple[str, ...] = ()

    def check_params(self, params: dict, where: str) -> dict:
        unknown = sorted(set(params) - set(self.keys))
        if unknown:
            raise ConfigError(f"{where}: unknown parameter {unknown[0]!r} for {self.name} "
                              f"(expected {', '.join(self.keys) or 'none'})")
        return dict(params)

    def plan(self, labels: dict, params: dict, ctx: Context) -> Plan:
        raise NotImplementedError

    def undo(self, data: dict, params: dict, ctx: Context) -> Plan:
        raise NotImplementedError


def _config_match(pattern, value, where, what):
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(f"{where}: {what} {shown(value)} is not valid")
    return value


def _config_int(value, where, low=0, high=2**31):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: expected an integer in [{low}, {high}]; got {shown(value)}")
    return value


class NftDrainBackend(Action):
    """Take a node out of an nftables load-balancing set (`nft delete element FAMILY TABLE SET { ADDR }`), or,
    with `map`, lower its weight in a map (delete and re-add the element with `weight`, one nft transaction).
    Resolving puts it back (add the element / the `restore_weight`). The node's address comes from the
    `addresses` map of the config, else from the alert label named by `address_label`."""

    name = DRAIN
    keys = ("family", "table", "set", "map", "weight", "restore_weight", "addresses", "address_label", "netns")

    def check_params(self, params, where):
        p = super().check_params(params, where)
        p.setdefault("family", "inet")
        if p["family"] not in ("inet", "ip", "ip6"):
            raise ConfigError(f"{where}: family must be inet, ip or ip6; got {shown(p['family'])}")
        _config_match(NFT_IDENTIFIER, p.get("table"), where, "nft table")
        if ("set" in p) == ("map" in p):
            raise ConfigError(f"{where}: give exactly one of set (remove the element) or map (lower its weight)")
        if "set" in p:
            _config_match(NFT_IDENTIFIER, p["set"], where, "nft set")
            if "weight" in p or "restore_weight" in p:
                raise ConfigError(f"{where}: weight and restore_weight go with map, not set")
        else:
            _config_match(NFT_IDENTIFIER, p["map"], where, "nft map")
            p["weight"] = _config_int(p.get("weight", 0), f"{where}.weight", 0, 65535)
            if "restore_weight" not in p:
                raise ConfigError(f"{where}: map needs restore_weight (the weight put back on resolve)")
            p["restore_weight"] = _config_int(p["restore_weight"], f"{where}.restore_weight", 0, 65535)
        addresses = p.get("addresses", {})
        if not isinstance(addresses, dict):
            raise ConfigError(f"{where}.addresses: expected a mapping of node name to address")
        try:
            p["addresses"] = {valid_node(k): valid_ip(v) for k, v in addresses.items()}
        except Refused as exc:
            raise ConfigError(f"{where}.addresses: {exc}") from None
        if "address_label" in p:
            _config_match(LABEL_NAME, p["address_label"], where, "address_label")
        if not p["addresses"] and "address_label" not in p:
            raise ConfigError(f"{where}: needs addresses (node -> address) or address_label")
        if "netns" in p and p["netns"] is not None:
            _config_match(NETNS_NAME, p["netns"], where, "netns")
        return p

    def _address(self, labels, params, node):
        if node in params["addresses"]:
            return params["addresses"][node]
        if "address_label" in params:
            return valid_ip(label(labels, params["address_label"]))
        raise Refused(f"no address configured for node {node}")

    def _argv(self, params, address, drain: bool) -> list[str]:
        where = [params["family"], params["table"]]
        if "set" in params:
            verb = "delete" if drain else "add"
            return ["nft", verb, "element", *where, params["set"], "{", address, "}"]
        weight = str(params["weight"] if drain else params["restore_weight"])
        return ["nft", "delete", "element", *where, params["map"], "{", address, "}", ";",
                "add", "element", *where, params["map"], "{", address, ":", weight, "}"]

    def plan(self, labels, params, ctx):
        node = valid_node(label(labels, "node"))
        address = self._address(labels, params, node)
        argv = self._argv(params, address, drain=True)
        netns = params.get("netns")
        return Plan(target=f"backend:{node}", details={"node": node, "address": address, "argv": argv,
                                                       **({"netns": netns} if netns else {})},
                    execute=lambda: ctx.runner.run(argv, netns), undo={"node": node, "address": address})

    def undo(self, data, params, ctx):
        node, address = valid_node(data["node"]), valid_ip(data["address"])
        argv = self._argv(params, address, drain=False)
        netns = params.get("netns")
        return Plan(target=f"backend:{node}", details={"node": node, "address": address, "argv": argv},
                    execute=lambda: ctx.runner.run(argv, netns))


QOS_LIMITS = ("rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec")


class SpdkQosLimit(Action):
    """Rate-limit the alert's bdev with SPDK's bdev_set_qos_limit over JSON-RPC; resolving sets `restore`
    (default: 0, unlimited, for every limit set). The socket is `socket`, or `sockets[node]`."""

    name = QOS
    keys = ("socket", "sockets", "bdev", *QOS_LIMITS, "restore")

    def check_params(self, params, where):
        p = super().check_params(params, where)
        limits = {k: _config_int(p.pop(k), f"{where}.{k}") for k in QOS_LIMITS if k in p}
        if not limits:
            raise ConfigError(f"{where}: give at least one of {', '.join(QOS_LIMITS)}")
        restore = p.pop("restore", {k: 0 for k in limits})
        if not isinstance(restore, dict) or set(restore) - set(QOS_LIMITS) or not restore:
            raise ConfigError(f"{where}.restore: expected a mapping of {', '.join(QOS_LIMITS)} to integers")
        p["limits"] = limits
        p["restore"] = {k: _config_int(v, f"{where}.restore.{k}") for k, v in restore.items()}
        sockets = p.get("sockets", {})
        if not isinstance(sockets, dict):
            raise ConfigError(f"{where}.sockets: expected a mapping of node name to socket path")
        for node, path in sockets.items():
            if not isinstance(node, str) or not NODE_NAME.fullmatch(node) or not isinstance(path, str):
                raise ConfigError(f"{where}.sockets: {shown(node)}: expected node name -> socket path")
        p["sockets"] = dict(sockets)
        if "socket" in p and not isinstance(p["socket"], str):
            raise ConfigError(f"{where}.socket: expected a path")
        if "bdev" in p:
            _config_match(BDEV_NAME, p["bdev"], where, "bdev")
        return p

    def _socket(self, params, node):
        if node in params["sockets"]:
            return params["sockets"][node]
        if "socket" in params:
            return params["socket"]
        raise Refused(f"no SPDK socket configured for node {node}")

    def _plan(self, ctx, node, bdev, socket_path, limits, phase):
        def execute():
            try:
                with ctx.spdk(socket_path) as client:
                    client.bdev_set_qos_limit(bdev, **limits)
            except SpdkError as exc:
                raise ActionFailed(str(exc)) from None
            return f"bdev_set_qos_limit {bdev} {limits}"

        return Plan(target=f"bdev:{node}/{bdev}",
                    details={"node": node, "bdev": bdev, "socket": socket_path, phase: limits},
                    execute=execute, undo={"node": node, "bdev": bdev})

    def plan(self, labels, params, ctx):
        node = valid_node(label(labels, "node"))
        bdev = params.get("bdev") or valid_bdev(label(labels, "bdev"))
        return self._plan(ctx, node, bdev, self._socket(params, node), params["limits"], "limits")

    def undo(self, data, params, ctx):
        node, bdev = valid_node(data["node"]), valid_bdev(data["bdev"])
        plan = self._plan(ctx, node, bdev, self._socket(params, node), params["restore"], "restore")
        plan.undo = None
        return plan


class RestartWorkload(Action):
    """Restart the inference workload on the alert's node. kubectl: delete the pods matching `selector` in
    `namespace` that run on the node (their controller recreates them); crictl / docker (node-local, only for
    the node named by `node`): stop / restart `container`."""

    name = RESTART
    keys = ("runtime", "namespace", "selector", "container", "node")

    def check_params(self, params, where):
        p = super().check_params(params, where)
        runtime = p.get("runtime")
        if runtime == "kubectl":
            for key in ("container", "node"):
                if key in p:
                    raise ConfigError(f"{where}: {key} is for crictl and docker, not kubectl")
            _config_match(DNS_LABEL, p.get("namespace"), where, "namespace")
            _config_match(LABEL_SELECTOR, p.get("selector"), where, "selector (key=value[,key=value])")
        elif runtime in ("crictl", "docker"):
            for key in ("namespace", "selector"):
                if key in p:
                    raise ConfigError(f"{where}: {key} is for kubectl, not {runtime}")
            _config_match(CONTAINER_NAME, p.get("container"), where, "container")
            _config_match(NODE_NAME, p.get("node"), where, "node (the node this runtime runs on)")
        else:
            raise ConfigError(f"{where}: runtime must be kubectl, crictl or docker; got {shown(runtime)}")
        return p

    def plan(self, labels, params, ctx):
        node = valid_node(label(labels, "node"))
        runtime = params["runtime"]
        if runtime == "kubectl":
            argv = ["kubectl", "delete", "pod", "--namespace", params["namespace"], "--selector",
                    params["selector"], "--field-selector", f"spec.nodeName={node}", "--wait=false"]
            execute = lambda: ctx.runner.run(argv)  # noqa: E731
        else:
            if node != params["node"]:
                raise Refused(f"{runtime} acts on node {params['node']} only; the alert is for node {node}")
            container = params["container"]
            if runtime == "docker":
                argv = ["docker", "restart", "--", container]
                execute = lambda: ctx.runner.run(argv)  # noqa: E731
            else:
                argv = ["crictl", "ps", "--quiet", "--name", f"^{re.escape(container)}$"]

                def execute():
                    ids = ctx.runner.run(argv).split()
                    if not ids:
                        raise ActionFailed(f"crictl: no running container named {container}")
                    for cid in ids:
                        _match(CONTAINER_ID, cid, "container id from crictl")
                    return ctx.runner.run(["crictl", "stop", *ids])
        return Plan(target=f"workload:{node}", details={"node": node, "runtime": runtime, "argv": argv},
                    execute=execute, undo=None)


class RaiseSampling(Action):
    """Record a sampling override (tier -> `ratio`, default 1.0, for `duration`, default 30m) in the
    sampling_overrides table for the sampling policy to read; resolving ends it."""

    name = RAISE_SAMPLING
    keys = ("ratio", "duration")

    def check_params(self, params, where):
        p = super().check_params(params, where)
        ratio = p.get("ratio", 1.0)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"{where}.ratio: expected a number in (0, 1]; got {shown(ratio)}")
        p["ratio"] = float(ratio)
        seconds = parse_duration(p.get("duration", "30m"), f"{where}.duration")
        if seconds > 86400:
            raise ConfigError(f"{where}.duration: at most 24h; got {p.get('duration')!r}")
        p["duration_s"] = seconds
        p.pop("duration", None)
        return p

    def plan(self, labels, params, ctx):
        tier = valid_tier(label(labels, "tier"), ctx.tiers)
        until = ctx.now() + timedelta(seconds=params["duration_s"])
        alert = dict(ctx.alert)

        def execute():
            ctx.sampling.add_sampling_override(tier, params["ratio"], until, alert)
            return f"tier {tier} sampled at {params['ratio']:.0%} until {rfc3339(until)}"

        return Plan(target=f"tier:{tier}", details={"tier": tier, "ratio": params["ratio"],
                                                    "until": rfc3339(until)},
                    execute=execute, undo={"tier": tier})

    def undo(self, data, params, ctx):
        tier = valid_tier(data["tier"], ctx.tiers)
        alert = dict(ctx.alert)

        def execute():
            ended = ctx.sampling.end_sampling_override(alert)
            return f"sampling override of tier {tier} ended ({ended} row(s))"

        return Plan(target=f"tier:{tier}", details={"tier": tier}, execute=execute)


class NotifyOnly(Action):
    """Record the alert; act on nothing."""

    name = NOTIFY
    exclusive = False

    def plan(self, labels, params, ctx):
        return Plan(target="notify", details={}, execute=lambda: "notified only")


REGISTRY: dict[str, Action] = {a.name: a for a in (NftDrainBackend(), SpdkQosLimit(), RestartWorkload(),
                                                    RaiseSampling(), NotifyOnly())}
assert set(REGISTRY) == set(ACTIONS)
