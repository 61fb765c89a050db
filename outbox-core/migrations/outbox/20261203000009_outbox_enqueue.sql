-- Enqueues an event from SQL, as `jetstream_outbox::enqueue` does (it calls this function), so that
-- a caller can write its own row and the event in one statement: one round trip, with no
-- explicit transaction, where BEGIN, the two inserts and COMMIT take four.
--
-- The transaction-scoped advisory lock per aggregate serialises the transactions that enqueue
-- events of one aggregate, so per aggregate the outbox order (seq) is the commit order. It is
-- taken before the row gets its seq and held until commit.
--
-- event_id should be a UUIDv7 (jetstream_outbox::event_id()): the consumers' inbox keys records by
-- it, and time-ordered keys go to the right edge of its index.
CREATE FUNCTION outbox_enqueue(
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
    VALUES (event_id, aggregate_type, aggregate_id, event_type, payload, traceparent);
    RETURN event_id;
END
$$;
