-- One tier's latency percentile per (service, node) and SLI step, as the report charts it beside the objective: of
-- the requests the tier is judged on (judged_requests.sql).
SELECT service,
       node,
       time_bucket(to_seconds($step_s), start_time) AS window_start,
       quantile_cont(duration_ms, $quantile) AS latency_ms
FROM {{judged_requests}}
WHERE tier = $tier
GROUP BY ALL
ORDER BY service, node, window_start
