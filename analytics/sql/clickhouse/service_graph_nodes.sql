-- analytics/sql/service_graph_nodes.sql over the exporter's otel_traces (trace_spans.sql): per service, whether it
-- served anything, its pods and nodes, its requests' count, mean duration and failed share, and its span kinds.
-- Parameters: those of trace_spans.sql.
SELECT service,
       max(kind NOT IN (3, 4)) AS serves,
       arraySort(groupUniqArrayIf(pod, kind NOT IN (3, 4) AND pod != '')) AS pods,
       arraySort(groupUniqArrayIf(node, kind NOT IN (3, 4))) AS nodes,
       countIf(kind = 2) AS requests,
       if(countIf(kind = 2) > 0, avgIf(duration_ms, kind = 2), NULL) AS mean_ms,
       if(countIf(kind = 2) > 0, avgIf(toFloat64(failed), kind = 2), NULL) AS error_ratio,
       groupUniqArray(kind) AS kinds
FROM {{trace_spans}}
GROUP BY service
ORDER BY service
