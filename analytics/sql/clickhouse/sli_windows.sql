-- One tier's SLI per (service, node) and step, as analytics/sql/sli_windows.sql computes it: windows aligned as
-- DuckDB's time_bucket aligns them (from 2000-01-03); the requests relation reads only [since, until).
SELECT service,
       node,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS window_start,
       toInt64(count()) AS requests,
       toInt64(countIf(failed)) AS failures,
       toInt64(countIf(duration_ms > {threshold_ms:Float64})) AS slow
FROM {{requests}}
WHERE tier = {tier:String}
GROUP BY service, node, window_start
