-- The time span covered by the stored requests (NULLs when there are none, as in DuckDB), read from the table
-- itself: a span stored twice moves neither end. SERVER spans in both of the exporter's spellings, as requests.sql
-- reads them.
SELECT fromUnixTimestamp64Micro(toUnixTimestamp64Micro(minOrNull(Timestamp)), 'UTC') AS first,
       fromUnixTimestamp64Micro(toUnixTimestamp64Micro(maxOrNull(Timestamp)), 'UTC') AS last
FROM otel_traces
WHERE SpanKind IN ('Server', 'SPAN_KIND_SERVER')
