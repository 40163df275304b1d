-- The SLI over each incident of tier $tier: requests, failures, and of the time $measure (the duration, or a token
-- time: ttft, tpot, queue) the requests that give it, those over the incident's threshold and its percentile, of
-- the requests the tier is judged on (judged_requests.sql) of its service and node started in [start, end). The incidents are given place by place in $services, $nodes, $starts,
-- $ends and $incident_thresholds_ms; `incident` is the place (from 1). An incident on $every_node is its service's on
-- every node.
WITH incidents AS (
    SELECT unnest($services) AS service, unnest($nodes) AS node, unnest($starts) AS incident_start,
           unnest($ends) AS incident_end, unnest($incident_thresholds_ms) AS threshold_ms,
           unnest(range(1, len($services) + 1)) AS incident
)
SELECT incidents.incident,
       count(requests.start_time) AS requests,
       count(*) FILTER (WHERE requests.failed) AS failures,
       count(requests.measured_ms) AS judged,
       count(*) FILTER (WHERE requests.measured_ms > incidents.threshold_ms) AS slow,
       quantile_cont(requests.measured_ms, $quantile) AS percentile_ms
FROM incidents
LEFT JOIN (
    SELECT *, CASE $measure WHEN 'ttft' THEN ttft_ms WHEN 'tpot' THEN tpot_ms WHEN 'queue' THEN queue_ms
                            ELSE duration_ms END AS measured_ms
    FROM {{judged_requests start end}}
) AS requests
       ON requests.tier = $tier AND requests.service = incidents.service
      AND (incidents.node = $every_node OR requests.node = incidents.node)
      AND requests.start_time >= incidents.incident_start AND requests.start_time < incidents.incident_end
GROUP BY incidents.incident
