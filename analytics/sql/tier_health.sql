-- Per tier (taken again by the spec in force) over [since, until): requests, failures, and the latency
-- percentile $quantile interpolated between ranks.
SELECT CASE WHEN list_contains($allowed_tiers, tier) THEN tier ELSE $default_tier END AS tier,
       count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       quantile_cont(duration_ms, $quantile) AS latency_ms
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
