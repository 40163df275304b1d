-- One tier's percentile of the time {measure} (the duration, or a token time) per (service, node) and SLI step, and per service on more than one node (the
-- node {unknown_node} not counted) over all its nodes as node {every_node}, as analytics/sql/window_latencies.sql
-- computes them: windows aligned as sli_windows.sql aligns them, the percentile interpolated as quantile_cont does.
WITH judged AS (
    SELECT service, node,
           multiIf({measure:String} = 'ttft', ttft_ms, {measure:String} = 'tpot', tpot_ms,
                   {measure:String} = 'queue', queue_ms, duration_ms) AS duration_ms,
           fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time)
                                    - 946857600000000, toInt64(round({step_s:Float64} * 1e6)))
                                    * toInt64(round({step_s:Float64} * 1e6))), 'UTC') AS window_start
    FROM {{judged_requests}}
    WHERE tier = {tier:String}
)
SELECT * FROM (
    SELECT service, node, window_start, quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms
    FROM judged
    GROUP BY service, node, window_start
    UNION ALL
    SELECT service, {every_node:String} AS node, window_start,
           quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms
    FROM judged
    WHERE service IN (SELECT service FROM judged GROUP BY service
                      HAVING uniqExactIf(node, node != {unknown_node:String}) > 1)
    GROUP BY service, window_start
)
ORDER BY service, node, window_start
