-- The newest stored request's start at or before {not_after} (the wall clock and a skew allowance), as
-- analytics/sql/newest_request.sql says; SERVER spans in both of the exporter's spellings, as data_range.sql reads.
SELECT fromUnixTimestamp64Micro(toUnixTimestamp64Micro(coalesce(maxIfOrNull(Timestamp,
                                                                            Timestamp <= {not_after:DateTime64(6)}),
                                                                maxOrNull(Timestamp))), 'UTC') AS newest
FROM otel_traces
WHERE SpanKind IN ('Server', 'SPAN_KIND_SERVER')
