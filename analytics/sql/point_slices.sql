-- The points that signal_steps.sql reads, of samples and histograms, counted per slice of $chunk_us microseconds of
-- analytics/rollups.py's grid from $chunk_origin over [since, until), with a digest of them (the sum of a hash of
-- every column the steps read, which no order of writes changes and a point added, dropped or recounted does), and
-- how many lie in [$first_step, $range_start) or [$range_end, $last_step_end): outside the analysed range, but in a
-- step of it.
SELECT (epoch_us(ts) - epoch_us($chunk_origin)) // $chunk_us AS chunk,
       count(*) AS source_rows,
       CAST(sum(digest) % 18446744073709551616 AS UBIGINT) AS source_digest,
       count(*) FILTER (WHERE ts < $range_start AND ts >= $first_step
                           OR ts >= $range_end AND ts < $last_step_end) AS outside
FROM (
    SELECT ts, hash(node, metric, attributes, ts, value, interval_s) AS digest
    FROM samples
    WHERE ts >= $since AND ts < $until
    UNION ALL
    SELECT ts, hash(node, metric, attributes, ts, interval_s, count, sum)
    FROM histograms
    WHERE ts >= $since AND ts < $until
)
GROUP BY chunk
