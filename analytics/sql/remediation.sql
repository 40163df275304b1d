-- Remediation state, created by alerts/ (alerts/remediation.py) in the same DuckDB file as the store.
-- Times are UTC. JSON columns hold JSON text.

-- Every remediation decision: executed, dry_run, refused (and why), failed (and why). Undo steps, run when an
-- alert resolves, have action '<action>.undo'. Append-only.
CREATE TABLE IF NOT EXISTS remediation_audit (
    ts          TIMESTAMP NOT NULL,
    alert       VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    starts_at   TIMESTAMP,
    action      VARCHAR,
    target      VARCHAR,
    params      VARCHAR,           -- JSON
    decision    VARCHAR NOT NULL,
    reason      VARCHAR
);

-- Alertmanager notifications already acted on, so that a re-sent group acts once: (fingerprint, startsAt as
-- sent, firing|resolved).
CREATE TABLE IF NOT EXISTS remediation_deliveries (
    fingerprint VARCHAR NOT NULL,
    starts_at   VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    ts          TIMESTAMP NOT NULL,
    PRIMARY KEY (fingerprint, starts_at, status)
);

-- Actions a firing alert opened, closed (undone) when that alert resolves. params: the action's configured
-- parameters at the time (so a config change cannot strand an open action); undo: what the undo needs.
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
