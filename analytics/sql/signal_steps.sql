-- Every catalog signal as one number per step, for all nodes in a time range: gauges as measured, counters
-- as a rate per second (increase / interval), histograms as their mean (sum / count); only the metrics named
-- in $metrics, or all when it is empty. Signals of the unknown node (sources that named none) are no node's
-- evidence, nor part of any node's fleet.
WITH points AS (
    SELECT ts, node, metric, attributes, value
    FROM samples
    WHERE interval_s IS NULL AND ts >= $since AND ts < $until
    UNION ALL
    SELECT ts, node, metric, attributes, value / interval_s
    FROM samples
    WHERE interval_s > 0 AND ts >= $since AND ts < $until
    UNION ALL
    SELECT ts, node, metric, attributes, sum / count
    FROM histograms
    WHERE count > 0 AND ts >= $since AND ts < $until
)
SELECT node,
       metric,
       attributes,
       time_bucket(to_seconds($step_s), ts) AS step,
       avg(value) AS value
FROM points
WHERE node <> $unknown_node AND (len($metrics) = 0 OR list_contains($metrics, metric))
GROUP BY ALL
