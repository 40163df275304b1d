-- The headers of a rollup's batches (analytics/rollups.py) of the parameters $key whose chunks begin in
-- [$first, $until), oldest first; rollup_table is the rollup's table.
SELECT chunk_start, batch, source_rows, source_digest
FROM rollup_table
WHERE parameters = $key AND header AND chunk_start >= $first AND chunk_start < $until
ORDER BY computed
