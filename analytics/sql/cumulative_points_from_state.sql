-- A series stored before cumulative_points existed has no kept running totals of its earlier resets: its last point
-- is kept without a reset flag, and nothing is placed at or before it. Run at every open for writing (after the
-- migrations): it adds nothing once every series has a kept point, which a series' first point always is.
INSERT INTO cumulative_points (node, metric, attributes, kind, start_ns, time_ns, reset, value, count, sum, buckets)
SELECT s.node, s.metric, s.attributes, s.kind, s.start_ns, s.time_ns, NULL, s.value, s.count, s.sum, s.buckets
FROM cumulative_state s
WHERE NOT EXISTS (SELECT 1 FROM cumulative_points p WHERE p.node = s.node AND p.metric = s.metric
                  AND p.attributes = s.attributes AND p.kind = s.kind)
