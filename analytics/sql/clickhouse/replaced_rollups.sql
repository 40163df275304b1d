-- Deletes the batches {batches} of a rollup (analytics/rollups.py) of the parameters {key}, where computed more than
-- {superseded_after_s} seconds ago; rollup_table is the rollup's table.
DELETE FROM rollup_table
WHERE parameters = {key:Int64} AND has({batches:Array(Int64)}, batch)
  AND computed < now() - {superseded_after_s:UInt32}
