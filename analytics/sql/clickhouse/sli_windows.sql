-- Every tier's SLI per (service, node) and step in one pass over the requests, as analytics/sql/sli_windows.sql
-- computes it: windows aligned as DuckDB's time_bucket aligns them (from 2000-01-03); the requests relation reads
-- only [since, until).
SELECT tier,
       service,
       node,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS window_start,
       toInt64(count()) AS requests,
       toInt64(countIf(failed)) AS failures,
       toInt64(countIf(duration_ms > {thresholds_ms:Array(Float64)}[indexOf({tiers:Array(String)}, tier)])) AS slow
FROM {{requests}}
WHERE has({tiers:Array(String)}, tier)
GROUP BY tier, service, node, window_start
