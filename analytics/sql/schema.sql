-- sloscope store, schema version 7 (older versions are migrated by migrate_to_N.sql). Times are UTC; counters and histograms are per-interval deltas.
CREATE TABLE IF NOT EXISTS meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

-- One row per SERVER span (a request). The tier is already resolved against the SLO spec's allow-list. Ids are
-- unsigned 64-bit words, the id's bytes big-endian (analytics/ids.py): the trace id in hex is
-- printf('%016x%016x', trace_hi, trace_lo), the span id printf('%016x', span_id). parent_id is NULL for a trace's
-- root (docs/traces.md says how the graph is read from parents). An inference request's token timings (model to
-- output_tokens, docs/inference.md) are NULL where its span gives none.
CREATE TABLE IF NOT EXISTS requests (
    trace_hi    UBIGINT NOT NULL,
    trace_lo    UBIGINT NOT NULL,
    span_id     UBIGINT NOT NULL,
    start_time  TIMESTAMP NOT NULL,
    duration_ms DOUBLE NOT NULL,
    service     VARCHAR NOT NULL,
    node        VARCHAR NOT NULL,
    tier        VARCHAR NOT NULL,
    pod         VARCHAR,
    namespace   VARCHAR,
    pod_ip      VARCHAR,
    gpu_id      VARCHAR,
    route       VARCHAR,
    status_code SMALLINT,
    failed      BOOLEAN NOT NULL,
    parent_id   UBIGINT,
    model         VARCHAR,
    ttft_ms       DOUBLE,
    tpot_ms       DOUBLE,
    queue_ms      DOUBLE,
    prompt_tokens BIGINT,
    output_tokens BIGINT
);

-- Every span that is not a SERVER span (OTLP SpanKind: 1 INTERNAL, 3 CLIENT, 4 PRODUCER, 5 CONSUMER), with what the
-- trace graph needs of it: its parent, and for a CLIENT span the peer it says it called. The tier is the span's
-- own header's (a gateway's span carries it); a trace's tier is its entry's (analytics/sql/trace_spans.sql).
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

-- Gauges (value as measured, interval_s NULL) and counters (value = increase over interval_s seconds).
CREATE TABLE IF NOT EXISTS samples (
    ts         TIMESTAMP NOT NULL,
    node       VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,
    attributes VARCHAR NOT NULL,
    value      DOUBLE NOT NULL,
    interval_s DOUBLE
);

-- Exponential histograms at scale 0 over a fixed bucket range (see sloscope/records.py), as deltas.
CREATE TABLE IF NOT EXISTS histograms (
    ts         TIMESTAMP NOT NULL,
    node       VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,
    attributes VARCHAR NOT NULL,
    interval_s DOUBLE,
    count      UBIGINT NOT NULL,
    sum        DOUBLE NOT NULL,
    min        DOUBLE,
    max        DOUBLE,
    buckets    UBIGINT[] NOT NULL
);

-- Last cumulative point per series, so that deltas continue across batches, files and ingest runs. A sum and a
-- histogram may share a name, node and attributes (a producer's two instruments): `kind` ('sum' or 'histogram')
-- keeps their states apart.
CREATE TABLE IF NOT EXISTS cumulative_state (
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

-- The running totals of cumulative points that the stored deltas cannot give back, so that a point arriving behind
-- its series' last one can be placed between its stored neighbours (analytics/cumulative.py): each reset (`reset`
-- true; a series' first point is one) and the point before it (`reset` false). `reset` NULL marks a series' last
-- point when the store began keeping them: nothing is placed at or before it.
CREATE TABLE IF NOT EXISTS cumulative_points (
    node       VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,
    attributes VARCHAR NOT NULL,
    kind       VARCHAR NOT NULL,
    start_ns   BIGINT NOT NULL,
    time_ns    BIGINT NOT NULL,
    reset      BOOLEAN,
    value      DOUBLE,
    count      UBIGINT,
    sum        DOUBLE,
    buckets    UBIGINT[],
    PRIMARY KEY (node, metric, attributes, kind, time_ns)
);

-- Ingest and rejection counters, kept across runs (what was loaded, skipped, rejected, and why).
CREATE TABLE IF NOT EXISTS ingest_counters (
    name  VARCHAR PRIMARY KEY,
    value BIGINT NOT NULL
);

-- The requests retention deleted, counted per tier, service and node at each latency bound of /metrics'
-- request families (sloscope/latency_buckets.py; 'Infinity' for all of them): requests, seconds and failures of
-- those at or under the bound. The families add them to what the requests table still holds, so that their
-- counters never go down when retention deletes (Prometheus would read that as a reset, and count every kept
-- request again). A bound the spec added since the last deletion reads the count of the highest bound under it.
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

-- The token timings (TTFT, TPOT, queue time: `measure` as slo_spec.TOKEN_SLIS names them) of the requests retention
-- deleted, counted per tier, service and node at each bound of /metrics' token families as retired_requests counts
-- their durations (sloscope/latency_buckets.py, a measure's own bounds; 'Infinity' for all of them): the requests
-- that gave the timing at or under the bound, and their seconds of it.
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
