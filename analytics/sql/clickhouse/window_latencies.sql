-- One tier's latency percentile per (service, node) and SLI step, as analytics/sql/window_latencies.sql computes it:
-- windows aligned as sli_windows.sql aligns them, the percentile interpolated as quantile_cont does.
SELECT service,
       node,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS window_start,
       quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms
FROM {{judged_requests}}
WHERE tier = {tier:String}
GROUP BY service, node, window_start
ORDER BY service, node, window_start
