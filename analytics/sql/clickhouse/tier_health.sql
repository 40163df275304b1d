-- analytics/sql/tier_health.sql over the exporter's otel_traces: per tier over [since, until), requests, failures
-- and the latency percentile {quantile}, interpolated as quantile_cont does.
SELECT tier, toInt64(count()) AS requests, toInt64(countIf(failed)) AS failures,
       quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms
FROM {{requests}}
GROUP BY tier
