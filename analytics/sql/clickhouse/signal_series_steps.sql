-- Every catalog signal's steps, one array per series, as analytics/sql/signal_steps.sql computes them: gauges as
-- measured, counters as a rate per second, histograms as their mean; only the metrics named in {metrics}, or all
-- when it is empty; for every node, or only node {node} when it is not empty; the unknown node's signals left out;
-- each series keyed by the fingerprint of signal_series.sql under {seed}, with the hashes of its node and metric
-- (node_key, metric_key) for fleet_movement.sql. `steps` holds (step, value) in step order.
-- The points are read from the exporter's tables by the rules of samples.sql and histograms.sql, but only what a
-- step's mean needs (no histogram slots), explicit-bucket histograms (metrics an SLO spec declares) beside the
-- exponential ones. A point stored twice counts once: of a series' points that share a time only the last in
-- (time, value) order is kept, and for a cumulative series before its increases are taken. Sharing a time is not
-- only a copy: the exporter's tables since v0.160 keep whole seconds, and the later of two points of a cumulative
-- series in one second carries the increase of both.
WITH raw AS (
    SELECT SloscopeNode AS node, MetricName AS metric, SloscopeAttributes AS attributes,
           reinterpretAsInt64(cityHash64(node, metric, attributes, {seed:UInt8})) AS series,
           reinterpretAsInt64(cityHash64(node)) AS node_key,
           reinterpretAsInt64(cityHash64(metric)) AS metric_key,
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
           reinterpretAsInt64(cityHash64(node, metric, attributes, {seed:UInt8})) AS series,
           reinterpretAsInt64(cityHash64(node)) AS node_key,
           reinterpretAsInt64(cityHash64(metric)) AS metric_key,
           start_ns, time_ns, count, sum, layout, temporality,
           -- Only a bucket that held something can go down: each point carries the run of buckets from its first
           -- to its last that is not empty, and where that run begins (0: none). Fixed layouts (sloscope's own
           -- 48 slots) are mostly empty buckets, which made the fleet's arrays several times larger.
           arrayFirstIndex(n -> n != 0, buckets) AS held_from,
           arraySlice(buckets, held_from, arrayLastIndex(n -> n != 0, buckets) + 1 - held_from) AS held
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
    SELECT reinterpretAsInt64(cityHash64(SloscopeNode, MetricName, SloscopeAttributes, {seed:UInt8})) AS series,
           reinterpretAsInt64(cityHash64(SloscopeNode)) AS node_key,
           reinterpretAsInt64(cityHash64(MetricName)) AS metric_key,
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns, Value AS value
    FROM otel_metrics_gauge
    WHERE SloscopeKept AND SloscopeNode != {unknown_node:String}
      AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
      AND TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT series, node_key, metric_key, time_ns,
           if(temporality = 1 AND start_ns > 0 AND start_ns < time_ns, value / ((time_ns - start_ns) / 1e9), value)
    FROM raw
    WHERE temporality IN (0, 1) AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
    UNION ALL
    SELECT series, node_key, metric_key, time_ns, sum / count
    FROM raw_histograms
    WHERE temporality = 1 AND count > 0 AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
),
-- Each cumulative series' points in (time, value) order as one array, of which each point is read beside its
-- predecessor: the grouping sorts each series on its own, where a window would sort the fleet's points. Of the
-- points that share a time only the last is kept (its successor's time differs), and of the 5 minutes before the
-- range only the last time, the predecessor of the range's first point: they are dropped from the arrays, which
-- cost less than reading the table a second time for each series' last time (histograms differ, below). Each
-- column has a groupArray of its own, zipped after: a groupArray of tuples took half as long again. A point's
-- predecessor is the element beside it in the array shifted by one, which the per-point conditions read element by
-- element; the points stay in the series' array up to the steps (see timed).
cumulative AS (
    SELECT series, node_key, metric_key,
           arrayFilter((time_ns, use) -> use, time_ns, used) AS times,
           arrayFilter((rate, use) -> use, rates, used) AS values
    FROM (
        SELECT series, node_key, metric_key,
               tupleElement(kept, 1) AS time_ns, tupleElement(kept, 2) AS value, tupleElement(kept, 3) AS start_ns,
               arrayPushFront(arrayPopBack(time_ns), time_ns[1]) AS prev_time_ns,
               arrayPushFront(arrayPopBack(value), value[1]) AS prev_value,
               arrayPushFront(arrayPopBack(start_ns), start_ns[1]) AS prev_start_ns,
               -- A point more than 5 minutes after the one before it starts afresh, as the range's first point
               -- does: a step's value never depends on where the range begins (analytics/rollups.py).
               arrayMap((position, time_ns, prev_time_ns) -> position = 1 OR time_ns - prev_time_ns > 300000000000,
                        arrayEnumerate(kept), time_ns, prev_time_ns) AS first,
               arrayMap((first, start_ns, prev_start_ns) -> first OR start_ns != prev_start_ns,
                        first, start_ns, prev_start_ns) AS restarted,
               arrayMap((first, value, prev_value) -> NOT first AND value < prev_value,
                        first, value, prev_value) AS went_down,
               arrayMap((restarted, start_ns, time_ns, first, prev_time_ns) ->
                            restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns),
                        restarted, start_ns, time_ns, first, prev_time_ns) AS from_start,
               arrayMap((time_ns, value, start_ns, prev_time_ns, prev_value, from_start, went_down) ->
                            if(from_start OR went_down, value, value - prev_value)
                                / if(from_start, (time_ns - start_ns) / 1e9, (time_ns - prev_time_ns) / 1e9),
                        time_ns, value, start_ns, prev_time_ns, prev_value, from_start, went_down) AS rates,
               arrayMap((time_ns, restarted, from_start, went_down) ->
                            (from_start OR went_down OR NOT restarted)
                            AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)}),
                        time_ns, restarted, from_start, went_down) AS used
        FROM (
            SELECT series, node_key, metric_key,
                   arraySort(arrayZip(groupArray(time_ns), groupArray(value), groupArray(start_ns))) AS sorted,
                   arrayFilter((point, next) ->
                                   tupleElement(point, 1) != next
                                   AND (tupleElement(point, 1) >= toUnixTimestamp64Nano({since:DateTime64(6)})
                                        OR next >= toUnixTimestamp64Nano({since:DateTime64(6)}) OR next = -1),
                               sorted,
                               arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)),
                                             toInt64(-1)))
                       AS kept
            FROM raw
            WHERE temporality = 2
            GROUP BY series, node_key, metric_key
        )
    )
),
-- The same for cumulative histograms, in (time, count) order. Apart from the sums: a sum's points carried in
-- one array with bucket arrays beside them made the whole query slower and larger. Of the 5 minutes before the
-- range only each series' last time is read into the arrays: carrying the others (a quarter of a 16-minute
-- window's points, with their buckets) cost more than reading them twice.
cumulative_histograms AS (
    SELECT series, node_key, metric_key,
           arrayFilter((time_ns, use) -> use, time_ns, used) AS times,
           arrayFilter((mean, use) -> use, means, used) AS values
    FROM (
        SELECT series, node_key, metric_key,
               tupleElement(kept, 1) AS time_ns, tupleElement(kept, 2) AS count, tupleElement(kept, 3) AS start_ns,
               tupleElement(kept, 4) AS sum, tupleElement(kept, 5) AS layout,
               arrayMap(held_from -> toInt64(held_from), tupleElement(kept, 6)) AS held_from,
               tupleElement(kept, 7) AS held,
               arrayPushFront(arrayPopBack(time_ns), time_ns[1]) AS prev_time_ns,
               arrayPushFront(arrayPopBack(count), count[1]) AS prev_count,
               arrayPushFront(arrayPopBack(start_ns), start_ns[1]) AS prev_start_ns,
               arrayPushFront(arrayPopBack(sum), sum[1]) AS prev_sum,
               arrayPushFront(arrayPopBack(layout), layout[1]) AS prev_layout,
               arrayPushFront(arrayPopBack(held_from), held_from[1]) AS prev_held_from,
               arrayPushFront(arrayPopBack(held), held[1]) AS prev_held,
               arrayMap((position, time_ns, prev_time_ns) -> position = 1 OR time_ns - prev_time_ns > 300000000000,
                        arrayEnumerate(kept), time_ns, prev_time_ns) AS first,
               arrayMap((first, start_ns, prev_start_ns) -> first OR start_ns != prev_start_ns,
                        first, start_ns, prev_start_ns) AS restarted,
               -- A bucket went down where the predecessor held more than the point holds in that bucket: the
               -- point's buckets lined up with the predecessor's run (0 beyond its own) are compared element by
               -- element, where reading them by index from inside the comparison copied them once per bucket.
               arrayMap((held_from, held, prev_held_from, prev_held) ->
                            arrayResize(
                                arraySlice(arrayConcat(arrayWithConstant(greatest(held_from - prev_held_from, 0),
                                                                         toUInt64(0)),
                                                       held),
                                           greatest(prev_held_from - held_from, 0) + 1, length(prev_held)),
                                length(prev_held), toUInt64(0)),
                        held_from, held, prev_held_from, prev_held) AS lined_up,
               arrayMap((first, count, prev_count, layout, prev_layout, prev_held, lined_up) ->
                            NOT first AND (count < prev_count OR (layout = prev_layout AND
                                arrayExists((before, now) -> before > now, prev_held, lined_up))),
                        first, count, prev_count, layout, prev_layout, prev_held, lined_up) AS went_down,
               arrayMap((restarted, start_ns, time_ns, first, prev_time_ns) ->
                            restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns),
                        restarted, start_ns, time_ns, first, prev_time_ns) AS from_start,
               arrayMap((count, sum, prev_count, prev_sum, from_start, went_down) ->
                            if(from_start OR went_down, sum / count, (sum - prev_sum) / (count - prev_count)),
                        count, sum, prev_count, prev_sum, from_start, went_down) AS means,
               arrayMap((time_ns, count, prev_count, restarted, from_start, went_down) ->
                            (from_start OR went_down OR NOT restarted)
                            AND if(from_start OR went_down, count, count - prev_count) > 0
                            AND time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)}),
                        time_ns, count, prev_count, restarted, from_start, went_down) AS used
        FROM (
            SELECT series, node_key, metric_key,
                   arraySort(point -> (tupleElement(point, 1), tupleElement(point, 2)),
                             arrayZip(groupArray(time_ns), groupArray(count), groupArray(start_ns), groupArray(sum),
                                      groupArray(layout), groupArray(held_from), groupArray(held))) AS sorted,
                   arrayFilter((point, next) -> tupleElement(point, 1) != next, sorted,
                               arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)),
                                             toInt64(-1)))
                       AS kept
            FROM raw_histograms
            WHERE temporality = 2
              AND (time_ns >= toUnixTimestamp64Nano({since:DateTime64(6)})
                   OR (series, time_ns) IN (SELECT series, max(time_ns) FROM raw_histograms
                                            WHERE temporality = 2
                                              AND time_ns < toUnixTimestamp64Nano({since:DateTime64(6)})
                                            GROUP BY series))
            GROUP BY series, node_key, metric_key
        )
    )
),
-- Each series' points in time order, one of those that share a time (a copy, or a second's two points of a
-- whole-second table; a cumulative series has one per time already), averaged per step in that order: runs of
-- points in one step, with no grouping of the fleet's steps. The branches hand each series' points over as arrays
-- (times and values beside each other), never as rows: the cumulative ones hold them in arrays already, and
-- expanding those into rows (an ARRAY JOIN) only for the same points to be grouped by series again took longer
-- than merging the arrays. A series' arrays (one, but for a metric stored as more than one kind) are merged
-- before the copies are dropped, so that a time two branches share counts once.
timed AS (
    SELECT series, node_key, metric_key,
           arraySort(arrayZip(groupArrayArray(times), groupArrayArray(values))) AS sorted,
           arrayFilter((point, next) -> tupleElement(point, 1) != next, sorted,
                       arrayPushBack(arrayPopFront(arrayMap(point -> tupleElement(point, 1), sorted)), toInt64(-1)))
               AS kept,
           arrayMap(point -> intDiv(intDiv(tupleElement(point, 1), 1000) - 946857600000000,
                                    toInt64(round({step_s:Float64} * 1e6))), kept) AS step_numbers,
           arrayMap((number, previous) -> number != previous, step_numbers,
                    arrayPushFront(arrayPopBack(step_numbers), step_numbers[1] - 1)) AS step_begins
    FROM (
        SELECT series, node_key, metric_key,
               groupArray(time_ns) AS times, groupArray(value) AS values
        FROM single
        GROUP BY series, node_key, metric_key
        UNION ALL
        SELECT series, node_key, metric_key, times, values
        FROM cumulative
        WHERE notEmpty(times)
        UNION ALL
        SELECT series, node_key, metric_key, times, values
        FROM cumulative_histograms
        WHERE notEmpty(times)
    )
    GROUP BY series, node_key, metric_key
)
SELECT series, node_key, metric_key,
       arrayZip(arrayMap(number -> fromUnixTimestamp64Micro(toInt64(946857600000000
                                       + number * toInt64(round({step_s:Float64} * 1e6))), 'UTC'),
                         arrayFilter((number, begins) -> begins, step_numbers, step_begins)),
                arrayMap(values -> arrayAvg(values),
                         arraySplit((value, begins) -> begins, arrayMap(point -> tupleElement(point, 2), kept),
                                    step_begins))) AS steps
FROM timed
