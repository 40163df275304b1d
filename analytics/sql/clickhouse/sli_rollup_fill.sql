-- The SLI windows of sli_windows.sql over [since, until), whole chunks of analytics/rollups.py's grid, into
-- sloscope_sli_rollup: the rows of each chunk of {rollup_chunks} (counted from {chunk_origin}) one batch, that of
-- {rollup_batches} in the same place; other chunks' rows are not written.
INSERT INTO sloscope_sli_rollup (parameters, chunk_start, batch, tier, service, node, window_start, requests,
                                 failures, slow,
                                 ttft_requests, ttft_slow, tpot_requests, tpot_slow, queue_requests, queue_slow)
SELECT {rollup_parameters:Int64},
       fromUnixTimestamp64Micro(toInt64(toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}) + chunk * {chunk_us:Int64}),
                                'UTC'),
       {rollup_batches:Array(Int64)}[indexOf({rollup_chunks:Array(Int64)}, chunk)],
       tier, service, node, window_start, requests, failures, slow,
       ttft_requests, ttft_slow, tpot_requests, tpot_slow, queue_requests, queue_slow
FROM (
    SELECT *, intDiv(toUnixTimestamp64Micro(window_start) - toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}),
                     {chunk_us:Int64}) AS chunk
    FROM {{sli_windows}}
)
WHERE has({rollup_chunks:Array(Int64)}, chunk)
