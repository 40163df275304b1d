-- The signal steps of signal_steps.sql over [since, until), whole chunks of analytics/rollups.py's grid, into
-- sloscope_step_rollup: the rows of each chunk of $rollup_chunks (counted from $chunk_origin) one batch, that of
-- $rollup_batches in the same place; other chunks' rows are not written. In order of chunk and series, so that the
-- series' keys are runs that DuckDB stores compressed (a third of the room in no order).
INSERT INTO sloscope_step_rollup (parameters, chunk_start, batch, series, node_key, metric_key, step, value)
SELECT $rollup_parameters,
       $chunk_origin::TIMESTAMP + to_microseconds(chunk * $chunk_us),
       $rollup_batches[list_position($rollup_chunks, chunk)],
       series, node_key, metric_key, step, value
FROM (
    SELECT *, (epoch_us(step) - epoch_us($chunk_origin)) // $chunk_us AS chunk
    FROM {{signal_steps}}
)
WHERE list_contains($rollup_chunks, chunk)
ORDER BY chunk, series, step
