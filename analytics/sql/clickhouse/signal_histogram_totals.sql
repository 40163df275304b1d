-- analytics/sql/signal_histogram_totals.sql over the exporter's exponential-histogram table: each series of the
-- histograms {metrics} summed over [since, until), its buckets added slot by slot into the store's 48 fixed slots,
-- a series holding an attribute its family excludes left out, the first {max_series} of each metric in their
-- order only; `series` counts them all.
SELECT metric, node, attributes, count, sum,
       arrayMap(slot -> arraySum(arrayFilter((n, s) -> s = slot, totals.2, totals.1)), range(48)) AS buckets,
       toInt64(count() OVER (PARTITION BY metric)) AS series
FROM (
    SELECT metric, node, attributes, toInt64(sum(count)) AS count, sum(sum) AS sum,
           sumMap(bucket_slots, bucket_counts) AS totals
    FROM {{histograms}}
    WHERE has({metrics:Array(String)}, metric)
    GROUP BY metric, node, attributes
)
WHERE NOT hasAny(JSONExtractKeys(attributes),
                 arrayElement({excluded:Array(Array(String))}, indexOf({metrics:Array(String)}, metric)))
ORDER BY metric, node, attributes
LIMIT {max_series:UInt64} BY metric
