-- sloscope's rollups of the exporter's tables (analytics/rollups.py): per chunk of time, one batch of a query's
-- rows and, written after them, a header row naming the source rows they were computed from. The columns before
-- `computed` are every batch's; the others are the query's rows (a header leaves them at their defaults). A day's
-- chunks are dropped whole 8 days after it (ttl_only_drop_parts), and analytics/rollups.py reads none that old.
-- Statements are separated by a line holding only ";".
CREATE TABLE IF NOT EXISTS sloscope_sli_rollup (
    parameters Int64,
    chunk_start DateTime64(6, 'UTC'),
    batch Int64,
    header Bool DEFAULT false,
    source_rows Int64 DEFAULT 0,
    source_digest Int64 DEFAULT 0,
    computed DateTime DEFAULT now(),
    tier LowCardinality(String) DEFAULT '',
    service LowCardinality(String) DEFAULT '',
    node LowCardinality(String) DEFAULT '',
    window_start DateTime64(6, 'UTC') DEFAULT chunk_start,
    requests Int64 DEFAULT 0,
    failures Int64 DEFAULT 0,
    slow Int64 DEFAULT 0,
    ttft_requests Int64 DEFAULT 0,
    ttft_slow Int64 DEFAULT 0,
    tpot_requests Int64 DEFAULT 0,
    tpot_slow Int64 DEFAULT 0,
    queue_requests Int64 DEFAULT 0,
    queue_slow Int64 DEFAULT 0
) ENGINE = MergeTree
PARTITION BY toDate(chunk_start)
ORDER BY (parameters, chunk_start, batch)
TTL toDateTime(chunk_start) + INTERVAL 8 DAY
SETTINGS ttl_only_drop_parts = 1
;
CREATE TABLE IF NOT EXISTS sloscope_step_rollup (
    parameters Int64,
    chunk_start DateTime64(6, 'UTC'),
    batch Int64,
    header Bool DEFAULT false,
    source_rows Int64 DEFAULT 0,
    source_digest Int64 DEFAULT 0,
    computed DateTime DEFAULT now(),
    series Int64 DEFAULT 0,
    node_key Int64 DEFAULT 0,
    metric_key Int64 DEFAULT 0,
    step DateTime64(6, 'UTC') DEFAULT chunk_start,
    value Float64 DEFAULT 0
) ENGINE = MergeTree
PARTITION BY toDate(chunk_start)
ORDER BY (parameters, chunk_start, batch, node_key)
TTL toDateTime(chunk_start) + INTERVAL 8 DAY
SETTINGS ttl_only_drop_parts = 1
;
-- A table made before the token objectives gains their columns.
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS ttft_requests Int64 DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS ttft_slow Int64 DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS tpot_requests Int64 DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS tpot_slow Int64 DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS queue_requests Int64 DEFAULT 0
;
ALTER TABLE sloscope_sli_rollup ADD COLUMN IF NOT EXISTS queue_slow Int64 DEFAULT 0
