-- analytics/sql/inference_load.sql over the exporter's otel_traces: per node, inference service and step in
-- [since, until), its requests started per second, prompt tokens arriving per second and mean queue time in
-- seconds, of the requests that give a token timing; steps aligned as DuckDB's time_bucket aligns them.
SELECT node, service,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS step,
       count() / {step_s:Float64} AS arrivals,
       sum(ifNull(prompt_tokens, 0)) / {step_s:Float64} AS prompt_tokens,
       avg(queue_ms) / 1000.0 AS queue_s
FROM {{requests}}
WHERE node != {unknown_node:String} AND ({node:String} = '' OR node = {node:String})
  AND (ttft_ms IS NOT NULL OR tpot_ms IS NOT NULL OR queue_ms IS NOT NULL OR output_tokens IS NOT NULL)
GROUP BY node, service, step
