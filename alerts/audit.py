"""The remediation tables (alerts/remediation.sql) in a DuckDB database: the audit of every decision, the
deliveries already acted on, and the actions open until their alert resolves.

The tables live beside the store's but outside its versioned schema: the engine creates them in whatever file
`--db` names (a standalone webhook's file may never have been a store), so it also brings an older audit table
up to date there, with the idempotent statements of remediation.sql, at its first session.
"""

from __future__ import annotations

import contextlib
import json
import threading
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Callable

import duckdb

from sloscope.alerts.actions import NOTIFY

COUNTED = ("executed", "dry_run", "failed")  # decisions that use up cooldown and budget
AUDIT_COLUMNS = ("ts", "alert", "fingerprint", "starts_at", "action", "target", "params", "decision", "reason",
                 "client", "dry_run")
TRANSIENT_ERRORS = (duckdb.IOException, duckdb.TransactionException, duckdb.ConnectionException)


class Transient(RuntimeError):
    """The audit store is busy or unavailable: nothing (more) was done; the sender should retry."""


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


def schema() -> str:
    """The statements of remediation.sql: they create the remediation tables, or bring older ones up to date."""
    return resources.files("sloscope.alerts").joinpath("remediation.sql").read_text()


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


# A resolved alert whose action is still open: its undo waits for the alerts that still need the target.
_RESOLVED = ("EXISTS (SELECT 1 FROM remediation_deliveries d WHERE d.fingerprint = o.fingerprint "
             "AND d.starts_at = o.starts_at AND d.status = 'resolved')")


class AuditStore:
    """The remediation tables in a DuckDB database. `connect()` gives a connection per use: a new connection to a
    file (`AuditStore.at(path)`, which lets other processes use the file in between), or a cursor of an open
    store's connection (`AuditStore(store.cursor)`, when running inside `sloscope serve`)."""

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
        except TRANSIENT_ERRORS as exc:
            raise Transient(f"audit store unavailable: {exc}") from None
        try:
            if not self._schema_ready:
                with self._schema_lock:
                    if not self._schema_ready:
                        con.execute(schema())
                        self._schema_ready = True
            yield con
        except TRANSIENT_ERRORS as exc:
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
        rows = self._open_actions(con, "o.fingerprint = ? AND o.starts_at = ?", [fingerprint, starts_at])
        return rows[0] if rows else None

    def unresolved_firings(self, con, target: str) -> list[tuple[str, str, str, datetime]]:
        """(alert, fingerprint, startsAt as sent, startsAt as audited) of the firing deliveries not resolved yet
        of each alert with a firing decision about `target`, whatever the decision (acted on, or refused for the
        cooldown, the budget or another action in progress). The audit holds startsAt parsed and the deliveries
        as sent, so the caller tells which delivery was the one decided (a fingerprint fires again with another
        startsAt)."""
        return con.execute(
            "SELECT DISTINCT a.alert, d.fingerprint, d.starts_at, a.starts_at FROM remediation_audit a "
            "JOIN remediation_deliveries d ON d.fingerprint = a.fingerprint AND d.status = 'firing' "
            "WHERE a.target = ? AND a.action NOT LIKE '%.undo' AND NOT EXISTS (SELECT 1 FROM remediation_deliveries "
            "r WHERE r.fingerprint = d.fingerprint AND r.starts_at = d.starts_at AND r.status = 'resolved')",
            [target]).fetchall()

    def decided_target(self, con, fingerprint: str, starts_at: datetime) -> str | None:
        """The target the firing of this alert was decided about (None: refused before it had one)."""
        row = con.execute("SELECT target FROM remediation_audit WHERE fingerprint = ? AND starts_at = ? "
                          "AND target IS NOT NULL AND action NOT LIKE '%.undo' LIMIT 1",
                          [fingerprint, starts_at]).fetchone()
        return row[0] if row else None

    def deferred_undos(self, con, target: str) -> list[dict]:
        """Open actions on `target` whose alerts have resolved (their undo deferred), the newest first."""
        return self._open_actions(con, f"o.target = ? AND {_RESOLVED}", [target], "ORDER BY o.opened_at DESC")

    def _open_actions(self, con, where: str, params: list, order: str = "") -> list[dict]:
        rows = con.execute(
            "SELECT o.fingerprint, o.starts_at, o.alert, o.action, o.target, o.params, o.undo, o.dry_run "
            f"FROM remediation_open o WHERE o.closed_at IS NULL AND {where} {order}", params).fetchall()
        return [{"fingerprint": fingerprint, "starts_at": starts_at, "alert": alert, "action": action,
                 "target": target, "params": json.loads(params), "undo": json.loads(undo), "dry_run": dry_run}
                for fingerprint, starts_at, alert, action, target, params, undo, dry_run in rows]

    # writes
    def claim(self, con, key, now: datetime) -> None:
        con.execute("INSERT OR IGNORE INTO remediation_deliveries (fingerprint, starts_at, status, ts) "
                    "VALUES (?, ?, ?, ?)", [*key, now])

    def audit(self, con, row: dict) -> None:
        values = {**row, "params": json.dumps(row.get("params") or {}, sort_keys=True, default=str)}
        con.execute(_insert("remediation_audit", AUDIT_COLUMNS), [values.get(c) for c in AUDIT_COLUMNS])

    def open(self, con, key, alert, action, target, params, undo, dry_run, now) -> None:
        con.execute("INSERT OR REPLACE INTO remediation_open (fingerprint, starts_at, alert, action, target, params, "
                    "undo, dry_run, opened_at, closed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)", [
                        key[0], key[1], alert, action, target, json.dumps(params, sort_keys=True), json.dumps(undo),
                        dry_run, now])

    def prune(self, con, before: datetime) -> int:
        """Delete the decisions, deliveries, undone actions and ended sampling overrides older than `before`; the
        decisions deleted. Actions still open stay, however old: their undo needs them."""
        with transaction(con):
            (removed,), = con.execute("DELETE FROM remediation_audit WHERE ts < ?", [before]).fetchall()
            con.execute("DELETE FROM remediation_deliveries WHERE ts < ?", [before])
            con.execute("DELETE FROM remediation_open WHERE closed_at < ?", [before])
            con.execute("DELETE FROM sampling_overrides WHERE until < ?", [before])
        return removed

    def close(self, con, fingerprint, starts_at, now) -> None:
        con.execute("UPDATE remediation_open SET closed_at = ? WHERE fingerprint = ? AND starts_at = ?",
                    [now, fingerprint, starts_at])
