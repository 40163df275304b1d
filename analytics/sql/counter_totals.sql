-- The increase of each series of the counters $metrics over [since, until): the counters of /metrics.
SELECT metric, node, attributes, sum(value) AS value
FROM samples
WHERE list_contains($metrics, metric) AND interval_s IS NOT NULL AND ts >= $since AND ts < $until
GROUP BY ALL
ORDER BY metric, node, attributes
