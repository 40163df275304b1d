-- The SLI over a whole incident: requests, failures, slow requests and the tier's latency percentile, of
-- the requests started in [start, end).
SELECT toInt64(count()) AS requests,
       toInt64(countIf(failed)) AS failures,
       toInt64(countIf(duration_ms > {threshold_ms:Float64})) AS slow,
       quantileExactInclusive({quantile:Float64})(duration_ms) AS latency_ms
FROM {{requests start end}}
WHERE tier = {tier:String} AND service = {service:String} AND node = {node:String}
