-- Requests per tier, service and route started in [since, until), and how many of them since $recent: the
-- traffic the sampling policy shares its budget over. The tier is taken again by the spec in force (its
-- allow-list, else its default tier): the spec may have changed since the requests were stored.
SELECT CASE WHEN list_contains($allowed_tiers, tier) THEN tier ELSE $default_tier END AS tier,
       service,
       coalesce(route, '') AS route,
       count(*) AS requests,
       count(*) FILTER (WHERE start_time >= $recent) AS recent
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
