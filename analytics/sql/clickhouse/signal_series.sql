-- The names of the series signal_steps.sql reads from the same range and node, with their fingerprints, as
-- analytics/sql/signal_series.sql gives them (here the hash is ClickHouse's cityHash64, as a signed integer).
-- Each table's names are grouped first and hashed after: once per series, not once per point.
SELECT DISTINCT reinterpretAsInt64(cityHash64(node, metric, attributes, {seed:UInt8})) AS series, node, metric, attributes
FROM (
    SELECT SloscopeNode AS node, MetricName AS metric, SloscopeAttributes AS attributes
    FROM otel_metrics_gauge
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
      AND SloscopeNode != {unknown_node:String} AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
    GROUP BY node, metric, attributes
    UNION ALL
    SELECT SloscopeNode, MetricName, SloscopeAttributes
    FROM otel_metrics_sum
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
      AND SloscopeNode != {unknown_node:String} AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
    GROUP BY SloscopeNode, MetricName, SloscopeAttributes
    UNION ALL
    SELECT SloscopeNode, MetricName, SloscopeAttributes
    FROM otel_metrics_exponential_histogram
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
      AND SloscopeNode != {unknown_node:String} AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
    GROUP BY SloscopeNode, MetricName, SloscopeAttributes
    UNION ALL
    SELECT SloscopeNode, MetricName, SloscopeAttributes
    FROM otel_metrics_histogram
    WHERE TimeUnix >= {since:DateTime64(6)} AND TimeUnix < {until:DateTime64(6)}
      AND SloscopeNode != {unknown_node:String} AND ({node:String} = '' OR SloscopeNode = {node:String})
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, MetricName))
    GROUP BY SloscopeNode, MetricName, SloscopeAttributes
)
