-- Every tier's SLI per (service, node) and step in one pass over the requests: requests, failures, and requests
-- slower than their tier's threshold ($thresholds_ms, in the order of $tiers; what the test reads, while the
-- percentile people are shown is window_latencies.sql). Requests of a tier not in $tiers are left out.
SELECT tier,
       service,
       node,
       time_bucket(to_seconds($step_s), start_time) AS window_start,
       count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       count(*) FILTER (WHERE duration_ms > $thresholds_ms[list_position($tiers, tier)]) AS slow
FROM requests
WHERE list_contains($tiers, tier) AND start_time >= $since AND start_time < $until
GROUP BY ALL
