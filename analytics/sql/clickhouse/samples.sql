-- The samples of analytics/sql/schema.sql in [since, until), read from the exporter's gauge and sum tables:
-- gauges and levels (SloscopeTemporality 0) as measured (interval_s NULL), delta sums as they are, cumulative sums
-- as per-interval increases, computed here with window functions by the rules of analytics/store.py: a new start
-- time or a value that went down is a reset, after which the increase is the value itself: over the time since
-- the series' start where that is known, else since the previous point where the value went down; a new start
-- that cannot be used with a value that did not go down (the reporter restarted, not the counter) is dropped. A point stored twice (a retried batch, a file loaded
-- again) counts once, as the DuckDB store keeps it once.
-- Only the range is read, so the work follows the range and not the table, plus up to 5 minutes before it for the
-- point that each series' first increase is taken from (Prometheus's staleness: a series silent for longer has
-- gone; its next point starts it again, as a first point does).
-- ClickHouse inlines `points` at each use: each use picks its temporality before dropping repeated points, so
-- the filter reaches the table and the delta and cumulative points are each read once.
-- Parameters: since, until. Inlined by the queries of this folder where they name it in double braces.
WITH points AS (
    SELECT SloscopeNode AS node,
           MetricName AS metric,
           SloscopeAttributes AS attributes,
           toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)) AS start_ns,
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns,
           Value AS value,
           SloscopeTemporality AS temporality
    FROM otel_metrics_sum
    WHERE SloscopeKept
      AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
),
cumulative AS (
    SELECT node, metric, attributes, start_ns, time_ns, value,
           row_number() OVER series = 1 AS first,
           lagInFrame(start_ns) OVER series AS prev_start_ns,
           lagInFrame(time_ns) OVER series AS prev_time_ns,
           lagInFrame(value) OVER series AS prev_value,
           first OR start_ns != prev_start_ns AS restarted,
           NOT first AND value < prev_value AS went_down,
           restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns) AS from_start
    FROM (SELECT * FROM points WHERE temporality = 2 LIMIT 1 BY node, metric, attributes, time_ns)
    WINDOW series AS (PARTITION BY node, metric, attributes ORDER BY time_ns
                      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT * FROM (
    SELECT fromUnixTimestamp64Micro(intDiv(time_ns, 1000), 'UTC') AS ts, node, metric, attributes, value,
           CAST(NULL AS Nullable(Float64)) AS interval_s
    FROM (
        SELECT SloscopeNode AS node,
               MetricName AS metric,
               SloscopeAttributes AS attributes,
               toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns,
               Value AS value
        FROM otel_metrics_gauge
        WHERE SloscopeKept
          AND TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
        UNION ALL
        SELECT node, metric, attributes, time_ns, value
        FROM points
        WHERE temporality = 0 AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
    )
    LIMIT 1 BY node, metric, attributes, ts
)
UNION ALL
SELECT fromUnixTimestamp64Micro(intDiv(time_ns, 1000), 'UTC'), node, metric, attributes, value,
       if(start_ns > 0 AND start_ns < time_ns, (time_ns - start_ns) / 1e9, NULL)
FROM points
WHERE temporality = 1 AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
LIMIT 1 BY node, metric, attributes, time_ns
UNION ALL
SELECT fromUnixTimestamp64Micro(intDiv(time_ns, 1000), 'UTC'), node, metric, attributes,
       if(from_start OR went_down, value, value - prev_value),
       if(from_start, (time_ns - start_ns) / 1e9, (time_ns - prev_time_ns) / 1e9)
FROM cumulative
WHERE (from_start OR went_down OR NOT restarted) AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
