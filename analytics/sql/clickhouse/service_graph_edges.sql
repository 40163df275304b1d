-- analytics/sql/service_graph_edges.sql over the exporter's otel_traces (trace_spans.sql): per calling service and
-- the service it called (the earliest answer's, else the peer named, else {uninstrumented}), the calls, their mean
-- duration and failed share, and the mean network gap of the answered ones.
-- Parameters: those of trace_spans.sql, uninstrumented.
WITH answers AS (
    SELECT trace, parent_id, argMin(service, start_time) AS callee, argMin(duration_ms, start_time) AS answer_ms
    FROM {{trace_spans}}
    WHERE kind IN (2, 5)
    GROUP BY trace, parent_id
)
SELECT c.service AS source,
       if(a.callee != '', a.callee, if(ifNull(c.peer, '') != '', c.peer, {uninstrumented:String})) AS target,
       count() AS calls, avg(c.duration_ms) AS mean_ms, avg(toFloat64(c.failed)) AS error_ratio,
       if(countIf(a.callee != '') > 0, avgIf(greatest(c.duration_ms - a.answer_ms, 0.0), a.callee != ''), NULL)
           AS network_gap_ms
FROM {{trace_spans}} AS c
LEFT JOIN answers AS a ON a.trace = c.trace AND a.parent_id = c.span_id
WHERE c.kind IN (3, 4)
GROUP BY source, target
ORDER BY source, target
