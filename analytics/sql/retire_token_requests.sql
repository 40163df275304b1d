-- Before retention deletes the requests started before $cutoff (and from $epoch, the store's first instant): their
-- token timings added to retired_token_requests as retire_requests.sql adds their durations, per measure at each
-- of its bounds ($ttft_bounds_ms, $tpot_bounds_ms, $queue_bounds_ms) and at 'Infinity', cumulative. A bound without
-- a row yet starts from the count of the highest bound under it, so that no counter goes down.
INSERT OR REPLACE INTO retired_token_requests
WITH bounds AS (
    SELECT measure, unnest(list_append(bounds_ms, 'Infinity'::DOUBLE)) AS bound_ms
    FROM (VALUES ('ttft', $ttft_bounds_ms::DOUBLE[]), ('tpot', $tpot_bounds_ms::DOUBLE[]),
                 ('queue', $queue_bounds_ms::DOUBLE[])) AS measures (measure, bounds_ms)
),
added AS (
    SELECT measure, gone.tier, gone.service, gone.node, bounds.bound_ms,
           count(*) FILTER (WHERE gone.ms <= bounds.bound_ms) AS requests,
           coalesce(sum(gone.ms) FILTER (WHERE gone.ms <= bounds.bound_ms), 0) / 1000.0 AS seconds
    FROM {{token_timings epoch cutoff}} AS gone JOIN bounds USING (measure)
    GROUP BY ALL
),
before AS (
    SELECT added.measure, added.tier, added.service, added.node, added.bound_ms,
           coalesce(max(r.requests), 0) AS requests, coalesce(max(r.seconds), 0) AS seconds
    FROM added LEFT JOIN retired_token_requests AS r
        ON r.measure = added.measure AND r.tier = added.tier AND r.service = added.service AND r.node = added.node
           AND r.bound_ms <= added.bound_ms
    GROUP BY ALL
)
SELECT measure, tier, service, node, bound_ms, before.requests + added.requests, before.seconds + added.seconds
FROM added JOIN before USING (measure, tier, service, node, bound_ms)
