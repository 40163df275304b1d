-- Columns sloscope adds to the exporter's tables, as ClickStack adds materialized columns for the attributes it
-- reads most: each value is computed once, as its row is inserted, where every query would otherwise read whole
-- attribute maps. `sloscope ingest --store` adds them; on tables the Collector made, run these statements once
-- (rows inserted before compute the value when read, until `ALTER TABLE ... MATERIALIZE COLUMN` rewrites them).
-- Where a table lacks one, sloscope's queries compute the same expression as they read: the same answers, slower.
-- Their values follow receiver/otlp_common.py: span attributes before the resource's, Istio's canonical service
-- over Envoy's default names, names cut at 253 characters; a repeated tier header (a list, which the exporter
-- writes as its JSON) is its single value. The tier rules of the spec are applied at query time, not here.
-- A metric point is read by its catalog signal's rule, as the decoders read it (receiver/otlp_common.MetricRule):
-- its node is the resource's, else the point attribute the rule names (dcgm-exporter's Hostname); the resource
-- attributes the rule keeps (kubeletstats' pod and container) join its attributes, and those it drops (the pod
-- dcgm-exporter maps a GPU to) leave them; DCGM's blank values are not kept, nor values outside the metric's range
-- or a counter's negative delta (points_out_of_range, which the decoders refuse); a metric the catalog does not name is
-- read by its family's rule where its name begins with the family's prefix (dcgm-exporter's DCGM_); a cumulative
-- sum that is not monotonic is a level (SloscopeTemporality 0), unless the signal is a counter.
-- The rules' parameters ({node_attributes:...} and the others) are filled from sloscope/catalog.py when the
-- statements are run, since a column's expression takes no query parameters.
-- Statements are separated by a line holding only ";".
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeService LowCardinality(String) MATERIALIZED
    multiIf(SpanAttributes['istio.canonical_service'] = '',
                if(ServiceName = '', 'unknown_service', substringUTF8(ServiceName, 1, 253)),
            ServiceName IN ('', 'istio-proxy') OR startsWith(ServiceName, 'unknown_service')
                OR startsWith(substringUTF8(ServiceName, 1, 253),
                              concat(substringUTF8(SpanAttributes['istio.canonical_service'], 1, 253), '.')),
                substringUTF8(SpanAttributes['istio.canonical_service'], 1, 253),
            substringUTF8(ServiceName, 1, 253))
;
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeSpanKey Int64 MATERIALIZED
    reinterpretAsInt64(cityHash64(TraceId, SpanId))
;
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeRoute LowCardinality(String) MATERIALIZED
    substringUTF8(if(mapContains(SpanAttributes, 'http.route'), SpanAttributes['http.route'], SpanName), 1, 253)
;
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeNode LowCardinality(String) MATERIALIZED
    substringUTF8(coalesce(nullIf(SpanAttributes['k8s.node.name'], ''), nullIf(SpanAttributes['host.name'], ''),
                           nullIf(ResourceAttributes['k8s.node.name'], ''), nullIf(ResourceAttributes['host.name'], ''),
                           'unknown'), 1, 253)
;
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeTierValue Nullable(String) MATERIALIZED
    if(startsWith(multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
                          SpanAttributes['http.request.header.x-slo-tier'], SpanAttributes['slo.tier']), '[')
           AND isValidJSON(multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
                                   SpanAttributes['http.request.header.x-slo-tier'], SpanAttributes['slo.tier']))
           AND JSONLength(multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
                                  SpanAttributes['http.request.header.x-slo-tier'], SpanAttributes['slo.tier'])) = 1
           AND JSONType(multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
                                SpanAttributes['http.request.header.x-slo-tier'], SpanAttributes['slo.tier']), 1)
               = 'String',
       JSONExtractString(multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
                                 SpanAttributes['http.request.header.x-slo-tier'], SpanAttributes['slo.tier']), 1),
       multiIf(mapContains(SpanAttributes, 'http.request.header.x-slo-tier'),
               SpanAttributes['http.request.header.x-slo-tier'],
               mapContains(SpanAttributes, 'slo.tier'), SpanAttributes['slo.tier'],
               NULL))
;
ALTER TABLE otel_traces ADD COLUMN IF NOT EXISTS SloscopeStatusCode Nullable(Int32) MATERIALIZED
    toInt32OrNull(multiIf(mapContains(SpanAttributes, 'http.response.status_code'),
                          SpanAttributes['http.response.status_code'], SpanAttributes['http.status_code']))
;
ALTER TABLE otel_metrics_gauge ADD COLUMN IF NOT EXISTS SloscopeNode LowCardinality(String) MATERIALIZED
    substringUTF8(coalesce(nullIf(ResourceAttributes['k8s.node.name'], ''), nullIf(ResourceAttributes['host.name'], ''),
                           nullIf(Attributes[multiIf(mapContains({node_attributes:Map(String, String)}, MetricName),
                                                     {node_attributes:Map(String, String)}[MetricName],
                                                     startsWith(MetricName, {family_prefix:String}),
                                                     {family_node_attribute:String}, '')], ''),
                           'unknown'),
                  1, 253)
;
ALTER TABLE otel_metrics_gauge ADD COLUMN IF NOT EXISTS SloscopeAttributes LowCardinality(String) MATERIALIZED
    toJSONString(mapSort(mapUpdate(mapFilter(
        (key, value) -> NOT has(multiIf(mapContains({dropped_attributes:Map(String, Array(String))}, MetricName),
                                        {dropped_attributes:Map(String, Array(String))}[MetricName],
                                        startsWith(MetricName, {family_prefix:String}),
                                        {family_dropped_attributes:Array(String)}, []), key),
        Attributes), mapFilter(
        (key, value) -> value != '' AND has({resource_attributes:Map(String, Array(String))}[MetricName], key),
        ResourceAttributes))))
;
ALTER TABLE otel_metrics_gauge ADD COLUMN IF NOT EXISTS SloscopeKept Bool MATERIALIZED
    isFinite(Value) AND bitAnd(Flags, 1) = 0
        AND Value < multiIf(mapContains({blank_from:Map(String, Float64)}, MetricName),
                            {blank_from:Map(String, Float64)}[MetricName],
                            startsWith(MetricName, {family_prefix:String}), {family_blank_from:Float64}, inf)
        AND Value > if(mapContains({value_low:Map(String, Float64)}, MetricName),
                       {value_low:Map(String, Float64)}[MetricName], -{value_limit:Float64})
        AND Value < if(mapContains({value_high:Map(String, Float64)}, MetricName),
                       {value_high:Map(String, Float64)}[MetricName], {value_limit:Float64})
;
ALTER TABLE otel_metrics_sum ADD COLUMN IF NOT EXISTS SloscopeNode LowCardinality(String) MATERIALIZED
    substringUTF8(coalesce(nullIf(ResourceAttributes['k8s.node.name'], ''), nullIf(ResourceAttributes['host.name'], ''),
                           nullIf(Attributes[multiIf(mapContains({node_attributes:Map(String, String)}, MetricName),
                                                     {node_attributes:Map(String, String)}[MetricName],
                                                     startsWith(MetricName, {family_prefix:String}),
                                                     {family_node_attribute:String}, '')], ''),
                           'unknown'),
                  1, 253)
;
ALTER TABLE otel_metrics_sum ADD COLUMN IF NOT EXISTS SloscopeAttributes LowCardinality(String) MATERIALIZED
    toJSONString(mapSort(mapUpdate(mapFilter(
        (key, value) -> NOT has(multiIf(mapContains({dropped_attributes:Map(String, Array(String))}, MetricName),
                                        {dropped_attributes:Map(String, Array(String))}[MetricName],
                                        startsWith(MetricName, {family_prefix:String}),
                                        {family_dropped_attributes:Array(String)}, []), key),
        Attributes), mapFilter(
        (key, value) -> value != '' AND has({resource_attributes:Map(String, Array(String))}[MetricName], key),
        ResourceAttributes))))
;
ALTER TABLE otel_metrics_sum ADD COLUMN IF NOT EXISTS SloscopeKept Bool MATERIALIZED
    isFinite(Value) AND bitAnd(Flags, 1) = 0
        AND Value < multiIf(mapContains({blank_from:Map(String, Float64)}, MetricName),
                            {blank_from:Map(String, Float64)}[MetricName],
                            startsWith(MetricName, {family_prefix:String}), {family_blank_from:Float64}, inf)
        AND Value > if(mapContains({value_low:Map(String, Float64)}, MetricName),
                       {value_low:Map(String, Float64)}[MetricName], -{value_limit:Float64})
        AND Value < if(mapContains({value_high:Map(String, Float64)}, MetricName),
                       {value_high:Map(String, Float64)}[MetricName], {value_limit:Float64})
        AND NOT (AggregationTemporality = 1 AND has({counters:Array(String)}, MetricName) AND Value < 0)
;
ALTER TABLE otel_metrics_sum ADD COLUMN IF NOT EXISTS SloscopeTemporality Int32 MATERIALIZED
    multiIf(AggregationTemporality = 2 AND NOT IsMonotonic AND NOT has({counters:Array(String)}, MetricName), 0,
            AggregationTemporality IN (1, 2), AggregationTemporality, -1)
;
ALTER TABLE otel_metrics_exponential_histogram ADD COLUMN IF NOT EXISTS SloscopeNode LowCardinality(String)
    MATERIALIZED
    substringUTF8(coalesce(nullIf(ResourceAttributes['k8s.node.name'], ''), nullIf(ResourceAttributes['host.name'], ''),
                           nullIf(Attributes[multiIf(mapContains({node_attributes:Map(String, String)}, MetricName),
                                                     {node_attributes:Map(String, String)}[MetricName],
                                                     startsWith(MetricName, {family_prefix:String}),
                                                     {family_node_attribute:String}, '')], ''),
                           'unknown'),
                  1, 253)
;
ALTER TABLE otel_metrics_exponential_histogram ADD COLUMN IF NOT EXISTS SloscopeAttributes LowCardinality(String)
    MATERIALIZED
    toJSONString(mapSort(mapUpdate(mapFilter(
        (key, value) -> NOT has(multiIf(mapContains({dropped_attributes:Map(String, Array(String))}, MetricName),
                                        {dropped_attributes:Map(String, Array(String))}[MetricName],
                                        startsWith(MetricName, {family_prefix:String}),
                                        {family_dropped_attributes:Array(String)}, []), key),
        Attributes), mapFilter(
        (key, value) -> value != '' AND has({resource_attributes:Map(String, Array(String))}[MetricName], key),
        ResourceAttributes))))
;
ALTER TABLE otel_metrics_histogram ADD COLUMN IF NOT EXISTS SloscopeNode LowCardinality(String) MATERIALIZED
    substringUTF8(coalesce(nullIf(ResourceAttributes['k8s.node.name'], ''), nullIf(ResourceAttributes['host.name'], ''),
                           nullIf(Attributes[multiIf(mapContains({node_attributes:Map(String, String)}, MetricName),
                                                     {node_attributes:Map(String, String)}[MetricName],
                                                     startsWith(MetricName, {family_prefix:String}),
                                                     {family_node_attribute:String}, '')], ''),
                           'unknown'),
                  1, 253)
;
ALTER TABLE otel_metrics_histogram ADD COLUMN IF NOT EXISTS SloscopeAttributes LowCardinality(String) MATERIALIZED
    toJSONString(mapSort(mapUpdate(mapFilter(
        (key, value) -> NOT has(multiIf(mapContains({dropped_attributes:Map(String, Array(String))}, MetricName),
                                        {dropped_attributes:Map(String, Array(String))}[MetricName],
                                        startsWith(MetricName, {family_prefix:String}),
                                        {family_dropped_attributes:Array(String)}, []), key),
        Attributes), mapFilter(
        (key, value) -> value != '' AND has({resource_attributes:Map(String, Array(String))}[MetricName], key),
        ResourceAttributes))))
