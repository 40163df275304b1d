-- What retention deleted of the requests' token timings, per measure, tier, service, node and bound
-- (retired_token_requests), of the label sets the token families export ($measures, $tiers, $services and $nodes,
-- aligned), for /metrics to add to token_totals.sql's.
WITH exported AS (
    SELECT unnest($measures::VARCHAR[]) AS measure, unnest($tiers::VARCHAR[]) AS tier,
           unnest($services::VARCHAR[]) AS service, unnest($nodes::VARCHAR[]) AS node
)
SELECT measure, tier, service, node, bound_ms, requests, seconds
FROM retired_token_requests SEMI JOIN exported USING (measure, tier, service, node)
ORDER BY measure, tier, service, node, bound_ms
