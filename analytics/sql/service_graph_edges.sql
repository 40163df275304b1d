-- The calls of the service graph over [since, until) (analytics/graph.py service_graph): per calling service and
-- the service it called (that of the SERVER or CONSUMER span that answered the call, the earliest where several
-- did; else the peer the call names; else $uninstrumented), the calls, their mean duration and failed share, and
-- the mean network gap of the answered ones: the call's duration less its answer's, never below zero.
WITH spans AS (SELECT * FROM {{trace_spans}}),
answers AS (
    SELECT trace, parent_id, arg_min(service, start_time) AS callee, arg_min(duration_ms, start_time) AS answer_ms
    FROM spans
    WHERE kind IN (2, 5)
    GROUP BY trace, parent_id
)
SELECT c.service AS source, coalesce(a.callee, nullif(c.peer, ''), $uninstrumented) AS target,
       count(*) AS calls, avg(c.duration_ms) AS mean_ms, avg(c.failed::DOUBLE) AS error_ratio,
       avg(greatest(c.duration_ms - a.answer_ms, 0.0)) FILTER (WHERE a.callee IS NOT NULL) AS network_gap_ms
FROM spans c
LEFT JOIN answers a ON a.trace = c.trace AND a.parent_id = c.span_id
WHERE c.kind IN (3, 4)
GROUP BY source, target
ORDER BY source, target
