-- analytics/sql/token_totals.sql over the exporter's otel_traces: token timings per measure, tier, service, node and
-- bucket (the number of the measure's bounds below the time), with their seconds, of each measure's first
-- {max_series} label sets (tier, service, node) in their order only; `label_sets` counts a measure's all.
SELECT measure, tier, service, node,
       toInt64(arrayCount(b -> b < ms, multiIf(measure = 'ttft', {ttft_bounds_ms:Array(Float64)},
                                               measure = 'tpot', {tpot_bounds_ms:Array(Float64)},
                                               {queue_bounds_ms:Array(Float64)}))) AS bucket,
       toInt64(count()) AS requests,
       sum(ms) / 1000.0 AS seconds,
       any(counted.label_sets) AS label_sets
FROM {{token_timings}} AS timed
JOIN (SELECT measure, toInt64(uniqExact(tier, service, node)) AS label_sets FROM {{token_timings}} GROUP BY measure)
    AS counted USING (measure)
WHERE (measure, tier, service, node) IN (
    SELECT DISTINCT measure, tier, service, node FROM {{token_timings}}
    ORDER BY measure, tier, service, node LIMIT {max_series:UInt64} BY measure
)
GROUP BY measure, tier, service, node, bucket
ORDER BY measure, tier, service, node, bucket
