-- analytics/sql/requests_by_route.sql over the exporter's otel_traces, whose tiers the requests relation takes by
-- the spec in force: requests per tier, service and route in [since, until), and how many since {recent}.
SELECT tier, service, route, toInt64(count()) AS requests,
       toInt64(countIf(start_time >= {recent:DateTime64(6)})) AS recent
FROM {{requests}}
GROUP BY tier, service, route
