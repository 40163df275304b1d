-- What retention deleted, per tier, service, node and latency bound (retired_requests), of the label sets the
-- request families export ($tiers, $services and $nodes, aligned), for /metrics to add to request_totals.sql's.
WITH exported AS (
    SELECT unnest($tiers::VARCHAR[]) AS tier, unnest($services::VARCHAR[]) AS service,
           unnest($nodes::VARCHAR[]) AS node
)
SELECT tier, service, node, bound_ms, requests, seconds, failed
FROM retired_requests SEMI JOIN exported USING (tier, service, node)
ORDER BY tier, service, node, bound_ms
