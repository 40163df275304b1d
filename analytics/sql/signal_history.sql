-- When a node's signals begin: how much history there is for a baseline before its incidents.
SELECT least((SELECT min(ts) FROM samples WHERE node = $node),
             (SELECT min(ts) FROM histograms WHERE node = $node)) AS first
