-- analytics/sql/request_totals.sql over the exporter's otel_traces: requests per tier, service, node and latency
-- bucket (the number of bounds below the duration), with their seconds and failures, of the first {max_series} label
-- sets (tier, service, node) in their order only; `label_sets` counts them all.
SELECT tier, service, node,
       toInt64(arrayCount(b -> b < duration_ms, {bounds_ms:Array(Float64)})) AS bucket,
       toInt64(count()) AS requests,
       sum(duration_ms) / 1000.0 AS seconds,
       toInt64(countIf(failed)) AS failed,
       toInt64((SELECT uniqExact(tier, service, node) FROM {{requests}})) AS label_sets
FROM {{requests}}
WHERE (tier, service, node) IN (
    SELECT DISTINCT tier, service, node FROM {{requests}} ORDER BY tier, service, node LIMIT {max_series:UInt64}
)
GROUP BY tier, service, node, bucket
ORDER BY tier, service, node, bucket
