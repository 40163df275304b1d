"""The remediation engine: Alertmanager alerts in, safe actions out, every decision audited.

Driven by the allow-list of alerts/remediation_config.py.

Safety, in the order it is applied to a firing alert: the (fingerprint, startsAt) was not acted on before
(re-sent groups act once); the alert name is in the allow-list; every label the action uses is validated
against a strict pattern before anything is built from it; the target was not acted on within the cooldown;
the hourly budget is not spent; no other action on the target is in progress (lock per target); then the action
runs, or is only recorded when execution is off. A resolved alert undoes what its firing opened, unless another
alert about the same target still fires, whether its own action was taken or refused (cooldown, budget, another
action in progress): then the undo is deferred (audited so), and the last of them to resolve undoes every action
on the target, the newest first. Every decision goes to the remediation_audit table (alerts/audit.py) and the log.

Only failures of the audit store itself (DuckDB busy or locked) raise `Transient`, which the webhook answers with
a 5xx so that Alertmanager retries; nothing has been acted on when it is raised before an action.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Callable

from sloscope.times import parse_rfc3339, rfc3339

from sloscope.probes.spdk.rpc_client import SpdkRpcClient

from sloscope.alerts.actions import REGISTRY, ActionFailed, Context, Refused, Runner
from sloscope.alerts.audit import TRANSIENT_ERRORS, AuditStore, Transient, transaction
from sloscope.alerts.remediation_config import Config, Rule

log = logging.getLogger("sloscope.remediation")
PRUNE_EVERY = timedelta(hours=1)  # how often the audit is cut back to its retention

# --- sampling overrides --------------------------------------------------------------------------------------------

class SamplingOverrides:
    """What raise_sampling writes, bound to the connection of the alert being handled."""

    def __init__(self, con, now: Callable[[], datetime]):
        self.con, self.now = con, now

    def add_sampling_override(self, tier, ratio, until, alert) -> None:
        self.con.execute("INSERT INTO sampling_overrides (tier, ratio, until, created_at, alert, fingerprint, "
                         "starts_at) VALUES (?, ?, ?, ?, ?, ?, ?)", [
            tier, ratio, until, self.now(), alert.get("alertname"), alert.get("fingerprint"), alert.get("starts_at")])

    def end_sampling_override(self, alert) -> int:
        now = self.now()
        return self.con.execute(
            "UPDATE sampling_overrides SET until = ? WHERE fingerprint = ? AND starts_at = ? AND until > ?",
            [now, alert.get("fingerprint"), alert.get("starts_at"), now]).fetchone()[0]


def active_sampling_overrides(reader, now: datetime | None = None) -> dict[str, float]:
    """tier -> the highest sampling ratio of an override active at `now`, from a store or its reader
    (analytics/store_api.py): for the sampling policy."""
    now = now or datetime.now(timezone.utc).replace(tzinfo=None)
    if "sampling_overrides" not in reader.tables():  # no raise_sampling yet, or a store without remediation
        return {}
    return dict(reader.rows("SELECT tier, max(ratio) FROM sampling_overrides WHERE until > ? GROUP BY tier", [now]))


# --- the engine ------------------------------------------------------------------------------------------------------

class Engine:
    def __init__(self, config: Config, audit: AuditStore, tiers, *, runner: Runner | None = None,
                 spdk: Callable | None = None, now: Callable[[], datetime] | None = None):
        self.config = config
        self.audit = audit
        self.tiers = frozenset(tiers)
        self.runner = runner or Runner(config.command_timeout_s)
        self.spdk = spdk or SpdkRpcClient
        self.now = now or (lambda: datetime.now(timezone.utc).replace(tzinfo=None))
        self._decide = threading.Lock()  # decisions (checks and claims) one at a time
        self._targets: dict[str, threading.Lock] = {}  # one action per target at once
        self._in_flight = 0  # claimed but not yet audited: counts against the budget
        # (fingerprint, startsAt) -> (action, target) of the firings whose action is running: their resolve is left
        # to them, to undo what they opened once it is recorded
        self._running: dict[tuple[str, str], tuple[str, str]] = {}
        self._pruned_at: datetime | None = None

    def handle(self, alerts: list[dict], client: str | None = None) -> list[dict]:
        """Handle the (schema-checked) alerts of one notification, sent from the address `client`; one result per
        alert. Raises Transient when the audit store is busy (alerts already handled stay handled; a re-send finds
        them done)."""
        with self.audit.session() as con:
            self._prune(con)
            return [self._handle(con, alert, client) for alert in alerts]

    def _prune(self, con) -> None:
        """The audit kept to `audit_retention`, checked at most every PRUNE_EVERY."""
        now = self.now()
        with self._decide:
            if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
                return
            self._pruned_at = now
        removed = self.audit.prune(con, now - timedelta(seconds=self.config.audit_retention_s))
        if removed:
            log.info("remediation audit: %d decisions older than %s deleted (audit_retention)", removed,
                     timedelta(seconds=self.config.audit_retention_s))

    def record_refused_request(self, alert: str, reason: str, client: str | None) -> None:
        """Audit a webhook request refused before any of its alerts was handled. `alert` and `reason` must hold
        nothing of the request unchecked. Raises Transient when the audit store is busy."""
        row = {"alert": alert, "fingerprint": "", "starts_at": None, "status": None, "decision": "refused",
               "reason": reason, "client": client, "dry_run": self._dry_run(None)}
        with self.audit.session() as con:
            self._finish(con, row, logging.WARNING)

    def record_unauthenticated(self, count: int, clients: str | None) -> None:
        """Audit webhook requests refused for a missing or wrong token (nothing of them was read)."""
        try:
            self.record_refused_request("(unauthenticated)",
                                        f"{count} webhook request(s) without a valid bearer token", clients)
        except Transient as exc:
            log.warning("could not audit %d unauthenticated webhook request(s): %s", count, exc)

    def _dry_run(self, rule: Rule | None) -> bool:
        return not self.config.execute or (rule is not None and rule.dry_run)

    def _ctx(self, con, meta) -> Context:
        return Context(runner=self.runner, spdk=self.spdk, sampling=SamplingOverrides(con, self.now),
                       tiers=self.tiers, now=self.now, alert=meta)

    def _handle(self, con, alert: dict, client: str | None) -> dict:
        labels = alert["labels"]
        meta = {"alertname": labels.get("alertname", ""), "fingerprint": alert["fingerprint"],
                "starts_at": alert["startsAt"]}
        key = (alert["fingerprint"], alert["startsAt"], alert["status"])
        row = {"alert": meta["alertname"], "fingerprint": alert["fingerprint"],
               "starts_at": parse_rfc3339(alert["startsAt"]), "status": alert["status"], "client": client}
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
        log.log(level, "remediation %s: alert=%r fingerprint=%s action=%s target=%r client=%s: %s", row["decision"],
                row["alert"], row["fingerprint"], row.get("action"), row.get("target"), row.get("client"),
                row.get("reason"))
        return _result(row)

    def _refuse(self, con, key, row, reason: str) -> dict:
        row.update(decision="refused", reason=reason)
        return self._finish(con, row, logging.WARNING, before=lambda: self.audit.claim(con, key, self.now()))

    def _fire(self, con, alert, key, meta, row) -> dict:
        labels = alert["labels"]
        rule = self.config.actions.get(meta["alertname"])
        row["dry_run"] = self._dry_run(rule)
        with self._decide:
            if self.audit.seen(con, key):
                return _result({**row, "decision": "duplicate", "reason": "already handled"})
            if self.audit.seen(con, (*key[:2], "resolved")):  # a late delivery (a retry, a second Alertmanager)
                return self._refuse(con, key, row, "this alert was already resolved; its firing came late")
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
                                        f"{rfc3339(last)} ({left:.0f} s of cooldown left)")
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
            self._running[key[:2]] = (rule.action, plan.target)
        try:
            effect_unknown = False
            if row["dry_run"]:
                why = "this action is dry_run in the config" if rule.dry_run else "execution is off in the config"
                row.update(decision="dry_run", reason=f"would run; {why}")
            else:
                try:
                    row.update(decision="executed", reason=str(plan.execute())[:500] or "done")
                except (ActionFailed, Refused) as exc:  # Refused here: a value from a command's output
                    row.update(decision="failed", reason=str(exc))
                except (Transient, *TRANSIENT_ERRORS):
                    raise
                except Exception as exc:  # the action may have taken effect: audited, and its undo kept open
                    log.exception("remediation %s on %s failed unexpectedly", rule.action, plan.target)
                    row.update(decision="failed", reason=f"unexpected {type(exc).__name__}: {str(exc)[:300]}")
                    effect_unknown = True
            opens = None
            if (row["decision"] in ("executed", "dry_run") or effect_unknown) and plan.undo is not None:
                opens = lambda: self.audit.open(con, key, meta["alertname"], rule.action, plan.target,  # noqa: E731
                                                rule.params, plan.undo, row["dry_run"], self.now())
            result = self._finish(con, row, logging.ERROR if row["decision"] == "failed" else logging.INFO, opens)
            if opens is not None:
                self._resolved_meanwhile(con, key, meta, row)
            return result
        except (Transient, *TRANSIENT_ERRORS):
            log.error("remediation decision not recorded (audit store busy): %r", row)
            raise
        finally:
            with self._decide:
                self._running.pop(key[:2], None)
                if lock is not None:
                    self._in_flight -= 1
            if lock is not None:
                lock.release()

    def _resolved_meanwhile(self, con, key, meta: dict, row: dict) -> None:
        """Undo at once the action just opened when its alert's resolve came while it ran (`_resolve` recorded the
        resolve and left the undo to this firing), unless another alert still needs the target. Checked under the
        decision lock, where `_resolve` tells a running firing from one that has ended."""
        with self._decide:
            resolved = self.audit.seen(con, (*key[:2], "resolved"))
            self._running.pop(key[:2], None)
        opened = self.audit.open_action(con, *key[:2]) if resolved else None
        if opened is None or self._still_needed_by(con, opened["target"], meta):
            return  # not resolved; or deferred like any undo, for the last alert on the target to resolve
        undo = {"alert": row["alert"], "fingerprint": row["fingerprint"], "starts_at": row["starts_at"],
                "status": "resolved", "client": row["client"], "action": opened["action"] + ".undo",
                "target": opened["target"], "dry_run": opened["dry_run"]}
        self._undo(con, opened, meta, undo, "its alert resolved while the action ran: ")
        if undo["decision"] in ("executed", "dry_run"):
            self._undo_deferred(con, opened["target"], row["client"])

    def _resolve(self, con, key, meta, row) -> dict:
        with self._decide:
            if self.audit.seen(con, key):
                return _result({**row, "decision": "duplicate", "reason": "already handled"})
            opened = self.audit.open_action(con, meta["fingerprint"], meta["starts_at"])
            if opened is None and key[:2] in self._running:  # its firing's action is still running
                action, target = self._running[key[:2]]
                row.update(action=action + ".undo", target=target, decision="deferred",
                           reason="the firing's action is still running; it is undone as soon as it ends")
                return self._finish(con, row, before=lambda: self.audit.claim(con, key, self.now()))
            if opened is None:
                target = self._held_back(con, meta, row)
                if target is None:
                    self.audit.claim(con, key, self.now())
                    return _result({**row, "decision": "ignored", "reason": "nothing was opened for this alert"})
            else:
                target = opened["target"]
                row.update(action=opened["action"] + ".undo", target=target, dry_run=opened["dry_run"])
                # Undoing now would undo it for the others too (a drained node put back while another alert on it
                # fires): the action stays open, and the last of them to resolve undoes it.
                needed_by = self._still_needed_by(con, target, meta)
                if needed_by:
                    row.update(decision="deferred", reason=f"undo deferred: still needed by {', '.join(needed_by)}")
                    return self._finish(con, row, before=lambda: self.audit.claim(con, key, self.now()))
            lock = self._targets.setdefault(target, threading.Lock())
            if not lock.acquire(blocking=False):
                raise Transient(f"another action on {target} is in progress; retry the resolve later")
            self.audit.claim(con, key, self.now())
        try:
            if opened is None:
                self._undo_deferred(con, target, row["client"])
                return _result({**row, "decision": "ignored", "target": target, "reason": (
                    f"nothing was opened for this alert; the undos it held back on {target} were run")})
            result = self._undo(con, opened, meta, row)
            if row["decision"] in ("executed", "dry_run"):
                self._undo_deferred(con, target, row["client"])
            return result
        finally:
            lock.release()

    def _still_needed_by(self, con, target: str, meta: dict) -> list[str]:
        """Names of the alerts, other than this one, still firing about `target`. One whose own action was refused
        (cooldown, budget, another action in progress) needs the target as much as one whose action was taken:
        the node it fires about must stay drained."""
        this = (meta["fingerprint"], meta["starts_at"])
        return sorted({alert for alert, fingerprint, sent, decided in self.audit.unresolved_firings(con, target)
                       if (fingerprint, sent) != this and parse_rfc3339(sent) == decided})

    def _held_back(self, con, meta: dict, row: dict) -> str | None:
        """The target of an alert that opened nothing, when its resolve is the last one the undos deferred on that
        target waited for; None otherwise."""
        target = self.audit.decided_target(con, meta["fingerprint"], row["starts_at"])
        if target is None or self._still_needed_by(con, target, meta) or not self.audit.deferred_undos(con, target):
            return None
        return target

    def _undo_deferred(self, con, target: str, client: str | None) -> None:
        """The undos deferred while another alert needed `target`, now that none does; the newest action first,
        so that each undo finds the state its action left."""
        for opened in self.audit.deferred_undos(con, target):
            meta = {"alertname": opened["alert"], "fingerprint": opened["fingerprint"],
                    "starts_at": opened["starts_at"]}
            row = {"alert": opened["alert"], "fingerprint": opened["fingerprint"],
                   "starts_at": parse_rfc3339(opened["starts_at"]), "status": "resolved", "client": client,
                   "action": opened["action"] + ".undo", "target": target, "dry_run": opened["dry_run"]}
            self._undo(con, opened, meta, row, "deferred undo, no firing alert needs the target now: ")

    def _undo(self, con, opened: dict, meta: dict, row: dict, why: str = "") -> dict:
        """Undo what `opened` did (only recorded for a dry-run action), audited; the action is closed unless its
        undo could not be planned or failed."""
        action = REGISTRY[opened["action"]]
        try:
            plan = action.undo(opened["undo"], opened["params"], self._ctx(con, meta))
        except Refused as exc:
            row.update(decision="refused", reason=f"{why}cannot undo: {exc}")
            return self._finish(con, row, logging.ERROR)
        row["params"] = plan.details
        if opened["dry_run"]:
            row.update(decision="dry_run", reason="would undo; the action was a dry run")
        else:
            self._run_undo(plan, opened, row)
        row["reason"] = why + row["reason"]
        closes = None
        if row["decision"] != "failed":
            closes = lambda: self.audit.close(con, meta["fingerprint"], meta["starts_at"], self.now())  # noqa
        return self._finish(con, row, logging.ERROR if row["decision"] == "failed" else logging.INFO, closes)

    @staticmethod
    def _run_undo(plan, opened: dict, row: dict) -> None:
        try:
            row.update(decision="executed", reason=str(plan.execute())[:500] or "done")
        except ActionFailed as exc:
            row.update(decision="failed", reason=f"undo failed, the action stays open: {exc}")
        except (Transient, *TRANSIENT_ERRORS):
            raise
        except Exception as exc:
            log.exception("undo of %s on %s failed unexpectedly", opened["action"], opened["target"])
            row.update(decision="failed", reason=f"undo failed unexpectedly, the action stays open: "
                                                 f"{type(exc).__name__}: {str(exc)[:300]}")


def _result(row: dict) -> dict:
    return {"alert": row["alert"], "fingerprint": row["fingerprint"], "status": row["status"],
            "action": row.get("action"), "target": row.get("target"), "decision": row["decision"],
            "reason": row.get("reason")}
