-- analytics/sql/tier_health.sql over the exporter's otel_traces: per tier over [since, until), requests, failures
-- and the percentile {quantile} of the latency and of each token time, interpolated as quantile_cont does.
SELECT tier, toInt64(count()) AS requests, toInt64(countIf(failed)) AS failures,
       quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms,
       quantileExactInclusive({quantile:Float64})(ttft_ms) AS ttft_ms,
       quantileExactInclusive({quantile:Float64})(tpot_ms) AS tpot_ms,
       quantileExactInclusive({quantile:Float64})(queue_ms) AS queue_ms
FROM {{requests}}
GROUP BY tier
