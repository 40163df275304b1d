-- Remediation decisions by alert, action, target and decision, from the audit trail: the first $max_series.
SELECT alert, coalesce(action, '') AS action, coalesce(target, '') AS target, decision, count(*) AS decisions
FROM remediation_audit
GROUP BY ALL
ORDER BY ALL
LIMIT $max_series
