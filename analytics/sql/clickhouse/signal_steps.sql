-- Every catalog signal as one number per step, as analytics/sql/signal_steps.sql computes it: gauges as measured,
-- counters as a rate per second, histograms as their mean; only the metrics named in {metrics}, or all when it is
-- empty; the unknown node's signals left out; each series keyed by the fingerprint of signal_series.sql, with its
-- names only {by_name}.
WITH points AS (
    SELECT ts, node, metric, attributes, if(interval_s IS NULL, value, value / interval_s) AS value
    FROM {{samples}}
    WHERE (interval_s IS NULL OR interval_s > 0) AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, metric))
    UNION ALL
    SELECT ts, node, metric, attributes, sum / count
    FROM {{histograms}}
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND (empty({metrics:Array(String)}) OR has({metrics:Array(String)}, metric))
)
-- Named apart inside, since ClickHouse would read an alias that repeats a column's name in place of the column.
SELECT series, name_node AS node, name_metric AS metric, name_attributes AS attributes, step, value
FROM (
    SELECT reinterpretAsInt64(cityHash64(node, metric, attributes)) AS series,
           if({by_name:Bool}, node, NULL) AS name_node,
           if({by_name:Bool}, metric, NULL) AS name_metric,
           if({by_name:Bool}, attributes, NULL) AS name_attributes,
           fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(ts) - 946857600000000,
                                    toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                    'UTC') AS step,
           avg(value) AS value
    FROM points
    WHERE node != {unknown_node:String}
    GROUP BY series, name_node, name_metric, name_attributes, step
)
