-- Every tier's SLI per (service, node) and step in one pass over the requests it is judged on, as
-- analytics/sql/sli_windows.sql computes it: windows aligned as DuckDB's time_bucket aligns them (from
-- 2000-01-03); only [since, until) is read.
-- A span stored twice counts once: its copies fall in one group (they share tier, service, node and start), so each
-- group counts its distinct span keys, where requests.sql would deduplicate the whole range at once. Each group
-- collects its keys in an array and counts them as it is finished: a hash set per group (uniqExact) held the
-- whole fleet's sets at once, 0.1 GiB more, and was slower.
-- Two spans of one group whose keys collide (a chance of about n^2 / 2^65 for n spans) would count once.
SELECT tier,
       service,
       node,
       fromUnixTimestamp64Micro(toInt64(946857600000000 + intDiv(toUnixTimestamp64Micro(start_time) - 946857600000000,
                                toInt64(round({step_s:Float64} * 1e6))) * toInt64(round({step_s:Float64} * 1e6))),
                                'UTC') AS window_start,
       toInt64(arrayUniq(groupArray(span_key))) AS requests,
       toInt64(arrayUniq(groupArrayIf(span_key, failed))) AS failures,
       toInt64(arrayUniq(groupArrayIf(
           span_key, duration_ms > if(has({service_keys:Array(String)}, concat(tier, ' ', service)),
                                      {service_thresholds_ms:Array(Float64)}[
                                          indexOf({service_keys:Array(String)}, concat(tier, ' ', service))],
                                      {thresholds_ms:Array(Float64)}[indexOf({tiers:Array(String)}, tier)])))) AS slow,
       toInt64(arrayUniq(groupArrayIf(span_key, ttft_ms IS NOT NULL))) AS ttft_requests,
       toInt64(arrayUniq(groupArrayIf(
           span_key, ttft_ms > {ttft_thresholds_ms:Array(Float64)}[indexOf({tiers:Array(String)}, tier)]))) AS ttft_slow,
       toInt64(arrayUniq(groupArrayIf(span_key, tpot_ms IS NOT NULL))) AS tpot_requests,
       toInt64(arrayUniq(groupArrayIf(
           span_key, tpot_ms > {tpot_thresholds_ms:Array(Float64)}[indexOf({tiers:Array(String)}, tier)]))) AS tpot_slow,
       toInt64(arrayUniq(groupArrayIf(span_key, queue_ms IS NOT NULL))) AS queue_requests,
       toInt64(arrayUniq(groupArrayIf(
           span_key, queue_ms > {queue_thresholds_ms:Array(Float64)}[indexOf({tiers:Array(String)}, tier)])))
           AS queue_slow
FROM {{judged_requests}}
WHERE has({tiers:Array(String)}, tier)
GROUP BY tier, service, node, window_start
