-- analytics/sql/counter_totals.sql over the exporter's sum table: the increase of each series of the counters
-- {metrics} over [since, until), cumulative sums taken as their per-interval increases, a series holding an
-- attribute its family excludes left out, the first {max_series} of each metric in their order only; `series`
-- counts them all.
SELECT metric, node, attributes, value, toInt64(count() OVER (PARTITION BY metric)) AS series
FROM (
    SELECT metric, node, attributes, sum(value) AS value
    FROM {{samples}}
    WHERE has({metrics:Array(String)}, metric) AND interval_s IS NOT NULL
    GROUP BY metric, node, attributes
)
WHERE NOT hasAny(JSONExtractKeys(attributes),
                 arrayElement({excluded:Array(Array(String))}, indexOf({metrics:Array(String)}, metric)))
ORDER BY metric, node, attributes
LIMIT {max_series:UInt64} BY metric
