-- The exporter's SERVER spans in [since, until) as requests (exporter_spans.sql, which says how each column is read).
-- Parameters: allowed_tiers, default_tier, since, until.
SELECT *
FROM {{exporter_spans}}
WHERE kind = 2
