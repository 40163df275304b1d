-- The services of the service graph over [since, until) (analytics/graph.py service_graph): per service that
-- served anything (a span that is not a call), its pods and nodes, and of its requests (SERVER spans) the count,
-- mean duration and failed share; with every service, the span kinds it sent, so that the graph can say which
-- kinds it was drawn from. Calls (CLIENT and PRODUCER spans) are the edges (service_graph_edges.sql).
SELECT service,
       bool_or(kind NOT IN (3, 4)) AS serves,
       list_sort(list_distinct(list(pod) FILTER (WHERE kind NOT IN (3, 4) AND pod <> ''))) AS pods,
       list_sort(list_distinct(list(node) FILTER (WHERE kind NOT IN (3, 4)))) AS nodes,
       count(*) FILTER (WHERE kind = 2) AS requests,
       avg(duration_ms) FILTER (WHERE kind = 2) AS mean_ms,
       avg(failed::DOUBLE) FILTER (WHERE kind = 2) AS error_ratio,
       list_distinct(list(kind)) AS kinds
FROM {{trace_spans}}
GROUP BY service
ORDER BY service
