-- The points that signal_series_steps.sql reads, of every metrics table, counted per slice of {chunk_us}
-- microseconds of analytics/rollups.py's grid from {chunk_origin} over [since, until), with a digest of them (the sum
-- of their times, which no order of inserts changes and a point added or dropped does: the exporter's rows are not
-- updated in place), and how many lie in [{first_step}, {range_start}) or [{range_end}, {last_step_end}): outside the
-- analysed range, but in a step of it. Times are read as DateTime64(9): a Collector of v0.160 or later keeps them
-- as DateTime.
SELECT intDiv(toUnixTimestamp64Micro(time) - toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}), {chunk_us:Int64})
           AS chunk,
       count() AS source_rows,
       reinterpretAsInt64(sum(digest)) AS source_digest,
       countIf(time < {range_start:DateTime64(6)} AND time >= {first_step:DateTime64(6)}
               OR time >= {range_end:DateTime64(6)} AND time < {last_step_end:DateTime64(6)}) AS outside
FROM (
    SELECT toDateTime64(TimeUnix, 9) AS time, toUnixTimestamp64Nano(time) AS digest FROM otel_metrics_gauge
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT toDateTime64(TimeUnix, 9) AS time, toUnixTimestamp64Nano(time) FROM otel_metrics_sum
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT toDateTime64(TimeUnix, 9) AS time, toUnixTimestamp64Nano(time) FROM otel_metrics_histogram
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT toDateTime64(TimeUnix, 9) AS time, toUnixTimestamp64Nano(time) FROM otel_metrics_exponential_histogram
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
)
GROUP BY chunk
