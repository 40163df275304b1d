-- Every catalog signal as one number per step, as analytics/sql/signal_steps.sql computes it: the steps of
-- signal_series_steps.sql (which says what they are), a row each.
SELECT series, node_key, metric_key, tupleElement(step_value, 1) AS step, tupleElement(step_value, 2) AS value
FROM {{signal_series_steps}}
ARRAY JOIN steps AS step_value
