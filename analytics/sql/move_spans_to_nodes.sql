-- The spans of other kinds placed late, with the requests of their pod: from the unknown node ($1) to the node of
-- their pod, for those started at or after $2. `placed_pods`: the registered frame of (pod, node) the requests just
-- moved to. The spans table keeps a pod's name without its namespace or IP: a pod's name, which its ReplicaSet's
-- hash and a random suffix make unique in practice, places them. Answers how many rows moved.
UPDATE spans SET node = placed_pods.node
FROM placed_pods
WHERE spans.pod = placed_pods.pod AND spans.node = $1 AND spans.start_time >= $2
