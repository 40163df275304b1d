-- One tier's latency percentile per (service, node) and SLI step, as the report charts it beside the objective.
SELECT service,
       node,
       time_bucket(to_seconds($step_s), start_time) AS window_start,
       quantile_cont(duration_ms, $quantile) AS latency_ms
FROM requests
WHERE tier = $tier AND start_time >= $since AND start_time < $until
GROUP BY ALL
ORDER BY service, node, window_start
