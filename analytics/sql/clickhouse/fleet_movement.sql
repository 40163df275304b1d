-- What locality needs from the whole fleet, as analytics/sql/fleet_movement.sql computes it, on the steps of
-- signal_steps.sql. Arrays are 1-based; an empty array has no median.
WITH steps AS {{signal_steps}},
readings AS (
    SELECT tupleElement(reading, 1) AS metric, tupleElement(reading, 2) AS direction,
           tupleElement(reading, 3) AS floor
    FROM (SELECT arrayJoin(arrayZip({readings:Array(String)}, {directions:Array(Float64)},
                                    {floors:Array(Float64)})) AS reading)
),
levels AS (
    SELECT steps.series AS series, steps.node_key AS node_key, readings.metric AS level_metric, steps.step AS step,
           steps.value AS level,
           lagInFrame(level, {growth_lag:UInt64}) OVER earlier AS previous,
           row_number() OVER earlier > {growth_lag:UInt64} AND has({growth_metrics:Array(String)}, level_metric)
               AS grows,
           (level - previous) / previous * {growth_per_min:Float64} AS growth
    FROM steps INNER JOIN readings ON steps.metric_key = reinterpretAsInt64(cityHash64(readings.metric))
    WINDOW earlier AS (PARTITION BY steps.series ORDER BY steps.step
                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
-- Each step of a level, and of its growth where it has one: the steps are read once (a CTE named twice would be
-- computed twice).
series_steps AS (
    SELECT series, node_key, step, tupleElement(point, 1) AS metric, tupleElement(point, 2) AS value
    FROM levels
    ARRAY JOIN if(grows AND isFinite(growth),
                  [(level_metric, level), (concat(level_metric, {growth_suffix:String}), growth)],
                  [(level_metric, level)]) AS point
),
judged AS (
    SELECT series, node_key, metric,
           arraySort(groupArrayIf(value, step < {analysis_start:DateTime64(6)})) AS baseline,
           arraySort(groupArrayIf(value, step >= {incident_start:DateTime64(6)})) AS during
    FROM series_steps
    GROUP BY series, node_key, metric
    HAVING length(baseline) >= {min_baseline_steps:UInt64} AND countIf(step >= {analysis_start:DateTime64(6)}) > 0
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
