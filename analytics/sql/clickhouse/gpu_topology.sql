-- The node each GPU (hw.id) was last seen on, from the GPU points of the exporter's gauge and sum tables (the last
-- node a GPU was seen on needs no delta, so the whole history is read without samples.sql's window functions); the
-- GPU seen last comes last.
SELECT argMax(SloscopeNode, TimeUnix) AS node,
       Attributes['hw.id'] AS gpu_id
FROM (
    SELECT SloscopeNode, Attributes, TimeUnix FROM otel_metrics_gauge
    WHERE MetricName LIKE 'hw.gpu.%' AND mapContains(Attributes, 'hw.id') AND SloscopeKept
    UNION ALL
    SELECT SloscopeNode, Attributes, TimeUnix FROM otel_metrics_sum
    WHERE MetricName LIKE 'hw.gpu.%' AND mapContains(Attributes, 'hw.id') AND SloscopeKept
)
GROUP BY gpu_id
ORDER BY max(TimeUnix), gpu_id
