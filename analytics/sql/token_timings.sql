-- The token timings of the requests started in [since, until): a row per request and timing its span gives
-- (measure: ttft, tpot or queue, as slo_spec.TOKEN_SLIS names them; ms), none for a request that gives none.
-- Inlined by the token queries of this folder.
SELECT tier, service, node, measure, ms
FROM (
    SELECT tier, service, node, ttft_ms AS ttft, tpot_ms AS tpot, queue_ms AS queue
    FROM requests
    WHERE start_time >= $since AND start_time < $until AND coalesce(ttft_ms, tpot_ms, queue_ms) IS NOT NULL
)
UNPIVOT (ms FOR measure IN (ttft, tpot, queue))
