-- The token timings of the requests started in [since, until) per measure, tier, service, node and bucket, with
-- their seconds: the cumulative token families of /metrics, as request_totals.sql gives the request families. Per
-- measure, only its first $max_series label sets (tier, service, node) in their order are aggregated; `label_sets`
-- (the same on every row of a measure) counts them all, those past the cap being the ones left out. A time's bucket
-- is the number of its measure's bounds ($ttft_bounds_ms, $tpot_bounds_ms or $queue_bounds_ms) below it.
WITH label_sets AS MATERIALIZED (
    SELECT DISTINCT measure, tier, service, node FROM {{token_timings}}
),
kept AS (
    SELECT measure, tier, service, node FROM label_sets
    QUALIFY row_number() OVER (PARTITION BY measure ORDER BY tier, service, node) <= $max_series
),
counted AS (
    SELECT measure, count(*) AS label_sets FROM label_sets GROUP BY measure
)
SELECT measure, tier, service, node,
       len(list_filter(CASE measure WHEN 'ttft' THEN $ttft_bounds_ms::DOUBLE[]
                                    WHEN 'tpot' THEN $tpot_bounds_ms::DOUBLE[]
                                    ELSE $queue_bounds_ms::DOUBLE[] END, lambda b: b < ms)) AS bucket,
       count(*) AS requests,
       sum(ms) / 1000.0 AS seconds,
       label_sets
FROM {{token_timings}} SEMI JOIN kept USING (measure, tier, service, node) JOIN counted USING (measure)
GROUP BY ALL
ORDER BY measure, tier, service, node, bucket
