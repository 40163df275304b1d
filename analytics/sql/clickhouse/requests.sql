-- The requests of analytics/sql/schema.sql, read from the exporter's otel_traces: server_spans.sql's spans started in
-- [since, until), a span stored twice (a retried batch, a file loaded again) once, as the DuckDB store keeps it
-- once. Its copies share their node and service, which lead the deduplication's key so that a query's filter on
-- them is applied before it (ClickHouse moves a filter through LIMIT BY only on its key): one node's incident reads
-- one node's spans. Parameters: allowed_tiers, default_tier, since, until.
-- Inlined by the queries of this folder where they name it in double braces.
SELECT *
FROM {{server_spans}}
LIMIT 1 BY node, service, trace_id, span_id
