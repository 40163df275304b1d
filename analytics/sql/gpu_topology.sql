-- The node each GPU (hw.id) was last seen on, from the stored GPU samples.
SELECT arg_max(node, ts) AS node, attributes ->> 'hw.id' AS gpu_id
FROM samples
WHERE metric LIKE 'hw.gpu.%' AND attributes LIKE '%"hw.id"%'
GROUP BY gpu_id
