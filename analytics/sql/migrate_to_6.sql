-- Version 5 -> 6: the trace graph. Requests keep their parent span; the spans of other kinds get a table of
-- their own (schema.sql). Requests stored before hold no parent: each reads as its trace's entry.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS parent_id UBIGINT;
CREATE TABLE IF NOT EXISTS spans (
    trace_hi    UBIGINT NOT NULL,
    trace_lo    UBIGINT NOT NULL,
    span_id     UBIGINT NOT NULL,
    parent_id   UBIGINT,
    kind        UTINYINT NOT NULL,
    start_time  TIMESTAMP NOT NULL,
    duration_ms DOUBLE NOT NULL,
    service     VARCHAR NOT NULL,
    node        VARCHAR NOT NULL,
    pod         VARCHAR,
    tier        VARCHAR NOT NULL,
    failed      BOOLEAN NOT NULL,
    peer        VARCHAR
);
