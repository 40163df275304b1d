-- The SLI over each incident of tier {tier}: requests, failures, and of the time {measure} (the duration, or a token
-- time: ttft, tpot, queue) the requests that give it, those over the incident's threshold (in
-- {incident_thresholds_ms}) and its percentile, of the requests the tier is judged on
-- (judged_requests.sql) of its service and node started in [start, end). The incidents are given place by place in
-- {services}, {nodes}, {starts} and {ends}; `incident` is the place (from 1). One read of their nodes' spans over
-- [{start}, {end}), the incidents' whole span, where each finds its own (an incident's windows never overlap
-- another's of the same tier, service and node). An incident on {every_node} is its service's on every node.
SELECT incident,
       toInt64(count()) AS requests,
       toInt64(countIf(failed)) AS failures,
       toInt64(count(measured_ms)) AS judged,
       toInt64(countIf(measured_ms > {incident_thresholds_ms:Array(Float64)}[incident])) AS slow,
       quantileExactInclusive({quantile:Float64})(measured_ms) AS percentile_ms
FROM (
    SELECT failed, multiIf({measure:String} = 'ttft', ttft_ms, {measure:String} = 'tpot', tpot_ms,
                   {measure:String} = 'queue', queue_ms, duration_ms) AS measured_ms,
           arrayFirstIndex((incident_service, incident_node, incident_start, incident_end) ->
                               incident_service = service
                               AND (incident_node = {every_node:String} OR incident_node = node)
                               AND start_time >= incident_start AND start_time < incident_end,
                           {services:Array(String)}, {nodes:Array(String)}, {starts:Array(DateTime64(6))},
                           {ends:Array(DateTime64(6))}) AS incident
    FROM {{judged_requests start end}}
    WHERE tier = {tier:String} AND (has({nodes:Array(String)}, {every_node:String}) OR has({nodes:Array(String)}, node))
      AND has({services:Array(String)}, service)
)
WHERE incident > 0
GROUP BY incident
