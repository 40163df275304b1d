-- The headers of a rollup's batches (analytics/rollups.py) of the parameters {key} whose chunks begin in
-- [{first}, {until}), oldest first; rollup_table is the rollup's table.
SELECT chunk_start, batch, source_rows, source_digest
FROM rollup_table
WHERE parameters = {key:Int64} AND header AND chunk_start >= {first:DateTime64(6)} AND chunk_start < {until:DateTime64(6)}
ORDER BY computed
