-- Every catalog signal as one number per step, as analytics/sql/signal_steps.sql computes it: gauges as measured,
-- counters as a rate per second, histograms as their mean; only the metrics named in {metrics}, or all when it is
-- empty; the unknown node's signals left out.
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
SELECT node,
       metric,
       attributes,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(ts) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS step,
       avg(value) AS value
FROM points
WHERE node != {unknown_node:String}
GROUP BY node, metric, attributes, step
