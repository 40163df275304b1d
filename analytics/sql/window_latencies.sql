-- One tier's percentile of the time $measure (the duration, or a token time: ttft, tpot, queue) per (service, node)
-- and SLI step, as the report charts it beside the objective: of the requests the tier is judged on
-- (judged_requests.sql); and per service on more than one node over all its nodes, as node $every_node, as its
-- SLI is judged too (analytics/slo.py; $unknown_node is no node of its own).
WITH judged AS (
    SELECT service, node, time_bucket(to_seconds($step_s), start_time) AS window_start,
           CASE $measure WHEN 'ttft' THEN ttft_ms WHEN 'tpot' THEN tpot_ms WHEN 'queue' THEN queue_ms
                         ELSE duration_ms END AS duration_ms
    FROM {{judged_requests}}
    WHERE tier = $tier
)
SELECT service, node, window_start, quantile_cont(duration_ms, $quantile) AS latency_ms
FROM judged
GROUP BY ALL
UNION ALL
SELECT service, $every_node AS node, window_start, quantile_cont(duration_ms, $quantile) AS latency_ms
FROM judged
WHERE service IN (SELECT service FROM judged GROUP BY service
                  HAVING count(DISTINCT node) FILTER (WHERE node <> $unknown_node) > 1)
GROUP BY ALL
ORDER BY service, node, window_start
