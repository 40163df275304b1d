-- Every stored span that started in [since, until), requests and the spans of other kinds alike, as the trace graph
-- reads them (analytics/graph.py): its trace (a 64-bit hash of the trace id: the graph only needs to tell a
-- window's traces apart), its id and its parent's, OTLP kind, where it ran, its own tier and its time. A trace's
-- tier is its entry's, which the graph reads: deeper services see no header.
-- Where $service is not empty, only the traces in which a request of $service on $node of tier $tier started in
-- the range (on any node where $node is $every_node): an incident's traces, read without the rest of the fleet's.
WITH chosen AS (
    SELECT DISTINCT trace_hi, trace_lo
    FROM requests
    WHERE $service <> '' AND service = $service AND ($node = $every_node OR node = $node) AND tier = $tier
      AND start_time >= $since AND start_time < $until
),
graph AS (
    SELECT trace_hi, trace_lo, span_id, parent_id, 2::UTINYINT AS kind, service, pod, node, tier, start_time,
           duration_ms, failed, NULL::VARCHAR AS peer
    FROM requests
    WHERE start_time >= $since AND start_time < $until
    UNION ALL
    SELECT trace_hi, trace_lo, span_id, parent_id, kind, service, pod, node, tier, start_time, duration_ms, failed,
           peer
    FROM spans
    WHERE start_time >= $since AND start_time < $until
)
SELECT hash(trace_hi, trace_lo) AS trace, span_id, parent_id, kind, service, pod, node, tier, start_time,
       duration_ms, failed, peer
FROM graph
WHERE $service = '' OR (trace_hi, trace_lo) IN (SELECT (trace_hi, trace_lo) FROM chosen)
