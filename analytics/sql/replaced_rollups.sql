-- Deletes the batches $batches of a rollup (analytics/rollups.py) of the parameters $key, where computed more than
-- $superseded_after_s seconds ago; rollup_table is the rollup's table.
DELETE FROM rollup_table
WHERE parameters = $key AND list_contains($batches, batch) AND computed < now() - to_seconds($superseded_after_s)
