-- Requests kept on the unknown node that name their pod (by name or by IP) and started at or after $2: those that
-- a pod known since may place (analytics/late_placement.py). $1: the unknown node's name.
SELECT trace_hi, trace_lo, span_id, CAST(NULL AS VARCHAR) AS node, namespace, pod, pod_ip, start_time
FROM requests
WHERE node = $1 AND start_time >= $2 AND (pod IS NOT NULL OR pod_ip IS NOT NULL)
