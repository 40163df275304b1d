-- The names of the series signal_steps.sql reads from the same range and node, with their fingerprints: the hash of
-- (node, metric, attributes, $seed). A fingerprint that names two series is taken again with another seed.
SELECT DISTINCT hash(node, metric, attributes, $seed) AS series, node, metric, attributes
FROM (
    SELECT node, metric, attributes FROM samples WHERE ts >= $since AND ts < $until
    UNION ALL
    SELECT node, metric, attributes FROM histograms WHERE ts >= $since AND ts < $until
)
WHERE node <> $unknown_node AND ($node = '' OR node = $node) AND (len($metrics) = 0 OR list_contains($metrics, metric))
