-- The SLI over each incident of tier $tier: requests, failures, slow requests (over the incident's threshold, its
-- service's) and the tier's latency percentile, of the requests the tier is judged on (judged_requests.sql) of its
-- service and node started in [start, end). The incidents are given place by place in $services, $nodes, $starts,
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
       count(*) FILTER (WHERE requests.duration_ms > incidents.threshold_ms) AS slow,
       quantile_cont(requests.duration_ms, $quantile) AS latency_ms
FROM incidents
LEFT JOIN {{judged_requests start end}} AS requests
       ON requests.tier = $tier AND requests.service = incidents.service
      AND (incidents.node = $every_node OR requests.node = incidents.node)
      AND requests.start_time >= incidents.incident_start AND requests.start_time < incidents.incident_end
GROUP BY incidents.incident
