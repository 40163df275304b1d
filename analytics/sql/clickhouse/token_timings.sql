-- analytics/sql/token_timings.sql over the exporter's otel_traces: a row per request started in [since, until) and
-- token timing its span gives (measure: ttft, tpot or queue; ms). Inlined by the token queries of this folder.
SELECT tier, service, node, timing.1 AS measure, assumeNotNull(timing.2) AS ms
FROM {{requests}}
ARRAY JOIN arrayFilter(t -> t.2 IS NOT NULL, [('ttft', ttft_ms), ('tpot', tpot_ms), ('queue', queue_ms)]) AS timing
