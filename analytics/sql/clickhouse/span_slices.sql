-- The server spans that sli_windows.sql reads, counted per slice of {chunk_us} microseconds of analytics/rollups.py's
-- grid from {chunk_origin} over [since, until), with a digest of them (the sum of their keys, which no order of
-- inserts changes and a span added or dropped does: the exporter's rows are not updated in place), and how many
-- lie in [{first_step}, {range_start}) or [{range_end}, {last_step_end}): outside the analysed range, but in a
-- window of it.
SELECT intDiv(toUnixTimestamp64Micro(Timestamp) - toUnixTimestamp64Micro({chunk_origin:DateTime64(6)}),
              {chunk_us:Int64}) AS chunk,
       count() AS source_rows,
       reinterpretAsInt64(sum(SloscopeSpanKey)) AS source_digest,
       countIf(Timestamp < {range_start:DateTime64(6)} AND Timestamp >= {first_step:DateTime64(6)}
               OR Timestamp >= {range_end:DateTime64(6)} AND Timestamp < {last_step_end:DateTime64(6)}) AS outside
FROM otel_traces
WHERE SpanKind IN ('Server', 'SPAN_KIND_SERVER')
  AND Timestamp >= {since:DateTime64(6)} AND Timestamp < {until:DateTime64(6)}
GROUP BY chunk
