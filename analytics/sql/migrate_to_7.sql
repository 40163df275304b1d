-- Version 6 -> 7: an inference request's token timings (docs/inference.md). Requests stored before have none.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS model VARCHAR;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS ttft_ms DOUBLE;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS tpot_ms DOUBLE;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS queue_ms DOUBLE;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prompt_tokens BIGINT;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS output_tokens BIGINT;
-- Retention keeps count of the token timings of the requests it deletes (retired_token_requests, as schema.sql says).
CREATE TABLE IF NOT EXISTS retired_token_requests (
    measure  VARCHAR NOT NULL,
    tier     VARCHAR NOT NULL,
    service  VARCHAR NOT NULL,
    node     VARCHAR NOT NULL,
    bound_ms DOUBLE NOT NULL,
    requests BIGINT NOT NULL,
    seconds  DOUBLE NOT NULL,
    PRIMARY KEY (measure, tier, service, node, bound_ms)
);
