-- What locality needs from the whole fleet (attribution.Fleet), computed where the signals are, so that only an
-- incident's own node leaves the engine step by step: one row per node (node_key, the hash of its name) and metric
-- with a series that could be judged, and whether one of them moved during the incident.
-- A series is judged as attribution.series_scores judges it, on its steps of signal_steps.sql:
-- - its baseline is its steps before $analysis_start, at least $min_baseline_steps of them: their median, and their
--   quartiles at the nearest rank (polars' default), give the level and the scale (the interquartile range over
--   $iqr_to_sigma, at least the metric's noise floor over $threshold and $min_scale);
-- - it needs a step from $analysis_start on; it moved when the median of its steps from $incident_start is more
--   than $threshold scales from the level in the metric's harmful direction.
-- $readings lists the metrics with their $directions and $floors; the growth of $growth_metrics (the relative change
-- per minute over $growth_lag steps, attribution._growth_series) is a series of its own, named with $growth_suffix.
-- A median is the mean of the middle two at an even count, as lo + (hi - lo) * 0.5, as polars computes it.
WITH steps AS {{signal_steps}},
readings AS (
    SELECT unnest($readings) AS metric, unnest($directions) AS direction, unnest($floors) AS floor
),
levels AS MATERIALIZED (
    SELECT steps.series, steps.node_key, readings.metric, steps.step, steps.value
    FROM steps JOIN readings ON steps.metric_key = hash(readings.metric)
),
growth AS (
    SELECT series, node_key, metric || $growth_suffix AS metric, step,
           (value - previous) / previous * $growth_per_min AS value
    FROM (SELECT *, lag(value, $growth_lag) OVER (PARTITION BY series ORDER BY step) AS previous
          FROM levels WHERE list_contains($growth_metrics, metric))
    WHERE previous IS NOT NULL
),
series_steps AS (
    SELECT * FROM levels
    UNION ALL
    SELECT * FROM growth WHERE isfinite(value)
),
judged AS (
    SELECT series, node_key, metric,
           list_sort(list(value) FILTER (WHERE step < $analysis_start)) AS baseline,
           list_sort(list(value) FILTER (WHERE step >= $incident_start)) AS during
    FROM series_steps
    GROUP BY series, node_key, metric
    HAVING len(baseline) >= $min_baseline_steps AND count(*) FILTER (WHERE step >= $analysis_start) > 0
),
levels_and_scales AS (
    SELECT judged.node_key, judged.metric, readings.direction,
           baseline[floor((len(baseline) - 1) * 0.5)::BIGINT + 1]
               + (baseline[ceil((len(baseline) - 1) * 0.5)::BIGINT + 1]
                  - baseline[floor((len(baseline) - 1) * 0.5)::BIGINT + 1]) * 0.5 AS level,
           during[floor((len(during) - 1) * 0.5)::BIGINT + 1]
               + (during[ceil((len(during) - 1) * 0.5)::BIGINT + 1]
                  - during[floor((len(during) - 1) * 0.5)::BIGINT + 1]) * 0.5 AS observed,
           greatest((baseline[floor((len(baseline) - 1) * 0.75 + 0.5)::BIGINT + 1]
                     - baseline[floor((len(baseline) - 1) * 0.25 + 0.5)::BIGINT + 1]) / $iqr_to_sigma,
                    readings.floor / $threshold, $min_scale) AS scale
    FROM judged JOIN readings ON judged.metric = readings.metric
),
moves AS (
    SELECT node_key, metric, coalesce((observed - level) / scale * direction > $threshold, false) AS moved
    FROM levels_and_scales
)
SELECT node_key, metric, bool_or(moved) AS moved
FROM moves
GROUP BY node_key, metric
