-- signal_steps.sql's rows for [since, until), read from the batches of sloscope_step_rollup that
-- analytics/rollups.py chose ($rollup_batches), from the step that holds $since ($first_step), of node $node only
-- where it is not empty.
SELECT series, node_key, metric_key, step, value
FROM sloscope_step_rollup
WHERE parameters = $rollup_parameters AND NOT header AND list_contains($rollup_batches, batch)
  AND chunk_start >= $chunk_origin AND chunk_start < $until AND step >= $first_step AND step < $until
  AND ($node = '' OR node_key = hash($node))
