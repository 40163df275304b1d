-- ClickHouse expires rows with the exporter's ttl, in the engine, and keeps no count of them (see docs/clickhouse.md's
-- retention section): nothing retired to add, in retired_token_totals.sql's columns.
SELECT '' AS measure, '' AS tier, '' AS service, '' AS node, 0.0 AS bound_ms, toInt64(0) AS requests, 0.0 AS seconds
WHERE 0
