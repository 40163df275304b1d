-- The newest value of each series of the gauges $metrics measured in [since, until): the gauges of /metrics. A
-- series holding an attribute its family excludes ($excluded: the attribute names of each of $metrics) is left
-- out; of the others, only the first $max_series of each metric in their order are fetched, and `series` counts
-- them all, those past the cap being the ones left out.
WITH series AS (
    SELECT metric, node, attributes, arg_max(value, ts) AS value
    FROM samples
    WHERE list_contains($metrics, metric) AND interval_s IS NULL AND ts >= $since AND ts < $until
    GROUP BY ALL
)
SELECT metric, node, attributes, value, count(*) OVER (PARTITION BY metric) AS series
FROM series
WHERE NOT list_has_any(json_keys(attributes), ($excluded::VARCHAR[][])[list_position($metrics, metric)])
QUALIFY row_number() OVER (PARTITION BY metric ORDER BY node, attributes) <= $max_series
ORDER BY metric, node, attributes
