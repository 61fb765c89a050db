-- The inbox's records keyed compactly: a 16-byte UUID per message instead of its id as text
-- (37 bytes for a UUID's text, more for longer ids), in the table and in its primary key.
-- An id that is a UUID in canonical text (lowercase, hyphenated: the relay's UUIDv7 ids are)
-- is its own key, so keys keep their ids' time order and new records go to the right edge of
-- the index. Any other id, and a UUID of version 8, is keyed by the first 16 bytes of its
-- SHA-256 marked as a version-8 UUID: the two kinds of keys never meet, and two ids share a
-- key only if their SHA-256s share 122 bits. STABLE, not IMMUTABLE: `convert_to` is.
CREATE FUNCTION inbox_key(message_id TEXT) RETURNS UUID
LANGUAGE sql STABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN message_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-79a-f][0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$'
            THEN message_id::uuid
        ELSE encode(
            set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 128), 8, (get_byte(h, 8) & 63) | 128),
            'hex')::uuid
    END
    FROM (SELECT substring(sha256(convert_to(message_id, 'UTF8')) FROM 1 FOR 16) AS h) AS hashed
$$;

CREATE TABLE inbox_records (
    consumer    TEXT        NOT NULL,
    key         UUID        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- How many later deliveries of this message were recognised as duplicates.
    duplicates  INTEGER     NOT NULL DEFAULT 0,
    -- The key of a record the previous version made in `inbox` (see below): counted there.
    from_inbox  BOOLEAN     NOT NULL DEFAULT false,
    -- SHA-256 of the message's type and body, telling a copy from an id reused.
    digest      BYTEA,
    PRIMARY KEY (consumer, key)
);
CREATE INDEX inbox_records_received_at ON inbox_records (received_at);

-- Roles granted rights on `inbox` (a service running as a role that may not change the schema)
-- get the same on `inbox_records`, so that they keep working once this migration ran.
DO $$
DECLARE
    grant_ RECORD;
BEGIN
    FOR grant_ IN
        SELECT a.grantee::regrole::text AS grantee,
               string_agg(DISTINCT a.privilege_type, ', ') AS privileges
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'inbox'::regclass AND a.grantee NOT IN (0, c.relowner)
        GROUP BY a.grantee
    LOOP
        EXECUTE format('GRANT %s ON inbox_records TO %s', grant_.privileges, grant_.grantee);
    END LOOP;
END
$$;

-- No downtime: nothing is copied. The table `inbox` stays as it was and is read beside this one
-- (a copy of a message recorded there is still recognised) and aged out as before, until the
-- retention has emptied it; a later release drops it. Meanwhile instances of the previous
-- version may still be recording into it: each record they make takes its key here too, so a
-- message recorded by both versions at once meets itself on this table's primary key. If this
-- version's record commits first, the previous version's fails with a unique violation (which
-- billing retries: the message goes on to an instance of this version, where it is a copy);
-- if the previous version's commits first, this version's waits for it and finds a copy.
CREATE FUNCTION inbox_record_key() RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO inbox_records (consumer, key, received_at, from_inbox, digest)
    VALUES (NEW.consumer, inbox_key(NEW.message_id), NEW.received_at, true, NEW.digest);
    RETURN NULL;
END
$$;
CREATE TRIGGER inbox_record_key AFTER INSERT ON inbox
FOR EACH ROW EXECUTE FUNCTION inbox_record_key();
