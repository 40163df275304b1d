-- The exporter's spans of every kind in [since, until), in the columns of analytics/sql/schema.sql's requests and
-- spans tables, every stored copy of them: requests.sql keeps one of each, and a query that groups spans itself
-- can count each once more cheaply by span_key (a span's copies share their node, service, tier and start).
-- Service, route, node, status, the span key and the tier header's value are sloscope's columns of the table
-- (derived_columns.sql); the untrusted tier header is resolved by the SLO spec's rules exactly as enrich/tiers.py
-- does: the first tier attribute present, a repeated header only when it has a single value, empty or longer than
-- 64 characters is the default tier, Unicode whitespace stripped, then the allow-list.
-- The exporter's earlier releases wrote span kinds and status codes by their proto names (SPAN_KIND_SERVER,
-- STATUS_CODE_ERROR), later ones as Server and Error: a table kept across an upgrade holds both.
-- An inference request's token timings are read as receiver/token_timings.py reads them, from the text the exporter
-- stores: a time is seconds, or a Rust Debug duration's text ("1.25ms"), the first of its attribute names given,
-- left out where negative, not finite or past the span's duration (by SLACK_MS, 1 ms); a token count an integer in
-- [0, 2**31). The exporter stores every value as text, so a number written as a string reads as the number here,
-- where the decoders count it invalid.
-- Parameters: allowed_tiers, default_tier, since, until.
SELECT TraceId AS trace_id,
       SpanId AS span_id,
       -- Ids as the words of their bytes, big-endian, signed (results keep no unsigned type): the graph joins on them.
       reinterpretAsInt64(reverse(unhex(SpanId))) AS span_word,
       if(ParentSpanId = '', NULL, reinterpretAsInt64(reverse(unhex(ParentSpanId)))) AS parent_id,
       multiIf(SpanKind IN ('Server', 'SPAN_KIND_SERVER'), 2, SpanKind IN ('Client', 'SPAN_KIND_CLIENT'), 3,
               SpanKind IN ('Producer', 'SPAN_KIND_PRODUCER'), 4, SpanKind IN ('Consumer', 'SPAN_KIND_CONSUMER'), 5,
               1) AS kind,
       nullIf(substringUTF8(if(SpanAttributes['k8s.pod.name'] != '', SpanAttributes['k8s.pod.name'],
                               ResourceAttributes['k8s.pod.name']), 1, 253), '') AS pod,
       -- The peer a call names, as receiver/otlp_common.py reads it: peer.service, Istio's outbound cluster's host
       -- (its first label), server.address, the older net.peer.name.
       nullIf(substringUTF8(multiIf(
           SpanAttributes['peer.service'] != '', SpanAttributes['peer.service'],
           startsWith(SpanAttributes['upstream_cluster'], 'outbound|'),
               splitByChar('.', arrayElement(splitByChar('|', SpanAttributes['upstream_cluster']), 4))[1],
           startsWith(SpanAttributes['upstream_cluster'], 'inbound|'), '',
           SpanAttributes['upstream_cluster'] != '', SpanAttributes['upstream_cluster'],
           SpanAttributes['server.address'] != '', SpanAttributes['server.address'],
           SpanAttributes['net.peer.name']), 1, 253), '') AS peer,
       SloscopeSpanKey AS span_key,
       fromUnixTimestamp64Micro(toUnixTimestamp64Micro(Timestamp), 'UTC') AS start_time,
       Duration / 1e6 AS duration_ms,
       SloscopeService AS service,
       SloscopeRoute AS route,
       SloscopeNode AS node,
       ifNull(SloscopeTierValue, '') AS tier_value,
       -- A tier name is short and has no whitespace (sloscope/slo_spec.py), so a value the spec allows is its own
       -- tier: the rules, and the regular expression, run only for the others.
       if(has({allowed_tiers:Array(String)}, tier_value), tier_value,
          if(tier_value != '' AND lengthUTF8(tier_value) <= 64
                 AND has({allowed_tiers:Array(String)}, replaceRegexpAll(tier_value,
             '^[\\t\\n\\x0B\\x0C\\r\\x1C-\\x1F \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+|[\\t\\n\\x0B\\x0C\\r\\x1C-\\x1F \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+$',
             '') AS tier_stripped),
             tier_stripped,
             {default_tier:String})) AS tier,
       SloscopeStatusCode AS status_code,
       StatusCode IN ('Error', 'STATUS_CODE_ERROR') OR ifNull(status_code >= 500, false) AS failed,
       nullIf(substringUTF8(multiIf(mapContains(SpanAttributes, 'gen_ai.response.model'),
                                    SpanAttributes['gen_ai.response.model'], SpanAttributes['gen_ai.request.model']),
                            1, 253), '') AS model,
       -- TTFT, queue time, TPOT as given, decode time: in milliseconds, NULL where absent or left out
       arrayMap(t -> if(isFinite(t) AND t >= 0 AND t <= duration_ms + 1.0, t, NULL), arrayMap(text -> if(
           match(text, '^[0-9]+(\\.[0-9]+)?(ns|µs|us|ms|s)$'),
           toFloat64(extract(text, '^[0-9.]+')) * transform(extract(text, '[a-zµ]+$'), ['ns', 'µs', 'us', 'ms', 's'],
                                                            [1e-6, 1e-3, 1e-3, 1.0, 1e3], 1e3),
           toFloat64OrNull(text) * 1e3), [
           multiIf(mapContains(SpanAttributes, 'gen_ai.latency.time_to_first_token'),
                   SpanAttributes['gen_ai.latency.time_to_first_token'], NULL),
           multiIf(mapContains(SpanAttributes, 'gen_ai.latency.time_in_queue'),
                   SpanAttributes['gen_ai.latency.time_in_queue'],
                   mapContains(SpanAttributes, 'queue_time'), SpanAttributes['queue_time'], NULL),
           multiIf(mapContains(SpanAttributes, 'time_per_token'), SpanAttributes['time_per_token'], NULL),
           multiIf(mapContains(SpanAttributes, 'gen_ai.latency.time_in_model_decode'),
                   SpanAttributes['gen_ai.latency.time_in_model_decode'], NULL)])) AS token_times,
       token_times[1] AS ttft_ms,
       token_times[2] AS queue_ms,
       arrayMap(text -> if(toInt64OrNull(text) BETWEEN 0 AND 2147483647, toInt64OrNull(text), NULL), [
           multiIf(mapContains(SpanAttributes, 'gen_ai.usage.input_tokens'), SpanAttributes['gen_ai.usage.input_tokens'],
                   mapContains(SpanAttributes, 'gen_ai.usage.prompt_tokens'),
                   SpanAttributes['gen_ai.usage.prompt_tokens'], NULL),
           multiIf(mapContains(SpanAttributes, 'gen_ai.usage.output_tokens'),
                   SpanAttributes['gen_ai.usage.output_tokens'],
                   mapContains(SpanAttributes, 'gen_ai.usage.completion_tokens'),
                   SpanAttributes['gen_ai.usage.completion_tokens'], NULL)]) AS token_counts,
       token_counts[1] AS prompt_tokens,
       token_counts[2] AS output_tokens,
       -- per output token after the first: as given, else the decode time, else the rest of the request, over them
       coalesce(token_times[3], if(output_tokens >= 2, coalesce(token_times[4],
                greatest(duration_ms - ttft_ms, 0.0)) / (output_tokens - 1), NULL)) AS tpot_ms
FROM otel_traces
WHERE Timestamp >= {since:DateTime64(6)} AND Timestamp < {until:DateTime64(6)}
