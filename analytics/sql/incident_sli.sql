-- The SLI over a whole incident: the tier's latency percentile and error ratio of its requests.
SELECT count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       quantile_cont(duration_ms, $quantile) AS latency_ms
FROM requests
WHERE tier = $tier AND service = $service AND node = $node AND start_time >= $start AND start_time < $end
