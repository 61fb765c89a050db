CREATE TABLE invoices (
    id          UUID        PRIMARY KEY,
    -- One invoice per order, whatever the number of deliveries.
    order_id    TEXT        NOT NULL UNIQUE,
    total_minor BIGINT      NOT NULL CHECK (total_minor > 0),
    status      TEXT        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'paid')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    paid_at     TIMESTAMPTZ
);

-- Newest-first pages.
CREATE INDEX invoices_created_at_id ON invoices (created_at DESC, id DESC);
