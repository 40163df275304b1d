-- sli_windows.sql's rows for [since, until), read from the batches of sloscope_sli_rollup that analytics/rollups.py
-- chose ({rollup_batches}), from the window that holds {since} ({first_step}).
SELECT tier, service, node, window_start, requests, failures, slow, ttft_requests, ttft_slow, tpot_requests, tpot_slow, queue_requests, queue_slow
FROM sloscope_sli_rollup
WHERE parameters = {rollup_parameters:Int64} AND NOT header AND has({rollup_batches:Array(Int64)}, batch)
  AND chunk_start >= {chunk_origin:DateTime64(6)}
  AND window_start >= {first_step:DateTime64(6)} AND window_start < {until:DateTime64(6)}
