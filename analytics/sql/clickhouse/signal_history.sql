-- When a node's signals begin: how much history there is for a baseline before its incidents. Read from the
-- exporter's tables directly (the earliest point of the node, found without computing any delta), so it costs a
-- scan of the time column and not the window functions of samples.sql over the whole table; a cumulative series'
-- first point counts although it gives no increase of its own, one interval before the DuckDB store's first row.
SELECT fromUnixTimestamp64Micro(toUnixTimestamp64Micro(minOrNull(TimeUnix)), 'UTC') AS first
FROM (
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_gauge WHERE isFinite(Value) AND bitAnd(Flags, 1) = 0
    UNION ALL
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_sum WHERE isFinite(Value) AND bitAnd(Flags, 1) = 0
    UNION ALL
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_exponential_histogram WHERE bitAnd(Flags, 1) = 0 AND Count > 0
)
WHERE SloscopeNode = {node:String}
