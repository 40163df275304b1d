-- Per tier (taken again by the spec in force) over [since, until): requests, failures, and the percentile
-- $quantile, interpolated between ranks, of the latency and of each token time (of the requests that give it).
SELECT CASE WHEN list_contains($allowed_tiers, tier) THEN tier ELSE $default_tier END AS tier,
       count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       quantile_cont(duration_ms, $quantile) AS latency_ms,
       quantile_cont(ttft_ms, $quantile) AS ttft_ms,
       quantile_cont(tpot_ms, $quantile) AS tpot_ms,
       quantile_cont(queue_ms, $quantile) AS queue_ms
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
