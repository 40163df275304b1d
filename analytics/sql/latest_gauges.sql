-- The newest value of each series of the gauges $metrics measured in [since, until): the gauges of /metrics.
SELECT metric, node, attributes, arg_max(value, ts) AS value
FROM samples
WHERE list_contains($metrics, metric) AND interval_s IS NULL AND ts >= $since AND ts < $until
GROUP BY ALL
ORDER BY metric, node, attributes
