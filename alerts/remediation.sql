-- Remediation state, created by alerts/ (alerts/remediation.py) in the same DuckDB file as the store.
-- Times are UTC. JSON columns hold JSON text.

-- Every remediation decision: executed, dry_run, refused (and why), failed (and why), deferred (an undo waiting
-- for the other alerts that still need its target). Undo steps, run when an alert resolves, have action
-- '<action>.undo'. Webhook requests refused before their alerts are handled have fingerprint '' and alert
-- '(unauthenticated)' (a batch of requests without a valid token, at most one row every few seconds), or the
-- group's alert name, else '(group)'. Append-only.
CREATE TABLE IF NOT EXISTS remediation_audit (
    ts          TIMESTAMP NOT NULL,
    alert       VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    starts_at   TIMESTAMP,
    action      VARCHAR,
    target      VARCHAR,
    params      VARCHAR,           -- JSON
    decision    VARCHAR NOT NULL,
    reason      VARCHAR,
    client      VARCHAR,           -- address the webhook request came from (a batch: its first few, ", ..." for more)
    dry_run     BOOLEAN            -- decided under a dry-run config: execute off, or the alert's rule dry_run;
                                   -- for an undo, whether the action undone was a dry run
);
-- An audit table of an older sloscope gets the columns added since (NULL in its earlier rows). Here rather than in
-- a store migration: the engine keeps these tables in any file --db names, which need not be a versioned store.
ALTER TABLE remediation_audit ADD COLUMN IF NOT EXISTS client VARCHAR;
ALTER TABLE remediation_audit ADD COLUMN IF NOT EXISTS dry_run BOOLEAN;

-- Alertmanager notifications already acted on, so that a re-sent group acts once: (fingerprint, startsAt as
-- sent, firing|resolved).
CREATE TABLE IF NOT EXISTS remediation_deliveries (
    fingerprint VARCHAR NOT NULL,
    starts_at   VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    ts          TIMESTAMP NOT NULL,
    PRIMARY KEY (fingerprint, starts_at, status)
);

-- Actions a firing alert opened, closed (undone) when that alert resolves; while another alert about the same
-- target still fires (its own action taken or refused), the undo is deferred (the row stays open, its resolve recorded in
-- remediation_deliveries) until the last of them resolves. params: the action's configured parameters at the
-- time (so a config change cannot strand an open action); undo: what the undo needs.
CREATE TABLE IF NOT EXISTS remediation_open (
    fingerprint VARCHAR NOT NULL,
    starts_at   VARCHAR NOT NULL,
    alert       VARCHAR NOT NULL,
    action      VARCHAR NOT NULL,
    target      VARCHAR NOT NULL,
    params      VARCHAR NOT NULL,  -- JSON
    undo        VARCHAR NOT NULL,  -- JSON
    dry_run     BOOLEAN NOT NULL,
    opened_at   TIMESTAMP NOT NULL,
    closed_at   TIMESTAMP,
    PRIMARY KEY (fingerprint, starts_at)
);

-- Trace sampling overrides for the sampling policy: while until > now, keep `ratio` of the tier's traces
-- (the highest active ratio of a tier wins).
CREATE TABLE IF NOT EXISTS sampling_overrides (
    tier        VARCHAR NOT NULL,
    ratio       DOUBLE NOT NULL,
    until       TIMESTAMP NOT NULL,
    created_at  TIMESTAMP NOT NULL,
    alert       VARCHAR,
    fingerprint VARCHAR,
    starts_at   VARCHAR
);
