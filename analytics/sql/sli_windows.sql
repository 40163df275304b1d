-- Every tier's SLI per (service, node) and step in one pass over the requests it is judged on (judged_requests.sql):
-- requests, failures, and requests slower than their threshold (a service's own, $service_thresholds_ms for
-- 'TIER SERVICE' in $service_keys, else its tier's, $thresholds_ms in the order of $tiers; what the test reads,
-- while the percentile people are shown is window_latencies.sql). Requests of a tier not in $tiers are left out.
-- An inference tier's token objectives (ttft, tpot, queue) count the requests that give that time and those over its
-- threshold ($ttft_thresholds_ms ... in the order of $tiers; infinite where the tier has no such objective).
SELECT tier,
       service,
       node,
       time_bucket(to_seconds($step_s), start_time) AS window_start,
       count(*) AS requests,
       count(*) FILTER (WHERE failed) AS failures,
       count(*) FILTER (WHERE duration_ms > coalesce(
           $service_thresholds_ms[list_position($service_keys, tier || ' ' || service)],
           $thresholds_ms[list_position($tiers, tier)])) AS slow,
       count(ttft_ms) AS ttft_requests,
       count(*) FILTER (WHERE ttft_ms > $ttft_thresholds_ms[list_position($tiers, tier)]) AS ttft_slow,
       count(tpot_ms) AS tpot_requests,
       count(*) FILTER (WHERE tpot_ms > $tpot_thresholds_ms[list_position($tiers, tier)]) AS tpot_slow,
       count(queue_ms) AS queue_requests,
       count(*) FILTER (WHERE queue_ms > $queue_thresholds_ms[list_position($tiers, tier)]) AS queue_slow
FROM {{judged_requests}}
WHERE list_contains($tiers, tier)
GROUP BY ALL
