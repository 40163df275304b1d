-- Version 2 -> 3: trace and span ids as 64-bit words instead of hex text (analytics/ids.py). Every stored id is
-- valid hex of its length: the decoders refused any other. (DuckDB cannot add a NOT NULL constraint after an
-- UPDATE in the same transaction, so trace_lo is added NOT NULL with a default that is dropped once filled.)
ALTER TABLE requests ADD COLUMN trace_lo UBIGINT NOT NULL DEFAULT 0;
UPDATE requests SET trace_lo = ('0x' || trace_id[17:32])::UBIGINT;
ALTER TABLE requests ALTER trace_id TYPE UBIGINT USING ('0x' || trace_id[1:16])::UBIGINT;
ALTER TABLE requests RENAME trace_id TO trace_hi;
ALTER TABLE requests ALTER span_id TYPE UBIGINT USING ('0x' || span_id)::UBIGINT;
ALTER TABLE requests ALTER trace_lo DROP DEFAULT;
