-- Version 4 -> 5: retention keeps count of the requests it deletes (retired_requests, as schema.sql says).
CREATE TABLE IF NOT EXISTS retired_requests (
    tier     VARCHAR NOT NULL,
    service  VARCHAR NOT NULL,
    node     VARCHAR NOT NULL,
    bound_ms DOUBLE NOT NULL,
    requests BIGINT NOT NULL,
    seconds  DOUBLE NOT NULL,
    failed   BIGINT NOT NULL,
    PRIMARY KEY (tier, service, node, bound_ms)
);
