-- The SLI over a whole incident: requests, failures, slow requests and the tier's latency percentile.
SELECT count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       count(*) FILTER (WHERE duration_ms > $threshold_ms) AS slow,
       quantile_cont(duration_ms, $quantile) AS latency_ms
FROM requests
WHERE tier = $tier AND service = $service AND node = $node AND start_time >= $start AND start_time < $end
