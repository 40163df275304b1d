-- The histograms of analytics/sql/schema.sql in [since, until), read from the exporter's exponential-histogram
-- table and its explicit-bucket one (the inference engines' Prometheus histograms, and metrics an SLO spec
-- declares, which the decoders keep folded into the same slots): delta points as they are, cumulative ones as
-- per-interval deltas by the rules of samples.sql, where a bucket that went down (at an unchanged layout: scale
-- and offset, or bounds) is a reset too. The buckets come as the store's fixed slots (sloscope/records.py: scale 0
-- from 2**-40, 48 slots, the zero bucket in the first; folded as receiver/otlp_common.py's scale0_buckets and
-- explicit_buckets fold them: an explicit bucket goes to the slot of its upper bound, the unbounded last one to
-- that of its lower bound, one bounded at or below 0 to the first) in sparse form: bucket_counts[i] is added to
-- slot bucket_slots[i], a cumulative point's previous buckets with their sign turned. A point stored twice counts
-- once; only the range is read, with the same 5 minutes before it as samples.sql. Points with no count are
-- dropped, as the store drops them.
-- ClickHouse inlines `points` at each use: each use picks its temporality before dropping repeated points, so
-- the filter reaches the table and the delta and cumulative points are each read once.
-- Parameters: since, until. Inlined by the queries of this folder where they name it in double braces.
WITH points AS (
    SELECT SloscopeNode AS node,
           MetricName AS metric,
           SloscopeAttributes AS attributes,
           toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)) AS start_ns,
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)) AS time_ns,
           toInt64(Count) AS count,
           Sum AS sum,
           cityHash64(Scale, PositiveOffset) AS layout,
           arrayConcat([ZeroCount], PositiveBucketCounts) AS buckets,
           arrayMap(j -> if(j = 1, 0, least(greatest(toInt64(floor((PositiveOffset + j - 2) * exp2(-Scale))) + 40, 0),
                                            47)),
                    arrayEnumerate(buckets)) AS slots,
           AggregationTemporality AS temporality
    FROM otel_metrics_exponential_histogram
    WHERE bitAnd(Flags, 1) = 0
      AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
    UNION ALL
    SELECT SloscopeNode, MetricName, SloscopeAttributes,
           toUnixTimestamp64Nano(toDateTime64(StartTimeUnix, 9)),
           toUnixTimestamp64Nano(toDateTime64(TimeUnix, 9)),
           toInt64(Count), Sum, cityHash64(ExplicitBounds), BucketCounts,
           arrayMap(edge -> if(edge > 0, least(greatest(toInt64(ceil(log2(edge))) - 1 + 40, 0), 47), 0),
                    arrayMap(j -> if(j <= length(ExplicitBounds), ExplicitBounds[j],
                                     if(empty(ExplicitBounds), 0., ExplicitBounds[-1])),
                             arrayEnumerate(BucketCounts))),
           AggregationTemporality
    FROM otel_metrics_histogram
    WHERE bitAnd(Flags, 1) = 0
      AND TimeUnix >= {since:DateTime64(6)} - INTERVAL 5 MINUTE AND TimeUnix < {until:DateTime64(6)}
),
cumulative AS (
    SELECT node, metric, attributes, start_ns, time_ns, count, sum, buckets, slots,
           row_number() OVER series = 1 AS first,
           lagInFrame(start_ns) OVER series AS prev_start_ns,
           lagInFrame(time_ns) OVER series AS prev_time_ns,
           lagInFrame(count) OVER series AS prev_count,
           lagInFrame(sum) OVER series AS prev_sum,
           lagInFrame(layout) OVER series AS prev_layout,
           lagInFrame(buckets) OVER series AS prev_buckets,
           lagInFrame(slots) OVER series AS prev_slots,
           greatest(length(buckets), length(prev_buckets)) AS width,
           first OR start_ns != prev_start_ns AS restarted,
           NOT first AND (count < prev_count OR (layout = prev_layout AND
               arrayExists((now, before) -> now < before, arrayResize(buckets, width),
                           arrayResize(prev_buckets, width))))
               AS went_down,
           restarted AND start_ns > 0 AND start_ns < time_ns AND (first OR start_ns >= prev_time_ns) AS from_start
    FROM (SELECT * FROM points WHERE temporality = 2 LIMIT 1 BY node, metric, attributes, time_ns)
    WINDOW series AS (PARTITION BY node, metric, attributes ORDER BY time_ns
                      ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT * FROM (
    SELECT fromUnixTimestamp64Micro(intDiv(time_ns, 1000), 'UTC') AS ts, node, metric, attributes,
           if(start_ns > 0 AND start_ns < time_ns, (time_ns - start_ns) / 1e9, NULL) AS interval_s, count, sum,
           slots AS bucket_slots, arrayMap(n -> toInt64(n), buckets) AS bucket_counts
    FROM points
    WHERE temporality = 1
    LIMIT 1 BY node, metric, attributes, time_ns
    UNION ALL
    SELECT fromUnixTimestamp64Micro(intDiv(time_ns, 1000), 'UTC'), node, metric, attributes,
           if(from_start, (time_ns - start_ns) / 1e9, (time_ns - prev_time_ns) / 1e9),
           if(from_start OR went_down, count, count - prev_count),
           if(from_start OR went_down, sum, sum - prev_sum),
           if(from_start OR went_down, slots, arrayConcat(slots, prev_slots)),
           if(from_start OR went_down, arrayMap(n -> toInt64(n), buckets),
              arrayConcat(arrayMap(n -> toInt64(n), buckets), arrayMap(n -> -toInt64(n), prev_buckets)))
    FROM cumulative
    WHERE from_start OR went_down OR NOT restarted
)
WHERE count > 0 AND ts >= {since:DateTime64(6)}
