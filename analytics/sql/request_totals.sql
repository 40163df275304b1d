-- Requests started in [since, until) per tier, service, node and latency bucket, with their seconds and failures:
-- the cumulative request families of /metrics. A request's bucket is the number of $bounds_ms below its duration,
-- so bucket 0 holds those at or under the first bound and len($bounds_ms) those above the last.
SELECT tier, service, node,
       len(list_filter($bounds_ms, lambda b: b < duration_ms)) AS bucket,
       count(*) AS requests,
       coalesce(sum(duration_ms), 0) / 1000.0 AS seconds,
       count(*) FILTER (WHERE failed) AS failed
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
ORDER BY tier, service, node, bucket
