"""The remediation engine: Alertmanager alerts in, safe actions out, every decision audited.

Driven by an allow-list config (YAML):

    execute: false              # dry-run unless true: decisions are recorded, nothing is done
    cooldown: 10m               # per target: no new action on a target acted on within this time
    max_actions_per_hour: 10    # global budget of actions (dry-runs and failures count too)
    command_timeout: 30s
    actions:                    # alert name -> action; alerts not listed are refused
      SloscopeGpuSaturated:
        action: nft_drain_backend
        params: {family: inet, table: lb, set: backends, addresses: {gpu-node-3: 10.0.0.3}}
      SloscopeNvmeHot:
        action: spdk_qos_limit
        dry_run: true           # keep this one a rehearsal even when execute is true
        params: {socket: /var/tmp/spdk.sock, rw_ios_per_sec: 20000}

Safety, in the order it is applied to a firing alert: the (fingerprint, startsAt) was not acted on before
(re-sent groups act once); the alert name is in the allow-list; every label the action uses is validated
against a strict pattern before anything is built from it; the target was not acted on within the cooldown;
the hourly budget is not spent; no other action on the target is in progress (lock per target); then the action
runs, or is only recorded when execution is off. A resolved alert undoes what its firing opened. Every decision
goes to the remediation_audit table and the log.

Only failures of the audit store itself (DuckDB busy or locked) raise `Transient`, which the webhook answers with
a 5xx so that Alertmanager retries; nothing has been acted on when it is raised before an action.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import duckdb
import yaml

from sloscope.errors import read_config_text

from alerts.actions import (NOTIFY, REGISTRY, ActionFailed, ConfigError, Context, Refused, Runner)

log = logging.getLogger("sloscope.remediation")

ALERT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
COUNTED = ("executed", "dry_run", "failed")  # decisions that use up cooldown and budget


class Transient(RuntimeError):
    """The audit store is busy or unavailable: nothing (more) was done; the sender should retry."""


# --- config ----------------------------------------------------------------------------------------------------------

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


def parse_config(text: str, source: str = "<string>") -> Config:
    from sloscope.durations import parse_duration

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping")
    known = {"execute", "cooldown", "max_actions_per_hour", "command_timeout", "actions"}
    unknown = sorted(set(map(str, doc)) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})")
    execute = doc.get("execute", False)
    if not isinstance(execute, bool):
        raise ConfigError(f"{source}: execute: expected true or false; got {execute!r}")
    cooldown = parse_duration(doc.get("cooldown", "10m"), f"{source}: cooldown")
    timeout = parse_duration(doc.get("command_timeout", "30s"), f"{source}: command_timeout")
    budget = doc.get("max_actions_per_hour", 10)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"{source}: max_actions_per_hour: expected a non-negative integer; got {budget!r}")
    actions_doc = doc.get("actions") or {}
    if not isinstance(actions_doc, dict):
        raise ConfigError(f"{source}: actions: expected a mapping of alert name to action")
    rules = {}
    for name, body in actions_doc.items():
        where = f"{source}: actions.{name}"
        if not isinstance(name, str) or not ALERT_NAME.fullmatch(name):
            raise ConfigError(f"{where}: not a valid alert name")
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: expected a mapping with action (and params, dry_run)")
        extra = sorted(set(map(str, body)) - {"action", "params", "dry_run"})
        if extra:
            raise ConfigError(f"{where}: unknown key {extra[0]!r} (expected action, params, dry_run)")
        action = body.get("action")
        if action not in REGISTRY:
            raise ConfigError(f"{where}.action: expected one of {', '.join(REGISTRY)}; got {action!r}")
        params = body.get("params") or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}.params: expected a mapping")
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ConfigError(f"{where}.dry_run: expected true or false")
        rules[name] = Rule(name, action, REGISTRY[action].check_params(params, f"{where}.params"), dry_run)
    return Config(rules, execute, cooldown, budget, timeout, source)


def load_config(path: str | Path) -> Config:
    return parse_config(read_config_text(path, "remediation config"), str(path))


# --- audit store -----------------------------------------------------------------------------------------------------

_TRANSIENT = (duckdb.IOException, duckdb.TransactionException, duckdb.ConnectionException)


@contextlib.contextmanager
def transaction(con):
    """Several writes that stand or fall together (a claim and its audit row, an open action and its audit)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    con.execute("COMMIT")


def _sql():
    from analytics.store import sql

    return sql("remediation")


class AuditStore:
    """The remediation tables in a DuckDB database. `connect()` gives a connection per use: a new connection to a
    file (`AuditStore.at(path)`, which lets other processes use the file in between), or a cursor of an open
    store's connection (`AuditStore(store.con.cursor)`, when running inside `sloscope serve`)."""

    def __init__(self, connect: Callable[[], duckdb.DuckDBPyConnection]):
        self._connect = connect
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    @classmethod
    def at(cls, path: str | Path) -> "AuditStore":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return cls(lambda: duckdb.connect(str(path)))

    @contextlib.contextmanager
    def session(self):
        try:
            con = self._connect()
        except _TRANSIENT as exc:
            raise Transient(f"audit store unavailable: {exc}") from None
        try:
            if not self._schema_ready:
                with self._schema_lock:
                    if not self._schema_ready:
                        con.execute(_sql())
                        self._schema_ready = True
            yield con
        except _TRANSIENT as exc:
            raise Transient(f"audit store busy: {exc}") from None
        finally:
            con.close()

    # reads
    def seen(self, con, key) -> bool:
        return con.execute("SELECT 1 FROM remediation_deliveries WHERE fingerprint = ? AND starts_at = ? "
                           "AND status = ?", list(key)).fetchone() is not None

    def last_action(self, con, target: str):
        return con.execute(
            f"SELECT max(ts) FROM remediation_audit WHERE target = ? AND decision IN {COUNTED} "
            "AND action NOT LIKE '%.undo' AND action <> ?", [target, NOTIFY]).fetchone()[0]

    def actions_since(self, con, since: datetime) -> int:
        return con.execute(
            f"SELECT count(*) FROM remediation_audit WHERE ts > ? AND decision IN {COUNTED} "
            "AND action NOT LIKE '%.undo' AND action <> ?", [since, NOTIFY]).fetchone()[0]

    def open_action(self, con, fingerprint: str, starts_at: str):
        row = con.execute("SELECT alert, action, target, params, undo, dry_run FROM remediation_open "
                          "WHERE fingerprint = ? AND starts_at = ? AND closed_at IS NULL",
                          [fingerprint, starts_at]).fetchone()
        if row is None:
            return None
        alert, action, target, params, undo, dry_run = row
        return {"alert": alert, "action": action, "target": target, "params": json.loads(params),
                "undo": json.loads(undo), "dry_run": dry_run}

    # writes
    def claim(self, con, key, now: datetime) -> None:
        con.execute("INSERT OR IGNORE INTO remediation_deliveries VALUES (?, ?, ?, ?)", [*key, now])

    def audit(self, con, row: dict) -> None:
        con.execute("INSERT INTO remediation_audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            row["ts"], row["alert"], row["fingerprint"], row["starts_at"], row.get("action"), row.get("target"),
            json.dumps(row.get("params") or {}, sort_keys=True, default=str), row["decision"], row.get("reason")])

    def open(self, con, key, alert, action, target, params, undo, dry_run, now) -> None:
        con.execute("INSERT OR REPLACE INTO remediation_open VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)", [
            key[0], key[1], alert, action, target, json.dumps(params, sort_keys=True), json.dumps(undo), dry_run,
            now])

    def close(self, con, fingerprint, starts_at, now) -> None:
        con.execute("UPDATE remediation_open SET closed_at = ? WHERE fingerprint = ? AND starts_at = ?",
                    [now, fingerprint, starts_at])


class SamplingOverrides:
    """What raise_sampling writes, bound to the connection of the alert being handled."""

    def __init__(self, con, now: Callable[[], datetime]):
        self.con, self.now = con, now

    def add_sampling_override(self, tier, ratio, until, alert) -> None:
        self.con.execute("INSERT INTO sampling_overrides VALUES (?, ?, ?, ?, ?, ?, ?)", [
            tier, ratio, until, self.now(), alert.get("alertname"), alert.get("fingerprint"), alert.get("starts_at")])

    def end_sampling_override(self, alert) -> int:
        now = self.now()
        return self.con.execute(
            "UPDATE sampling_overrides SET until = ? WHERE fingerprint = ? AND starts_at = ? AND until > ?",
            [now, alert.get("fingerprint"), alert.get("starts_at"), now]).fetchone()[0]


def active_sampling_overrides(reader, now: datetime | None = None) -> dict[str, float]:
    """tier -> the highest sampling ratio of an override active at `now`, from a store or reader
    (analytics.store.Reader): for the sampling policy."""
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    if "sampling_overrides" not in reader.tables():  # no raise_sampling yet, or a store without remediation
        return {}
    return dict(reader.rows("SELECT tier, max(ratio) FROM sampling_overrides WHERE until > ? GROUP BY tier", [now]))


# --- the engine ------------------------------------------------------------------------------------------------------

def parse_rfc3339(text: str) -> datetime:
    """Alertmanager's RFC 3339 times (nanoseconds allowed) as naive UTC, to the microsecond."""
    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})", text,
                     re.ASCII)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text[:40]!r}")
    date, clock, frac, zone = m.groups()
    frac = (frac or "").ljust(6, "0")[:6]
    t = datetime.fromisoformat(f"{date}T{clock}.{frac}{'+00:00' if zone in 'Zz' else zone}")
    try:
        return t.astimezone(timezone.utc).replace(tzinfo=None)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is in year 0 in UTC
        raise ValueError(f"{text[:40]!r} is outside the years 1 to 9999 in UTC") from None


class Engine:
    def __init__(self, config: Config, audit: AuditStore, tiers, *, runner: Runner | None = None,
                 spdk: Callable | None = None, now: Callable[[], datetime] | None = None):
        self.config = config
        self.audit = audit
        self.tiers = frozenset(tiers)
        self.runner = runner or Runner(config.command_timeout_s)
        self.spdk = spdk or _spdk_client
        self.now = now or (lambda: datetime.now(timezone.utc).replace(tzinfo=None))
        self._decide = threading.Lock()  # decisions (checks and claims) one at a time
        self._targets: dict[str, threading.Lock] = {}  # one action per target at once
        self._in_flight = 0  # claimed but not yet audited: counts against the budget

    def handle(self, alerts: list[dict]) -> list[dict]:
        """Handle the (schema-checked) alerts of one notification; one result per alert. Raises Transient when
        the audit store is busy (alerts already handled stay handled; a re-send finds them done)."""
        with self.audit.session() as con:
            return [self._handle(con, alert) for alert in alerts]

    def record_unauthenticated(self, count: int) -> None:
        """Audit webhook requests refused for a missing or wrong token (nothing of them was read)."""
        row = {"ts": self.now(), "alert": "(unauthenticated)", "fingerprint": "", "starts_at": None,
               "decision": "refused", "reason": f"{count} webhook request(s) without a valid bearer token"}
        try:
            with self.audit.session() as con:
                self.audit.audit(con, row)
        except Transient as exc:
            log.warning("could not audit %d unauthenticated webhook request(s): %s", count, exc)

    def _ctx(self, con, meta) -> Context:
        return Context(runner=self.runner, spdk=self.spdk, sampling=SamplingOverrides(con, self.now),
                       tiers=self.tiers, now=self.now, alert=meta)

    def _handle(self, con, alert: dict) -> dict:
        labels = alert["labels"]
        meta = {"alertname": labels.get("alertname", ""), "fingerprint": alert["fingerprint"],
                "starts_at": alert["startsAt"]}
        key = (alert["fingerprint"], alert["startsAt"], alert["status"])
        row = {"alert": meta["alertname"], "fingerprint": alert["fingerprint"],
               "starts_at": parse_rfc3339(alert["startsAt"]), "status": alert["status"]}
        if alert["status"] == "firing":
            return self._fire(con, alert, key, meta, row)
        return self._resolve(con, key, meta, row)

    def _finish(self, con, row: dict, level=logging.INFO, before: Callable | None = None) -> dict:
        """Audit the decision (after `before`, in one transaction) and log it."""
        row["ts"] = self.now()
        with transaction(con):
            if before is not None:
                before()
            self.audit.audit(con, row)
        log.log(level, "remediation %s: alert=%r fingerprint=%s action=%s target=%r: %s", row["decision"],
                row["alert"], row["fingerprint"], row.get("action"), row.get("target"), row.get("reason"))
        return _result(row)

    def _refuse(self, con, key, row, reason: str) -> dict:
        row.update(decision="refused", reason=reason)
        return self._finish(con, row, logging.WARNING, before=lambda: self.audit.claim(con, key, self.now()))

    def _fire(self, con, alert, key, meta, row) -> dict:
        labels = alert["labels"]
        with self._decide:
            if self.audit.seen(con, key):
                return _result({**row, "decision": "duplicate", "reason": "already handled"})
            if self.audit.seen(con, (*key[:2], "resolved")):  # a late delivery (a retry, a second Alertmanager)
                return self._refuse(con, key, row, "this alert was already resolved; its firing came late")
            rule = self.config.actions.get(meta["alertname"])
            if rule is None:
                row["params"] = {"labels": labels}
                return self._refuse(con, key, row, f"alert {meta['alertname']!r} is not in the allow-list")
            action = REGISTRY[rule.action]
            row["action"] = rule.action
            try:
                plan = action.plan(labels, rule.params, self._ctx(con, meta))
            except Refused as exc:
                row["params"] = {"labels": labels}
                return self._refuse(con, key, row, str(exc))
            row.update(target=plan.target, params=plan.details)
            lock = None
            if action.exclusive:
                now = self.now()
                last = self.audit.last_action(con, plan.target)
                if last is not None and now - last < timedelta(seconds=self.config.cooldown_s):
                    left = self.config.cooldown_s - (now - last).total_seconds()
                    return self._refuse(con, key, row, f"cooldown: {plan.target} was acted on at "
                                        f"{last:%Y-%m-%dT%H:%M:%SZ} ({left:.0f} s of cooldown left)")
                used = self.audit.actions_since(con, now - timedelta(hours=1)) + self._in_flight
                if used >= self.config.max_actions_per_hour:
                    return self._refuse(con, key, row, f"budget: {used} actions in the last hour "
                                        f"(max_actions_per_hour {self.config.max_actions_per_hour})")
                lock = self._targets.setdefault(plan.target, threading.Lock())
                if not lock.acquire(blocking=False):
                    return self._refuse(con, key, row, f"another action on {plan.target} is in progress")
                self._in_flight += 1
            try:
                self.audit.claim(con, key, self.now())
            except BaseException:
                if lock is not None:
                    self._in_flight -= 1
                    lock.release()
                raise
        try:
            dry_run, effect_unknown = not self.config.execute or rule.dry_run, False
            if dry_run:
                why = "this action is dry_run in the config" if rule.dry_run else "execution is off in the config"
                row.update(decision="dry_run", reason=f"would run; {why}")
            else:
                try:
                    row.update(decision="executed", reason=str(plan.execute())[:500] or "done")
                except (ActionFailed, Refused) as exc:  # Refused here: a value from a command's output
                    row.update(decision="failed", reason=str(exc))
                except (Transient, *_TRANSIENT):
                    raise
                except Exception as exc:  # the action may have taken effect: audited, and its undo kept open
                    log.exception("remediation %s on %s failed unexpectedly", rule.action, plan.target)
                    row.update(decision="failed", reason=f"unexpected {type(exc).__name__}: {str(exc)[:300]}")
                    effect_unknown = True
            opens = None
            if (row["decision"] in ("executed", "dry_run") or effect_unknown) and plan.undo is not None:
                opens = lambda: self.audit.open(con, key, meta["alertname"], rule.action, plan.target,  # noqa: E731
                                                rule.params, plan.undo, dry_run, self.now())
            return self._finish(con, row, logging.ERROR if row["decision"] == "failed" else logging.INFO, opens)
        except (Transient, *_TRANSIENT):
            log.error("remediation decision not recorded (audit store busy): %r", row)
            raise
        finally:
            if lock is not None:
                with self._decide:
                    self._in_flight -= 1
                lock.release()

    def _resolve(self, con, key, meta, row) -> dict:
        with self._decide:
            if self.audit.seen(con, key):
                return _result({**row, "decision": "duplicate", "reason": "already handled"})
            opened = self.audit.open_action(con, meta["fingerprint"], meta["starts_at"])
            if opened is None:
                self.audit.claim(con, key, self.now())
                return _result({**row, "decision": "ignored", "reason": "nothing was opened for this alert"})
            lock = self._targets.setdefault(opened["target"], threading.Lock())
            if not lock.acquire(blocking=False):
                raise Transient(f"another action on {opened['target']} is in progress; retry the resolve later")
            self.audit.claim(con, key, self.now())
        try:
            action = REGISTRY[opened["action"]]
            row.update(action=opened["action"] + ".undo", target=opened["target"])
            try:
                plan = action.undo(opened["undo"], opened["params"], self._ctx(con, meta))
            except Refused as exc:
                row.update(decision="refused", reason=f"cannot undo: {exc}")
                return self._finish(con, row, logging.ERROR)
            row["params"] = plan.details
            if opened["dry_run"]:
                row.update(decision="dry_run", reason="would undo; the action was a dry run")
            else:
                try:
                    row.update(decision="executed", reason=str(plan.execute())[:500] or "done")
                except ActionFailed as exc:
                    row.update(decision="failed", reason=f"undo failed, the action stays open: {exc}")
                except (Transient, *_TRANSIENT):
                    raise
                except Exception as exc:
                    log.exception("undo of %s on %s failed unexpectedly", opened["action"], opened["target"])
                    row.update(decision="failed", reason=f"undo failed unexpectedly, the action stays open: "
                                                         f"{type(exc).__name__}: {str(exc)[:300]}")
            closes = None
            if row["decision"] != "failed":
                closes = lambda: self.audit.close(con, meta["fingerprint"], meta["starts_at"], self.now())  # noqa
            return self._finish(con, row, logging.ERROR if row["decision"] == "failed" else logging.INFO, closes)
        finally:
            lock.release()


def _result(row: dict) -> dict:
    return {"alert": row["alert"], "fingerprint": row["fingerprint"], "status": row["status"],
            "action": row.get("action"), "target": row.get("target"), "decision": row["decision"],
            "reason": row.get("reason")}


def _spdk_client(path: str):
    from probes.spdk.rpc_client import SpdkRpcClient

    return SpdkRpcClient(path)
