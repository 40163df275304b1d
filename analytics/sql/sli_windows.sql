-- One tier's SLI per (service, node) and step: requests, failures, and requests slower than the tier's threshold
-- (what the test reads; the percentile people are shown is window_latencies.sql).
SELECT service,
       node,
       time_bucket(to_seconds($step_s), start_time) AS window_start,
       count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       count(*) FILTER (WHERE duration_ms > $threshold_ms) AS slow
FROM requests
WHERE tier = $tier AND start_time >= $since AND start_time < $until
GROUP BY ALL
