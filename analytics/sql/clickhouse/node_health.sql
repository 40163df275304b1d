-- analytics/sql/node_health.sql over the exporter's otel_traces: per node over [since, until), requests and
-- failures.
SELECT node, toInt64(count()) AS requests, toInt64(countIf(failed)) AS failures
FROM {{requests}}
GROUP BY node
