-- When a node's signals begin, where that is after $since (the start of an incident's baseline): how much history
-- there is for the baseline. NULL when some signal of the node precedes $since (the baseline has all the history
-- it asks for), and when the node has none. Both are asked with LIMIT 1, which stops at the first found (the first
-- in time order for the beginning), so the query reads around $since rather than the node's whole history.
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM samples WHERE node = $node AND ts < $since LIMIT 1)) = 0
             AND (SELECT count(*) FROM (SELECT 1 FROM histograms WHERE node = $node AND ts < $since LIMIT 1)) = 0
            THEN least((SELECT ts FROM samples WHERE node = $node AND ts >= $since ORDER BY ts LIMIT 1),
                       (SELECT ts FROM histograms WHERE node = $node AND ts >= $since ORDER BY ts LIMIT 1))
       END AS first
