-- analytics/sql/latest_gauges.sql over the exporter's gauge table: the newest value of each series of the gauges
-- {metrics} measured in [since, until), a series holding an attribute its family excludes left out, the first
-- {max_series} of each metric in their order only; `series` counts them all.
SELECT metric, node, attributes, value, toInt64(count() OVER (PARTITION BY metric)) AS series
FROM (
    SELECT metric, node, attributes, argMax(value, ts) AS value
    FROM {{samples}}
    WHERE has({metrics:Array(String)}, metric) AND interval_s IS NULL
    GROUP BY metric, node, attributes
)
WHERE NOT hasAny(JSONExtractKeys(attributes),
                 arrayElement({excluded:Array(Array(String))}, indexOf({metrics:Array(String)}, metric)))
ORDER BY metric, node, attributes
LIMIT {max_series:UInt64} BY metric
