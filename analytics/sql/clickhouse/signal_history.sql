-- When a node's signals begin, where that is after {since} (the start of an incident's baseline), as
-- analytics/sql/signal_history.sql answers it: NULL when some signal of the node precedes {since}, and when the
-- node has none. Read from the exporter's tables directly (a point's time, found without computing any delta); a
-- cumulative series' first point counts although it gives no increase of its own, one interval before the DuckDB
-- store's first row.
WITH points AS (
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_gauge WHERE SloscopeKept
    UNION ALL
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_sum WHERE SloscopeKept
    UNION ALL
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_exponential_histogram WHERE bitAnd(Flags, 1) = 0 AND Count > 0
    UNION ALL
    SELECT SloscopeNode, TimeUnix FROM otel_metrics_histogram WHERE bitAnd(Flags, 1) = 0 AND Count > 0
)
SELECT fromUnixTimestamp64Micro(toUnixTimestamp64Micro(toDateTime64(minOrNull(TimeUnix), 6)), 'UTC') AS first
FROM points
WHERE SloscopeNode = {node:String} AND TimeUnix >= {since:DateTime64(6)}
  -- A condition, not a branch of if(): ClickHouse computes every scalar subquery, but reads nothing for a constant
  -- false filter, so the node's later points are read only when none precedes {since}.
  AND (SELECT count() FROM (SELECT 1 FROM points
                            WHERE SloscopeNode = {node:String} AND TimeUnix < {since:DateTime64(6)} LIMIT 1)) = 0
