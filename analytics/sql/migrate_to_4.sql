-- Version 3 -> 4: each cumulative state says whose it is (`kind`), so that a sum and a histogram of one name,
-- node and attributes keep apart states; before, the last of them to be written replaced the other's. A stored
-- state is a histogram's where it has no value. DuckDB cannot change a primary key in place: the table is
-- copied.
CREATE TABLE cumulative_state_4 (
    node       VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,
    attributes VARCHAR NOT NULL,
    kind       VARCHAR NOT NULL,
    start_ns   BIGINT NOT NULL,
    time_ns    BIGINT NOT NULL,
    value      DOUBLE,
    count      UBIGINT,
    sum        DOUBLE,
    buckets    UBIGINT[],
    PRIMARY KEY (node, metric, attributes, kind)
);
INSERT INTO cumulative_state_4
SELECT node, metric, attributes, if(value IS NULL, 'histogram', 'sum'), start_ns, time_ns, value, count, sum, buckets
FROM cumulative_state;
DROP TABLE cumulative_state;
ALTER TABLE cumulative_state_4 RENAME TO cumulative_state;
