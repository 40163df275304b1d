-- The signal steps of signal_steps.sql over [since, until), whole chunks of analytics/rollups.py's grid, into
-- sloscope_step_rollup: the rows of each chunk of {rollup_chunks} (counted from {chunk_origin}) one batch, that of
-- {rollup_batches} in the same place; other chunks' rows are not written.
INSERT INTO sloscope_step_rollup (parameters, chunk_start, batch, series, node_key, metric_key, step, value)
SELECT {rollup_parameters:Int64},
       fromUnixTimestamp64Micro(toInt64(toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}) + chunk * {chunk_us:Int64}),
                                'UTC'),
       {rollup_batches:Array(Int64)}[indexOf({rollup_chunks:Array(Int64)}, chunk)],
       series, node_key, metric_key, step, value
FROM (
    SELECT *, intDiv(toUnixTimestamp64Micro(step) - toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}),
                     {chunk_us:Int64}) AS chunk
    FROM {{signal_steps}}
)
WHERE has({rollup_chunks:Array(Int64)}, chunk)
