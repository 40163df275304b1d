-- Requests placed late: from the unknown node ($1) to the node of their pod. `placed`: the registered frame of
-- (trace_hi, trace_lo, span_id, node) to move. Answers how many rows moved.
UPDATE requests SET node = placed.node
FROM placed
WHERE requests.trace_hi = placed.trace_hi AND requests.trace_lo = placed.trace_lo
  AND requests.span_id = placed.span_id AND requests.node = $1
