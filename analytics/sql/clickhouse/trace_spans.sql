-- analytics/sql/trace_spans.sql over the exporter's otel_traces: every span of every kind that started in
-- [since, until), a span stored twice once, with its ids as the DuckDB store's words and the trace a 64-bit hash of
-- its id; where {service} is not empty, only the traces in which a request of {service} on {node} of tier {tier}
-- started in the range (on any node where {node} is {every_node}).
-- Parameters: allowed_tiers, default_tier, since, until, service, node, tier, every_node.
SELECT reinterpretAsInt64(cityHash64(trace_id)) AS trace, span_word AS span_id, parent_id, kind, service, pod, node,
       tier, start_time, duration_ms, failed, peer
FROM {{exporter_spans}}
WHERE {service:String} = ''
   OR trace_id IN (SELECT trace_id FROM {{requests}}
                   WHERE service = {service:String} AND tier = {tier:String}
                     AND ({node:String} = {every_node:String} OR node = {node:String}))
LIMIT 1 BY node, service, trace_id, span_id
