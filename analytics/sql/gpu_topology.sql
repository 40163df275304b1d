-- The node each GPU (hw.id) was last seen on, from the stored GPU samples; the GPU seen last comes last (the GPU
-- topology keeps the ones seen last where there are more than it remembers).
SELECT arg_max(node, ts) AS node, attributes ->> 'hw.id' AS gpu_id
FROM samples
WHERE metric LIKE 'hw.gpu.%' AND attributes LIKE '%"hw.id"%'
GROUP BY gpu_id
ORDER BY max(ts), gpu_id
