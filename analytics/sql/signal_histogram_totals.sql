-- Each series of the histograms $metrics summed over [since, until): count, sum and the store's fixed
-- power-of-two buckets added element by element (the signal histograms of /metrics).
SELECT metric, node, attributes, sum(count) AS count, sum(sum) AS sum,
       list_reduce(list(buckets), lambda a, b: list_transform(list_zip(a, b), lambda p: p[1] + p[2])) AS buckets
FROM histograms
WHERE list_contains($metrics, metric) AND ts >= $since AND ts < $until
GROUP BY ALL
ORDER BY metric, node, attributes
