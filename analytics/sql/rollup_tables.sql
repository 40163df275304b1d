-- sloscope's rollups (analytics/rollups.py): per chunk of time, one batch of a query's rows and a header row naming
-- the source rows they were computed from, written in one transaction. The columns before `computed` are every
-- batch's; the others are the query's rows (a header leaves them at their defaults). Retention deletes a chunk's
-- rollups with its rows. Statements are separated by a line holding only ";".
CREATE TABLE IF NOT EXISTS sloscope_sli_rollup (
    parameters    BIGINT NOT NULL,
    chunk_start   TIMESTAMP NOT NULL,
    batch         BIGINT NOT NULL,
    header        BOOLEAN NOT NULL DEFAULT false,
    source_rows   BIGINT NOT NULL DEFAULT 0,
    source_digest BIGINT NOT NULL DEFAULT 0,
    computed      TIMESTAMPTZ NOT NULL DEFAULT now(),
    tier          VARCHAR NOT NULL DEFAULT '',
    service       VARCHAR NOT NULL DEFAULT '',
    node          VARCHAR NOT NULL DEFAULT '',
    window_start  TIMESTAMP,
    requests      BIGINT NOT NULL DEFAULT 0,
    failures      BIGINT NOT NULL DEFAULT 0,
    slow          BIGINT NOT NULL DEFAULT 0,
    ttft_requests BIGINT NOT NULL DEFAULT 0,
    ttft_slow     BIGINT NOT NULL DEFAULT 0,
    tpot_requests BIGINT NOT NULL DEFAULT 0,
    tpot_slow     BIGINT NOT NULL DEFAULT 0,
    queue_requests BIGINT NOT NULL DEFAULT 0,
    queue_slow    BIGINT NOT NULL DEFAULT 0
)
;
CREATE TABLE IF NOT EXISTS sloscope_step_rollup (
    parameters    BIGINT NOT NULL,
    chunk_start   TIMESTAMP NOT NULL,
    batch         BIGINT NOT NULL,
    header        BOOLEAN NOT NULL DEFAULT false,
    source_rows   BIGINT NOT NULL DEFAULT 0,
    source_digest BIGINT NOT NULL DEFAULT 0,
    computed      TIMESTAMPTZ NOT NULL DEFAULT now(),
    series        UBIGINT NOT NULL DEFAULT 0,
    node_key      UBIGINT NOT NULL DEFAULT 0,
    metric_key    UBIGINT NOT NULL DEFAULT 0,
    step          TIMESTAMP,
    value         DOUBLE NOT NULL DEFAULT 0
)
;
-- A table made before the token objectives gains their columns (DuckDB adds no NOT NULL column to a table).
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS ttft_requests BIGINT DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS ttft_slow BIGINT DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS tpot_requests BIGINT DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS tpot_slow BIGINT DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS queue_requests BIGINT DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS queue_slow BIGINT DEFAULT 0
