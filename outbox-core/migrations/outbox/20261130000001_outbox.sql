-- The transactional outbox. Rows are inserted in the caller's transaction by `enqueue` and
-- published to JetStream by the relay.
CREATE TABLE outbox (
    -- Insertion order. Per aggregate it is also commit order, because `enqueue` serialises the
    -- transactions that write events of one aggregate.
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The CloudEvents id and Nats-Msg-Id: a UUIDv7, unique across databases.
    id              UUID        NOT NULL UNIQUE,
    aggregate_type  TEXT        NOT NULL,
    aggregate_id    TEXT        NOT NULL,
    event_type      TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    traceparent     TEXT,
    status          TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'published', 'dead', 'skipped')),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    published_at    TIMESTAMPTZ
);

-- The relay's claim: pending rows in insertion order.
CREATE INDEX outbox_pending_seq ON outbox (seq) WHERE status = 'pending';
-- The per-aggregate barrier: the earliest unpublished event of an aggregate.
CREATE INDEX outbox_unpublished_aggregate
    ON outbox (aggregate_type, aggregate_id, seq) WHERE status IN ('pending', 'dead');
-- Cleanup of finished rows.
CREATE INDEX outbox_finished_created_at
    ON outbox (created_at) WHERE status IN ('published', 'skipped');
