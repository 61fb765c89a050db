-- What it takes to keep the promise past the broker's and the producer's edge.
--
-- * Every row the relay meets can become a message: the table refuses, for any writer
--   (`outbox_enqueue`, the crate, a hand-written INSERT), a pending event whose names are not
--   subject tokens, exactly what `NewEvent` refuses, and `outbox_enqueue` leaves out a
--   traceparent that is not W3C's, as `NewEvent::with_traceparent` does (the relay leaves out
--   any other it meets). NOT VALID: rows written before are not read now (no lock held for a
--   scan); the relay makes any such row dead, with its reason, which the constraints allow (a
--   dead or skipped event may keep the names it was written with).
-- * What the broker acknowledged is known: each published event keeps the stream sequence its
--   acknowledgement named (`stream_seq`), and `outbox_stream_checks` the positions the relay
--   found holding what it published. A broker that forgot acknowledged messages (JetStream
--   acknowledges before its lazy fsync; a store lost or restored from a copy) is found out by
--   comparing them, and the events it lost are moved back into the outbox to be published
--   again, in their original order (their original seq) and with their original id.
-- * A republished event keeps when it was first published: `outbox.published_at`, unused since
--   published rows leave the outbox, holds it for an event moved back, and the relay sends it
--   to consumers (`ce-firstpublishedtime`), who judge a message's age from it.
-- * A publish whose outcome is unknown (no acknowledgement; a full account, which JetStream
--   answers for a message it stored and removed, a removal a crash can undo) is remembered
--   (`outbox.maybe_published`): before publishing the event again, the relay looks for it in
--   the stream, since the broker's duplicate window may not drop the copy.

ALTER TABLE outbox
    ADD CONSTRAINT outbox_aggregate_type_is_a_token
        CHECK (status <> 'pending' OR aggregate_type ~ '^[A-Za-z0-9_:@-]{1,128}$') NOT VALID,
    ADD CONSTRAINT outbox_aggregate_id_is_a_token
        CHECK (status <> 'pending' OR aggregate_id ~ '^[A-Za-z0-9_:@-]{1,128}$') NOT VALID,
    ADD CONSTRAINT outbox_event_type_is_a_token
        CHECK (status <> 'pending' OR event_type ~ '^[A-Za-z0-9_:@-]{1,128}$') NOT VALID;

-- As in 20261203000009, and a traceparent that is not W3C's left out.
CREATE OR REPLACE FUNCTION outbox_enqueue(
    event_id       uuid,
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    traceparent    text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('outbox/' || aggregate_type || '/' || aggregate_id, 0));
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, traceparent)
    VALUES (event_id, aggregate_type, aggregate_id, event_type, payload,
            CASE WHEN traceparent ~ '^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$'
                 THEN traceparent END);
    RETURN event_id;
END
$$;

-- A constant default: adding it rewrites nothing.
ALTER TABLE outbox ADD COLUMN maybe_published BOOLEAN NOT NULL DEFAULT false;

-- Nullable, no default: adding it rewrites nothing. NULL for events published before.
ALTER TABLE outbox_published ADD COLUMN stream_seq BIGINT;

CREATE OR REPLACE VIEW outbox_events AS
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent, status,
       attempts, last_error, created_at, published_at, NULL::bigint AS stream_seq
FROM outbox
UNION ALL
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent, 'published',
       attempts, NULL, created_at, published_at, stream_seq
FROM outbox_published;

-- Positions of a stream found holding the message the relay published there: the message at
-- `seq` had `message_id` (its Nats-Msg-Id; NULL for an empty stream, seq 0) when checked. A
-- stream that loses messages loses its newest ones, so a position that still holds vouches for
-- every one before it; `created` tells a stream deleted and made again from the one checked.
CREATE TABLE outbox_stream_checks (
    stream     TEXT        NOT NULL,
    created    TIMESTAMPTZ NOT NULL,
    seq        BIGINT      NOT NULL,
    message_id TEXT,
    checked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (stream, created, seq)
);

-- The relay's role (any role that may update outbox) records its checks and moves lost events
-- back; the grants of migration 20261205000012 gave it SELECT and INSERT on outbox_published.
DO $$
DECLARE
    grant_ RECORD;
BEGIN
    FOR grant_ IN
        SELECT a.grantee::regrole::text AS grantee
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'outbox'::regclass AND a.grantee NOT IN (0, c.relowner)
          AND a.privilege_type = 'UPDATE'
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_stream_checks TO %s',
                       grant_.grantee);
        EXECUTE format('GRANT DELETE ON outbox_published TO %s', grant_.grantee);
    END LOOP;
END
$$;
