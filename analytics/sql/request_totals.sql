-- Requests started in [since, until) per tier, service, node and latency bucket, with their seconds and failures:
-- the cumulative request families of /metrics. Only the first $max_series label sets (tier, service, node) in their
-- order are aggregated, so that what is fetched stays within the cap whatever the store holds; `label_sets` (the
-- same on every row) counts them all, those past the cap being the ones left out. A request's bucket is the number
-- of $bounds_ms below its duration, so bucket 0 holds those at or under the first bound and len($bounds_ms) those
-- above the last.
WITH label_sets AS MATERIALIZED (
    SELECT DISTINCT tier, service, node FROM requests WHERE start_time >= $since AND start_time < $until
),
kept AS (
    SELECT tier, service, node FROM label_sets ORDER BY tier, service, node LIMIT $max_series
),
counted AS (
    SELECT count(*) AS label_sets FROM label_sets
)
SELECT tier, service, node,
       len(list_filter($bounds_ms, lambda b: b < duration_ms)) AS bucket,
       count(*) AS requests,
       coalesce(sum(duration_ms), 0) / 1000.0 AS seconds,
       count(*) FILTER (WHERE failed) AS failed,
       label_sets
FROM requests SEMI JOIN kept USING (tier, service, node) CROSS JOIN counted
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
ORDER BY tier, service, node, bucket
