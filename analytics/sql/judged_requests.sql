-- The requests each tier's SLI is judged on (docs/tiers.md), started in [since, until). By default, those at their
-- trace's entry, where users feel the tier: a request whose parent span is not stored (a root, or a caller that
-- sent no span), or whose parent is a root that is not a request (a gateway's or a client's own span). A tier the
-- spec names services for ($named_tiers) is judged at those services instead ($tier_services: 'TIER SERVICE'),
-- on the traces whose entry is of that tier: their requests take the entry's tier, since deeper services see no
-- header. A parent is looked for among the spans started up to $parent_lookback_s before the range.
WITH began AS (
    SELECT * FROM requests WHERE start_time >= $since AND start_time < $until
),
parents AS (
    SELECT trace_hi, trace_lo, span_id, 2 AS kind, parent_id FROM requests
    WHERE start_time >= $since - to_seconds($parent_lookback_s) AND start_time < $until
    UNION ALL
    SELECT trace_hi, trace_lo, span_id, kind, parent_id FROM spans
    WHERE start_time >= $since - to_seconds($parent_lookback_s) AND start_time < $until
),
entries AS (
    SELECT began.*
    FROM began LEFT JOIN parents
        ON parents.trace_hi = began.trace_hi AND parents.trace_lo = began.trace_lo
       AND parents.span_id = began.parent_id
    WHERE began.parent_id IS NULL OR parents.span_id IS NULL OR (parents.kind <> 2 AND parents.parent_id IS NULL)
)
SELECT * FROM entries WHERE NOT list_contains($named_tiers, tier)
UNION ALL
SELECT began.* REPLACE (entries.tier AS tier)
FROM began JOIN entries ON entries.trace_hi = began.trace_hi AND entries.trace_lo = began.trace_lo
WHERE list_contains($named_tiers, entries.tier) AND list_contains($tier_services, entries.tier || ' ' || began.service)
