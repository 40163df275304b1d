-- analytics/sql/latest_gauges.sql over the exporter's gauge table: the newest value of each series of the gauges
-- {metrics} measured in [since, until).
SELECT metric, node, attributes, argMax(value, ts) AS value
FROM {{samples}}
WHERE has({metrics:Array(String)}, metric) AND interval_s IS NULL
GROUP BY metric, node, attributes
ORDER BY metric, node, attributes
