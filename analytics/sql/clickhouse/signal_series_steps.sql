-- Every catalog signal's steps, one array per series, as analytics/sql/signal_steps.sql computes them: gauges as
-- measured, counters as a rate per second, histograms as their mean; only the metrics named in {metrics}, or all
-- when it is empty; for every node, or only node {node} when it is not empty; the unknown node's signals left out;
-- each series keyed by the fingerprint of signal_series.sql, with its names only {by_name}, and the hashes of its
-- node and metric (node_key, metric_key) for fleet_movement.sql. `steps` holds (step, value) in step order.
-- The points are read from the exporter's tables by the rules of samples.sql and histograms.sql, but only what a
-- step's mean needs (no histogram slots), explicit-bucket histograms (metrics an SLO spec declares) beside the
-- exponential ones. A point stored twice counts once: of a series' points that share a time only the last in
-- (time, value) order is kept, and for a cumulative series before its increases are taken. Sharing a time is not
-- only a copy: the exporter's tables since v0.160 keep whole seconds, and the later of two points of a cumulative
-- series in one second carries the increase of both.
WITH raw AS (
    SELECT SloscopeNode AS node, MetricName AS metric, SloscopeAttributes AS attributes,
           reinterpretAsInt64(cityHash64(node, metric, attributes)) AS series,
           reinterpretAsInt64(cityHash64(node)) AS node_key,
           reinterpretAsInt64(cityHash64(metric)) AS metric_key,
           if({by_name:Bool}, node, NULL) AS name_node,
           if({by_name:Bool}, metric, NULL) AS name_metric,
           if({by_name:Bool}, attributes, NULL) AS name_attributes,
           toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)) AS start_ns,
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns,
           Value AS value,
           SloscopeTemporality AS temporality
    FROM otel_metrics_sum
    WHERE SloscopeKept AND SloscopeNode != {unknown_node:String}
      AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
      AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
),
raw_histograms AS (
    SELECT node, metric, attributes,
           reinterpretAsInt64(cityHash64(node, metric, attributes)) AS series,
           reinterpretAsInt64(cityHash64(node)) AS node_key,
           reinterpretAsInt64(cityHash64(metric)) AS metric_key,
           if({by_name:Bool}, node, NULL) AS name_node,
           if({by_name:Bool}, metric, NULL) AS name_metric,
           if({by_name:Bool}, attributes, NULL) AS name_attributes,
           start_ns, time_ns, count, sum, layout, temporality,
           -- Only a bucket that held something can go down: each point carries the run of buckets from its first
           -- to its last that is not empty, and where that run begins (0: none). Fixed layouts (sloscope's own
           -- 48 slots) are mostly empty buckets, which made the fleet's arrays several times larger.
           arrayFirstIndex(n -> n != 0, buckets) AS held_from,
           arraySlice(buckets, held_from, length(buckets) - arrayFirstIndex(n -> n != 0, arrayReverse(buckets)) + 2
                                          - held_from) AS held
    FROM (
        -- Exponential and explicit-bucket histograms; a bucket that went down is a reset only where the point's
        -- layout (scale and offset, or bounds) is its predecessor's.
        SELECT SloscopeNode AS node, MetricName AS metric, SloscopeAttributes AS attributes,
               toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)) AS start_ns,
               toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns,
               toInt64(Count) AS count,
               Sum AS sum,
               cityHash64(Scale, PositiveOffset) AS layout,
               arrayConcat([ZeroCount], PositiveBucketCounts) AS buckets,
               AggregationTemporality AS temporality
        FROM otel_metrics_exponential_histogram
        WHERE bitAnd(Flags, 1) = 0 AND SloscopeNode != {unknown_node:String}
          AND ({node:String} = '' OR SloscopeNode = {node:String})
          AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
          AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
        UNION ALL
        SELECT SloscopeNode, MetricName, SloscopeAttributes,
               toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)),
               toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)),
               toInt64(Count), Sum, cityHash64(ExplicitBounds), BucketCounts, AggregationTemporality
        FROM otel_metrics_histogram
        WHERE bitAnd(Flags, 1) = 0 AND SloscopeNode != {unknown_node:String}
          AND ({node:String} = '' OR SloscopeNode = {node:String})
          AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
          AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
    )
),
-- Gauges and levels, and delta sums and histograms, as one value per point (a delta without a usable start
-- time as it is), every stored copy.
single AS (
    SELECT reinterpretAsInt64(cityHash64(SloscopeNode, MetricName, SloscopeAttributes)) AS series,
           reinterpretAsInt64(cityHash64(SloscopeNode)) AS node_key,
           reinterpretAsInt64(cityHash64(MetricName)) AS metric_key,
           if({by_name:Bool}, SloscopeNode, NULL) AS name_node,
           if({by_name:Bool}, MetricName, NULL) AS name_metric,
           if({by_name:Bool}, SloscopeAttributes, NULL) AS name_attributes,
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns, Value AS value
    FROM otel_metrics_gauge
    WHERE SloscopeKept AND SloscopeNode != {unknown_node:String}
      AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
      AND TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes, time_ns,
           if(temporality = 1 AND start_ns > 0 AND start_ns < time_ns, value / ((time_ns - start_ns) / 1e9), value)
    FROM raw
    WHERE temporality IN (0, 1) AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
    UNION ALL
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes, time_ns, sum / count
    FROM raw_histograms
    WHERE temporality = 1 AND count > 0 AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
),
-- Each cumulative series' points in (time, value) order as one array, of which each point is read beside its
-- predecessor: the grouping sorts each series on its own, where a window would sort the fleet's points. Of the
-- points that share a time only the last is kept (its successor's time differs). Of the 5 minutes before the
-- range only each series' last time is kept, the predecessor of its first point: carrying the others (a quarter
-- of a 16-minute window's points, with their buckets) cost memory and changed nothing.
cumulative AS (
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
           tupleElement(point, 1) AS time_ns, tupleElement(point, 2) AS value, tupleElement(point, 3) AS start_ns,
           tupleElement(previous, 1) AS prev_time_ns, tupleElement(previous, 2) AS prev_value,
           tupleElement(previous, 3) AS prev_start_ns,
           position = 1 AS first,
           first OR start_ns != prev_start_ns AS restarted,
           NOT first AND value < prev_value AS went_down,
           restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns) AS from_start
    FROM (
        SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
               arraySort(groupArray((time_ns, value, start_ns))) AS sorted,
               arrayFilter((point, next) -> tupleElement(point, 1) != next, sorted,
                           arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)), toInt64(-1)))
                   AS kept
        FROM raw
        WHERE temporality = 2
          AND (time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
               OR (series, time_ns) IN (SELECT series, max(time_ns) FROM raw
                                        WHERE temporality = 2 AND time_ns < toUnixTimestamp64Nano({since:DateTime64(6)})
                                        GROUP BY series))
        GROUP BY series, node_key, metric_key, name_node, name_metric, name_attributes
    )
    ARRAY JOIN kept AS point, arrayPushFront(arrayPopBack(kept), kept[1]) AS previous,
               arrayEnumerate(kept) AS position
),
-- The same for cumulative histograms, in (time, count) order. Apart from the sums: a sum's points carried in
-- one array with bucket arrays beside them made the whole query slower and larger.
cumulative_histograms AS (
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
           tupleElement(point, 1) AS time_ns, tupleElement(point, 2) AS count, tupleElement(point, 3) AS start_ns,
           tupleElement(point, 4) AS sum, tupleElement(point, 5) AS layout,
           toInt64(tupleElement(point, 6)) AS held_from, tupleElement(point, 7) AS held,
           tupleElement(previous, 1) AS prev_time_ns, tupleElement(previous, 2) AS prev_count,
           tupleElement(previous, 3) AS prev_start_ns, tupleElement(previous, 4) AS prev_sum,
           tupleElement(previous, 5) AS prev_layout, toInt64(tupleElement(previous, 6)) AS prev_held_from,
           tupleElement(previous, 7) AS prev_held,
           position = 1 AS first,
           first OR start_ns != prev_start_ns AS restarted,
           -- A bucket went down where the predecessor held more than the point holds in that bucket.
           NOT first AND (count < prev_count OR (layout = prev_layout AND
               arrayExists((before, i) -> before > if(prev_held_from + i - held_from BETWEEN 1 AND length(held),
                                                      held[prev_held_from + i - held_from], 0),
                           prev_held, arrayEnumerate(prev_held))))
               AS went_down,
           restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns) AS from_start
    FROM (
        SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
               arraySort(point -> (tupleElement(point, 1), tupleElement(point, 2)),
                         groupArray((time_ns, count, start_ns, sum, layout, held_from, held))) AS sorted,
               arrayFilter((point, next) -> tupleElement(point, 1) != next, sorted,
                           arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)), toInt64(-1)))
                   AS kept
        FROM raw_histograms
        WHERE temporality = 2
          AND (time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
               OR (series, time_ns) IN (SELECT series, max(time_ns) FROM raw_histograms
                                        WHERE temporality = 2 AND time_ns < toUnixTimestamp64Nano({since:DateTime64(6)})
                                        GROUP BY series))
        GROUP BY series, node_key, metric_key, name_node, name_metric, name_attributes
    )
    ARRAY JOIN kept AS point, arrayPushFront(arrayPopBack(kept), kept[1]) AS previous,
               arrayEnumerate(kept) AS position
),
points AS (
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes, time_ns, value FROM single
    UNION ALL
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes, time_ns,
           if(from_start OR went_down, value, value - prev_value)
               / if(from_start, (time_ns - start_ns) / 1e9, (time_ns - prev_time_ns) / 1e9)
    FROM cumulative
    WHERE (from_start OR went_down OR NOT restarted)
      AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
    UNION ALL
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes, time_ns,
           if(from_start OR went_down, sum / count, (sum - prev_sum) / (count - prev_count))
    FROM cumulative_histograms
    WHERE (from_start OR went_down OR NOT restarted)
      AND if(from_start OR went_down, count, count - prev_count) > 0
      AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
),
-- Each series' points in time order, one of those that share a time (a copy, or a second's two points of a
-- whole-second table; a cumulative series has one per time already), averaged per step in that order: runs of
-- points in one step, with no grouping of the fleet's steps.
timed AS (
    SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
           arraySort(groupArray((time_ns, value))) AS sorted,
           arrayFilter((point, next) -> tupleElement(point, 1) != next, sorted,
                       arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)), toInt64(-1)))
               AS kept,
           arrayMap(point -> intDiv(intDiv(tupleElement(point, 1), 1000) - 946857600000000,
                                    toInt64(round({step_s:Float64} * 1e6))), kept) AS step_numbers,
           arrayMap((number, previous) -> number != previous, step_numbers,
                    arrayPushFront(arrayPopBack(step_numbers), step_numbers[1] - 1)) AS step_begins
    FROM points
    GROUP BY series, node_key, metric_key, name_node, name_metric, name_attributes
)
SELECT series, node_key, metric_key, name_node, name_metric, name_attributes,
       arrayZip(arrayMap(number -> fromUnixTimestamp64Micro(toInt64(946857600000000
                                       + number * toInt64(round({step_s:Float64} * 1e6))), 'UTC'),
                         arrayFilter((number, begins) -> begins, step_numbers, step_begins)),
                arrayMap(values -> arrayAvg(values),
                         arraySplit((value, begins) -> begins, arrayMap(point -> tupleElement(point, 2), kept),
                                    step_begins))) AS steps
FROM timed
