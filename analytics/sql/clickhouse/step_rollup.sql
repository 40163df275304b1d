-- signal_series_steps.sql's rows for [since, until), read from the batches of sloscope_step_rollup that
-- analytics/rollups.py chose ({rollup_batches}), from the step that holds {since} ({first_step}): one array of
-- (step, value) in step order per series, of node {node} only where it is not empty.
SELECT series, node_key, metric_key, arraySort(groupArray((step, value))) AS steps
FROM sloscope_step_rollup
WHERE parameters = {rollup_parameters:Int64} AND NOT header AND has({rollup_batches:Array(Int64)}, batch)
  AND chunk_start >= {chunk_origin:DateTime64(6)}
  AND step >= {first_step:DateTime64(6)} AND step < {until:DateTime64(6)}
  AND ({node:String} = '' OR node_key = reinterpretAsInt64(cityHash64({node:String})))
GROUP BY series, node_key, metric_key
