-- Every catalog signal as one number per step, for all nodes in a time range, or only node $node when it is not
-- empty: gauges as measured, counters as a rate per second (increase / interval), histograms as their mean
-- (sum / count); only the metrics named in $metrics, or all when it is empty. Signals of the unknown node (sources
-- that named none) are no node's evidence, nor part of any node's fleet.
-- A series is keyed by its fingerprint, the 64-bit hash of signal_series.sql taken with $seed: grouping on one
-- integer rather than three strings halves the time and the memory of this query, and its names come from
-- signal_series.sql. node_key and metric_key, the hashes of its node and metric, let fleet_movement.sql count nodes
-- and metrics without the names.
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
SELECT hash(node, metric, attributes, $seed) AS series,
       hash(node) AS node_key,
       hash(metric) AS metric_key,
       time_bucket(to_seconds($step_s), ts) AS step,
       avg(value) AS value
FROM points
WHERE node <> $unknown_node AND ($node = '' OR node = $node) AND (len($metrics) = 0 OR list_contains($metrics, metric))
GROUP BY ALL
