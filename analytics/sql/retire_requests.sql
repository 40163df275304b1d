-- Before retention deletes the requests started before $cutoff: their counts added to retired_requests at each
-- of $bounds_ms and at 'Infinity', cumulative (those at or under the bound). A bound without a row yet starts from
-- what the families read there: the count of the highest bound under it, so that no counter goes down.
INSERT OR REPLACE INTO retired_requests
WITH bounds AS (
    SELECT unnest(list_append($bounds_ms::DOUBLE[], 'Infinity'::DOUBLE)) AS bound_ms
),
gone AS (
    SELECT tier, service, node, duration_ms, failed FROM requests WHERE start_time < $cutoff
),
added AS (
    SELECT gone.tier, gone.service, gone.node, bounds.bound_ms,
           count(*) FILTER (WHERE gone.duration_ms <= bounds.bound_ms) AS requests,
           coalesce(sum(gone.duration_ms) FILTER (WHERE gone.duration_ms <= bounds.bound_ms), 0) / 1000.0 AS seconds,
           count(*) FILTER (WHERE gone.failed AND gone.duration_ms <= bounds.bound_ms) AS failed
    FROM gone CROSS JOIN bounds
    GROUP BY ALL
),
before AS (
    SELECT added.tier, added.service, added.node, added.bound_ms,
           coalesce(max(r.requests), 0) AS requests, coalesce(max(r.seconds), 0) AS seconds,
           coalesce(max(r.failed), 0) AS failed
    FROM added LEFT JOIN retired_requests AS r
        ON r.tier = added.tier AND r.service = added.service AND r.node = added.node AND r.bound_ms <= added.bound_ms
    GROUP BY ALL
)
SELECT tier, service, node, bound_ms, before.requests + added.requests, before.seconds + added.seconds,
       before.failed + added.failed
FROM added JOIN before USING (tier, service, node, bound_ms)
