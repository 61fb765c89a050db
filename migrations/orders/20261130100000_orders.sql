CREATE TABLE orders (
    id          TEXT        PRIMARY KEY,
    customer    TEXT        NOT NULL CHECK (length(customer) BETWEEN 1 AND 200),
    total_minor BIGINT      NOT NULL CHECK (total_minor > 0),
    status      TEXT        NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'paid', 'shipped')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Newest-first pages.
CREATE INDEX orders_created_at_id ON orders (created_at DESC, id DESC);
