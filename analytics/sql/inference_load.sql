-- What an inference service's own requests say of the load on its engine, per node, service and step in
-- [since, until) (of node $node alone where it is not empty): requests started per second, prompt tokens arriving
-- per second, and the mean time a request waited in the engine's queue, in seconds. Only requests that give a token
-- timing count (receiver/token_timings.py): a service that serves none has no such series. Steps are aligned as
-- signal_steps.sql aligns them; each row is a series of analytics/attribution.py's signal steps.
SELECT node, service, time_bucket(to_seconds($step_s), start_time) AS step,
       count(*) / $step_s AS arrivals,
       coalesce(sum(prompt_tokens), 0) / $step_s AS prompt_tokens,
       avg(queue_ms) / 1000.0 AS queue_s
FROM requests
WHERE start_time >= $since AND start_time < $until AND node <> $unknown_node AND ($node = '' OR node = $node)
  AND (ttft_ms IS NOT NULL OR tpot_ms IS NOT NULL OR queue_ms IS NOT NULL OR output_tokens IS NOT NULL)
GROUP BY ALL
