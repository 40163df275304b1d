"""The remediation allow-list: which alert may trigger which action, read strictly (sloscope/yaml_config.py)
by the webhook, serve and `sloscope validate` alike. Apart from the engine (alerts/remediation.py), so that a
config can be checked where the engine's audit store (DuckDB) is not installed.

The config (YAML):

    execute: false              # dry-run unless true: decisions are recorded, nothing is done
    cooldown: 10m               # per target: no new action on a target acted on within this time
    max_actions_per_hour: 10    # global budget of actions (dry-runs and failures count too)
    command_timeout: 30s
    audit_retention: 90d        # decisions older than this are deleted (open actions are kept until undone)
    actions:                    # alert name -> action; alerts not listed are refused
      SloscopeGpuSaturated:
        action: nft_drain_backend
        params: {family: inet, table: lb, set: backends, addresses: {gpu-node-3: 10.0.0.3}}
      SloscopeNvmeHot:
        action: spdk_qos_limit
        dry_run: true           # keep this one a rehearsal even when execute is true
        params: {socket: /var/tmp/spdk.sock, rw_ios_per_sec: 20000}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sloscope import yaml_config
from sloscope.durations import parse_duration
from sloscope.errors import read_config_text
from sloscope.yaml_config import key_at, refuse_unknown_keys

from sloscope.alerts.actions import REGISTRY, ConfigError

ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)


@dataclass(frozen=True)
class Rule:
    alert: str
    action: str
    params: dict
    dry_run: bool = False


@dataclass(frozen=True)
class Config:
    actions: dict[str, Rule] = field(default_factory=dict)
    execute: bool = False
    cooldown_s: float = 600.0
    max_actions_per_hour: int = 10
    command_timeout_s: float = 30.0
    source: str = "<empty>"
    audit_retention_s: float = 90 * 86_400.0


CONFIG_KEYS = ("execute", "cooldown", "max_actions_per_hour", "command_timeout", "audit_retention", "actions")
RULE_KEYS = ("action", "params", "dry_run")


def parse_config(text: str, source: str = "<string>") -> Config:
    """The allow-list config; ConfigError names the file, the line and the key of what is wrong."""
    doc = yaml_config.parse(text, source)
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping")
    refuse_unknown_keys(source, doc, sorted(CONFIG_KEYS))
    execute = doc.get("execute", False)
    if not isinstance(execute, bool):
        raise ConfigError(f"{key_at(source, doc, 'execute')}: expected true or false; got {execute!r}")
    cooldown = parse_duration(doc.get("cooldown", "10m"), key_at(source, doc, "cooldown"))
    timeout = parse_duration(doc.get("command_timeout", "30s"), key_at(source, doc, "command_timeout"))
    retention = parse_duration(doc.get("audit_retention", "90d"), key_at(source, doc, "audit_retention"))
    if retention < 86_400:  # a shorter one would forget an alert's firing before a long incident resolves
        raise ConfigError(f"{key_at(source, doc, 'audit_retention')}: at least 1d; got {doc['audit_retention']!r}")
    budget = doc.get("max_actions_per_hour", 10)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"{key_at(source, doc, 'max_actions_per_hour')}: expected a non-negative integer; "
                          f"got {budget!r}")
    actions_doc = doc.get("actions") or {}
    if not isinstance(actions_doc, dict):
        raise ConfigError(f"{key_at(source, doc, 'actions')}: expected a mapping of alert name to action")
    rules = {name: _rule(name, body, source, actions_doc) for name, body in actions_doc.items()}
    return Config(rules, execute, cooldown, budget, timeout, source, retention)


def _rule(name, body, source: str, actions_doc: dict) -> Rule:
    """The allow-list entry of alert `name`."""
    where = key_at(source, actions_doc, name, f"actions.{name}")
    if not isinstance(name, str) or not ALERT_NAME.fullmatch(name):
        raise ConfigError(f"{where}: not a valid alert name")
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a mapping with action (and params, dry_run)")
    refuse_unknown_keys(source, body, RULE_KEYS, f"actions.{name}")
    action = body.get("action")
    if not isinstance(action, str) or action not in REGISTRY:  # a list is no action, and unhashable
        raise ConfigError(f"{key_at(source, body, 'action', f'actions.{name}.action')}: expected one of "
                          f"{', '.join(REGISTRY)}; got {action!r}")
    params, params_at = body.get("params") or {}, key_at(source, body, "params", f"actions.{name}.params")
    if not isinstance(params, dict):
        raise ConfigError(f"{params_at}: expected a mapping")
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"{key_at(source, body, 'dry_run', f'actions.{name}.dry_run')}: expected true or false; "
                          f"got {dry_run!r}")
    return Rule(name, action, REGISTRY[action].check_params(params, params_at), dry_run)


def load_config(path: str | Path) -> Config:
    return parse_config(read_config_text(path, "remediation config"), str(path))
