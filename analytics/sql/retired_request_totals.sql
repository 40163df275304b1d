-- What retention deleted, per tier, service, node and latency bound (retired_requests), for /metrics' request
-- families to add to request_totals.sql's.
SELECT tier, service, node, bound_ms, requests, seconds, failed FROM retired_requests
ORDER BY tier, service, node, bound_ms
