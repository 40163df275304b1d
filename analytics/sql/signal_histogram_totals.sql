-- Each series of the histograms $metrics summed over [since, until): count, sum and the store's fixed
-- power-of-two buckets added element by element (the signal histograms of /metrics). A series holding an attribute
-- its family excludes ($excluded: the attribute names of each of $metrics) is left out; of the others, only the
-- first $max_series of each metric in their order are fetched, and `series` counts them all.
WITH series AS (
    SELECT metric, node, attributes, sum(count) AS count, sum(sum) AS sum,
           list_reduce(list(buckets), lambda a, b: list_transform(list_zip(a, b), lambda p: p[1] + p[2])) AS buckets
    FROM histograms
    WHERE list_contains($metrics, metric) AND ts >= $since AND ts < $until
    GROUP BY ALL
)
SELECT metric, node, attributes, count, sum, buckets, count(*) OVER (PARTITION BY metric) AS series
FROM series
WHERE NOT list_has_any(json_keys(attributes), ($excluded::VARCHAR[][])[list_position($metrics, metric)])
QUALIFY row_number() OVER (PARTITION BY metric ORDER BY node, attributes) <= $max_series
ORDER BY metric, node, attributes
