-- The requests that sli_windows.sql reads, counted per slice of $chunk_us microseconds of analytics/rollups.py's grid
-- from $chunk_origin over [since, until), with a digest of them (the sum of a hash of every column the windows
-- read, which no order of writes changes and a request added, dropped or moved to its node does), and how many lie
-- in [$first_step, $range_start) or [$range_end, $last_step_end): outside the analysed range, but in a window of it.
SELECT (epoch_us(start_time) - epoch_us($chunk_origin)) // $chunk_us AS chunk,
       count(*) AS source_rows,
       CAST(sum(hash(tier, service, node, start_time, duration_ms, failed)) % 18446744073709551616 AS UBIGINT)
           AS source_digest,
       count(*) FILTER (WHERE start_time < $range_start AND start_time >= $first_step
                           OR start_time >= $range_end AND start_time < $last_step_end) AS outside
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY chunk
