-- The requests of analytics/sql/schema.sql, read from the exporter's otel_traces: one row per SERVER span. Service,
-- node and status follow receiver/otlp_common.py (span attributes before the resource's; Istio's canonical service
-- over Envoy's default names); the untrusted tier header is resolved by the SLO spec's rules exactly as
-- enrich/tiers.py does: the first tier attribute present, a repeated header only when it has a single value, empty
-- or longer than 64 characters is the default tier, Unicode whitespace stripped, then the allow-list.
-- Only the spans started in [since, until) are read, and a span stored twice (a retried batch, a file loaded
-- again) is one request, as the DuckDB store keeps it once. Parameters: allowed_tiers, default_tier, since, until.
-- Inlined by the queries of this folder where they name it in double braces.
SELECT TraceId AS trace_id,
       SpanId AS span_id,
       fromUnixTimestamp64Micro(toUnixTimestamp64Micro(Timestamp), 'UTC') AS start_time,
       Duration / 1e6 AS duration_ms,
       if(ServiceName = '', 'unknown_service', substringUTF8(ServiceName, 1, 253)) AS resource_service,
       substringUTF8(SpanAttributes['istio.canonical_service'], 1, 253) AS canonical_service,
       multiIf(canonical_service = '', resource_service,
               startsWith(resource_service, 'unknown_service') OR resource_service = 'istio-proxy'
                   OR startsWith(resource_service, concat(canonical_service, '.')), canonical_service,
               resource_service) AS service,
       substringUTF8(if(mapContains(SpanAttributes, 'http.route'), SpanAttributes['http.route'], SpanName), 1, 253)
           AS route,
       substringUTF8(coalesce(nullIf(SpanAttributes['k8s.node.name'], ''), nullIf(SpanAttributes['host.name'], ''),
                              nullIf(ResourceAttributes['k8s.node.name'], ''),
                              nullIf(ResourceAttributes['host.name'], ''), 'unknown'), 1, 253) AS node,
       multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
               SpanAttributes['http.request.header.x-slo-tier'],
               mapContains(SpanAttributes, 'slo.tier'), SpanAttributes['slo.tier'],
               NULL) AS tier_header,
       -- A repeated header arrives as a list, which the exporter writes as its JSON.
       if(startsWith(tier_header, '[') AND isValidJSON(tier_header) AND JSONLength(tier_header) = 1
              AND JSONType(tier_header, 1) = 'String',
          JSONExtractString(tier_header, 1), tier_header) AS tier_value,
       -- An allowed value needs no stripping: the regular expression runs only for the others.
       if(has({allowed_tiers:Array(String)}, tier_value), tier_value, replaceRegexpAll(tier_value,
           '^[\\t\\n\\x0B\\x0C\\r\\x1C-\\x1F \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+|[\\t\\n\\x0B\\x0C\\r\\x1C-\\x1F \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+$',
           '')) AS tier_stripped,
       if(tier_value != '' AND lengthUTF8(tier_value) <= 64 AND has({allowed_tiers:Array(String)}, tier_stripped),
          tier_stripped, {default_tier:String}) AS tier,
       toInt32OrNull(multiIf(mapContains(SpanAttributes, 'http.response.status_code'),
                             SpanAttributes['http.response.status_code'],
                             SpanAttributes['http.status_code'])) AS status_code,
       StatusCode = 'Error' OR ifNull(status_code >= 500, false) AS failed
FROM otel_traces
WHERE SpanKind = 'Server' AND Timestamp >= {since:DateTime64(6)} AND Timestamp < {until:DateTime64(6)}
LIMIT 1 BY TraceId, SpanId
