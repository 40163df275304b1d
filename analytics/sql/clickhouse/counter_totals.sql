-- analytics/sql/counter_totals.sql over the exporter's sum table: the increase of each series of the counters
-- {metrics} over [since, until), cumulative sums taken as their per-interval increases.
SELECT metric, node, attributes, sum(value) AS value
FROM {{samples}}
WHERE has({metrics:Array(String)}, metric) AND interval_s IS NOT NULL
GROUP BY metric, node, attributes
ORDER BY metric, node, attributes
