-- The inbox: one row per message whose effect a consumer applied, written in the same
-- transaction as the effect, so a redelivered message finds its row and does nothing.
CREATE TABLE inbox (
    consumer    TEXT        NOT NULL,
    message_id  TEXT        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- How many later deliveries of this message were recognised as duplicates.
    duplicates  INTEGER     NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_received_at ON inbox (received_at);

-- Messages a consumer could not parse or apply: kept whole so they can be inspected and replayed.
CREATE TABLE inbox_dead (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    TEXT        NOT NULL,
    message_id  TEXT,
    subject     TEXT        NOT NULL,
    headers     JSONB       NOT NULL,
    payload     BYTEA       NOT NULL,
    error       TEXT        NOT NULL,
    deliveries  BIGINT      NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    retried_at  TIMESTAMPTZ
);
CREATE INDEX inbox_dead_open ON inbox_dead (consumer, id) WHERE retried_at IS NULL;
