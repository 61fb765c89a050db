-- Every operator action taken through the admin API (retry, skip, replay, one item or every
-- item a filter matches): who (the name of the token that authorised it), what, on what, how
-- many, when. Kept in the service's own database, written in the action's wake; read by
-- GET /ops/audit and the /ops page.
CREATE TABLE ops_audit (
    id     BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor  TEXT        NOT NULL,
    action TEXT        NOT NULL,
    target TEXT        NOT NULL,
    count  BIGINT      NOT NULL
);
