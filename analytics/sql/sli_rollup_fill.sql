-- The SLI windows of sli_windows.sql over [since, until), whole chunks of analytics/rollups.py's grid, into
-- sloscope_sli_rollup: the rows of each chunk of $rollup_chunks (counted from $chunk_origin) one batch, that of
-- $rollup_batches in the same place; other chunks' rows are not written.
INSERT INTO sloscope_sli_rollup (parameters, chunk_start, batch, tier, service, node, window_start, requests,
                                 failures, slow,
                                 ttft_requests, ttft_slow, tpot_requests, tpot_slow, queue_requests, queue_slow)
SELECT $rollup_parameters,
       $chunk_origin::TIMESTAMP + to_microseconds(chunk * $chunk_us),
       $rollup_batches[list_position($rollup_chunks, chunk)],
       tier, service, node, window_start, requests, failures, slow,
       ttft_requests, ttft_slow, tpot_requests, tpot_slow, queue_requests, queue_slow
FROM (
    SELECT *, (epoch_us(window_start) - epoch_us($chunk_origin)) // $chunk_us AS chunk
    FROM {{sli_windows}}
)
WHERE list_contains($rollup_chunks, chunk)
