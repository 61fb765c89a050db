-- The inbox's records keyed compactly: a 16-byte UUID per message instead of its id as text
-- (37 bytes for a UUID's text, up to 128 for other ids), in the table and in its primary key.
-- An id that is a UUID in its canonical text form (lowercase, hyphenated: what the relay's
-- UUIDv7 ids are) is its own key, so keys keep their ids' time order and new records go to the
-- right edge of the index; any other id is keyed by the first 16 bytes of its SHA-256 (two ids
-- sharing a key, at odds of 2^-128 a pair, would meet the digest check: the second is
-- dead-lettered as an id reused, never dropped in silence).
CREATE FUNCTION inbox_key(message_id TEXT) RETURNS UUID
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN message_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
            THEN message_id::uuid
        ELSE encode(substring(sha256(convert_to(message_id, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid
    END
$$;

CREATE TABLE inbox_records (
    consumer    TEXT        NOT NULL,
    key         UUID        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- How many later deliveries of this message were recognised as duplicates.
    duplicates  INTEGER     NOT NULL DEFAULT 0,
    -- SHA-256 of the message's type and body, telling a copy from an id reused.
    digest      BYTEA,
    PRIMARY KEY (consumer, key)
);
CREATE INDEX inbox_records_received_at ON inbox_records (received_at);

-- No downtime: nothing is copied. The table `inbox` stays as it was and is read beside this one
-- (a copy of a message recorded there is still recognised) and aged out as before, until the
-- retention has emptied it; a later release drops it. Meanwhile instances of the previous
-- version may still be recording into it: each record they make takes its key here too, so a
-- message recorded by both versions at once meets itself on this table's primary key and one
-- of the two transactions fails (and is retried) instead of both applying it. It is counted
-- once more, so that ageing out each table takes its own count off again.
CREATE FUNCTION inbox_record_key() RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO inbox_records (consumer, key, received_at, digest)
    VALUES (NEW.consumer, inbox_key(NEW.message_id), NEW.received_at, NEW.digest);
    INSERT INTO inbox_counts (consumer, slot, processed) VALUES (NEW.consumer, 0, 1)
    ON CONFLICT (consumer, slot) DO UPDATE SET processed = inbox_counts.processed + 1;
    RETURN NULL;
END
$$;
CREATE TRIGGER inbox_record_key AFTER INSERT ON inbox
FOR EACH ROW EXECUTE FUNCTION inbox_record_key();
