-- analytics/sql/judged_requests.sql over the exporter's otel_traces: the requests each tier's SLI is judged on,
-- started in [since, until): those at their trace's entry (no stored parent, or a parent that is a root and not a
-- request), or, for a tier the spec names services for, those services' requests of the traces whose entry is of
-- that tier, with the entry's tier. A parent is looked for among the spans started up to {parent_lookback_s}
-- before the range.
-- Parameters: allowed_tiers, default_tier, since, until, named_tiers, tier_services, parent_lookback_s.
WITH entries AS (
    SELECT began.trace_id AS entry_trace, any(began.tier) AS entry_tier, groupArray(began.span_word) AS entry_spans
    FROM {{requests}} AS began
    LEFT JOIN (
        SELECT trace_id, span_word, kind AS parent_kind, parent_id AS grandparent
        FROM {{exporter_spans}}
        WHERE start_time >= {since:DateTime64(6)} - toIntervalMicrosecond(toInt64({parent_lookback_s:Float64} * 1e6))
    ) AS parents ON parents.trace_id = began.trace_id AND parents.span_word = began.parent_id
    -- An unmatched row of a LEFT JOIN holds its columns' defaults: an empty trace id.
    WHERE began.parent_id IS NULL OR parents.trace_id = '' OR (parents.parent_kind != 2 AND parents.grandparent IS NULL)
    GROUP BY began.trace_id
)
-- One select with the tier computed beside the request's own: ClickHouse (26.9) gave wrong counts when a filter
-- or grouping on `tier` met a union whose branch replaced it.
SELECT requests.* EXCEPT (tier),
       if(has({named_tiers:Array(String)}, entries.entry_tier), entries.entry_tier, requests.tier) AS tier
FROM {{requests}} AS requests INNER JOIN entries ON entries.entry_trace = requests.trace_id
WHERE if(has({named_tiers:Array(String)}, entries.entry_tier),
         has({tier_services:Array(String)}, concat(entries.entry_tier, ' ', requests.service)),
         has(entries.entry_spans, requests.span_word))
