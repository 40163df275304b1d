-- What locality needs from the whole fleet, as analytics/sql/fleet_movement.sql computes it, on the steps of
-- signal_series_steps.sql, each series' steps in time order as one array: growth is read from it and the medians
-- are taken of it, with no window over the fleet's steps. Arrays are 1-based; an empty array has no median.
WITH readings AS (
    SELECT tupleElement(reading, 1) AS metric, tupleElement(reading, 2) AS direction,
           tupleElement(reading, 3) AS floor
    FROM (SELECT arrayJoin(arrayZip({readings:Array(String)}, {directions:Array(Float64)},
                                    {floors:Array(Float64)})) AS reading)
),
series_points AS (
    SELECT series_steps.series AS series, series_steps.node_key AS node_key, readings.metric AS level_metric,
           series_steps.steps AS level_points
    FROM {{signal_series_steps}} AS series_steps
    INNER JOIN readings ON series_steps.metric_key = reinterpretAsInt64(cityHash64(readings.metric))
),
-- A level, and its growth where it is read as growth: the relative change over growth_lag steps, per minute.
judged_points AS (
    SELECT series, node_key, tupleElement(variant, 1) AS metric, tupleElement(variant, 2) AS points
    FROM series_points
    ARRAY JOIN if(has({growth_metrics:Array(String)}, level_metric),
                  [(level_metric, level_points),
                   (concat(level_metric, {growth_suffix:String}),
                    arrayFilter(point -> isFinite(tupleElement(point, 2)),
                                arrayMap(i -> (tupleElement(level_points[i], 1),
                                               (tupleElement(level_points[i], 2)
                                                - tupleElement(level_points[i - {growth_lag:UInt64}], 2))
                                               / tupleElement(level_points[i - {growth_lag:UInt64}], 2)
                                               * {growth_per_min:Float64}),
                                         range({growth_lag:UInt64} + 1, length(level_points) + 1))))],
                  [(level_metric, level_points)]) AS variant
),
judged AS (
    SELECT series, node_key, metric,
           arraySort(arrayMap(point -> tupleElement(point, 2),
                              arrayFilter(point -> tupleElement(point, 1) < {analysis_start:DateTime64(6)}, points)))
               AS baseline,
           arraySort(arrayMap(point -> tupleElement(point, 2),
                              arrayFilter(point -> tupleElement(point, 1) >= {incident_start:DateTime64(6)}, points)))
               AS during
    FROM judged_points
    WHERE length(baseline) >= {min_baseline_steps:UInt64}
      AND arrayExists(point -> tupleElement(point, 1) >= {analysis_start:DateTime64(6)}, points)
),
levels_and_scales AS (
    SELECT judged.node_key AS node_key, judged.metric AS metric, readings.direction AS direction,
           baseline[toUInt64(floor((length(baseline) - 1) * 0.5)) + 1]
               + (baseline[toUInt64(ceil((length(baseline) - 1) * 0.5)) + 1]
                  - baseline[toUInt64(floor((length(baseline) - 1) * 0.5)) + 1]) * 0.5 AS level,
           if(empty(during), NULL,
              during[toUInt64(floor((length(during) - 1) * 0.5)) + 1]
                  + (during[toUInt64(ceil((length(during) - 1) * 0.5)) + 1]
                     - during[toUInt64(floor((length(during) - 1) * 0.5)) + 1]) * 0.5) AS observed,
           greatest((baseline[toUInt64(floor((length(baseline) - 1) * 0.75 + 0.5)) + 1]
                     - baseline[toUInt64(floor((length(baseline) - 1) * 0.25 + 0.5)) + 1]) / {iqr_to_sigma:Float64},
                    readings.floor / {threshold:Float64}, {min_scale:Float64}) AS scale
    FROM judged INNER JOIN readings ON judged.metric = readings.metric
),
moves AS (
    SELECT node_key, metric, ifNull((observed - level) / scale * direction > {threshold:Float64}, false) AS moved
    FROM levels_and_scales
)
SELECT node_key, metric, toBool(max(moved)) AS moved
FROM moves
GROUP BY node_key, metric
