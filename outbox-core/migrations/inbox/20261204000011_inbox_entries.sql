-- The inbox's records in daily partitions, so that ageing them out empties a partition at a
-- time (TRUNCATE: no row is rewritten, nothing is left for VACUUM) instead of deleting rows.
--
-- A record's partition follows from its key, not from when it arrived: every copy of a message
-- has its key, so copies meet in one partition, and (consumer, key, day) is unique exactly when
-- (consumer, key) is. A UUIDv7 key (the relay's ids) carries its creation time; its `day` is
-- that UTC day modulo a ring of 32. Any other key (hashed ids, other UUIDs) says nothing of
-- time: `day` is -1, one partition aged out row by row as before.
--
-- The ring is fixed here, so nothing creates or drops a table at run time. `inbox_age_out`
-- empties a day's partition once every record in it is older than the longest retention any
-- consumer declared (and none is of a consumer that declared none): with records received on
-- the day their message was made, a retention up to 30 days ages out whole partitions before
-- the ring comes round to them again. A record that outlives that (a longer retention, a
-- message received long after it was made) is deleted row by row once its key is 31 days old
-- and it is past its consumer's retention, so it never holds a partition for ever.

-- The partition of key `key`: its UUIDv7 day (UTC) modulo 32, or -1. Not STRICT, so that it
-- is inlined into the statements calling it.
CREATE FUNCTION inbox_day(key UUID) RETURNS SMALLINT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN substr(key::text, 15, 1) = '7'
            THEN (('x' || substr(key::text, 1, 8) || substr(key::text, 10, 4))::bit(48)::bigint
                  / 86400000 % 32)::smallint
        ELSE -1::smallint
    END
$$;

-- The smallest UUIDv7 of the day 30 days before today (UTC): a record keyed below it was made
-- 31 or more days ago, and its partition's next day comes round within a day.
CREATE FUNCTION inbox_stale_below() RETURNS UUID
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT (lpad(to_hex((floor(extract(epoch FROM now()) / 86400)::bigint - 30) * 86400000),
                 12, '0') || repeat('0', 20))::uuid
$$;

CREATE TABLE inbox_entries (
    consumer      TEXT        NOT NULL,
    key           UUID        NOT NULL,
    received_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- How many later deliveries of this message were recognised as duplicates.
    duplicates    INTEGER     NOT NULL DEFAULT 0,
    -- inbox_day(key): which partition holds the record.
    day           SMALLINT    NOT NULL,
    -- Made by the trigger below for a record of the previous version, which counted it.
    from_previous BOOLEAN     NOT NULL DEFAULT false,
    -- SHA-256 of the message's type and body, telling a copy from an id reused.
    digest        BYTEA,
    -- Unique exactly when (consumer, key) is, as long as every writer sets day = inbox_day(key)
    -- (the crate's statements and the trigger below do). Not a CHECK: with one, a transaction
    -- recording one message ran 14–16% slower on average (pgbench, one client).
    PRIMARY KEY (consumer, key, day)
) PARTITION BY LIST (day);
CREATE INDEX inbox_entries_received_at ON inbox_entries (received_at);

DO $$
BEGIN
    FOR day_ IN 0..31 LOOP
        EXECUTE format('CREATE TABLE inbox_entries_d%s PARTITION OF inbox_entries FOR VALUES IN (%s)',
                       lpad(day_::text, 2, '0'), day_);
    END LOOP;
END
$$;
CREATE TABLE inbox_entries_other PARTITION OF inbox_entries FOR VALUES IN (-1);

-- The counts of the records in inbox_entries, by partition, so that emptying one takes its
-- counts with it. Spread over slots as inbox_counts is; inbox_counts keeps counting the
-- records of the tables before this one.
CREATE TABLE inbox_day_counts (
    consumer   TEXT     NOT NULL,
    day        SMALLINT NOT NULL,
    slot       SMALLINT NOT NULL,
    processed  BIGINT   NOT NULL DEFAULT 0,
    duplicates BIGINT   NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, day, slot)
);

-- The retention each consumer's cleanup last declared: a partition is shared by every consumer
-- of the database, so it is emptied only when the longest of them has passed, and never while
-- it holds a record of a consumer that declared none (one without a cleanup keeps its records).
-- Delete the row of a consumer that is gone for good.
CREATE TABLE inbox_retentions (
    consumer  TEXT     PRIMARY KEY,
    retention INTERVAL NOT NULL
);

-- Declares `for_consumer`'s retention and empties at most one partition of days whose records
-- are all older than the longest retention declared and whose consumers all declared one;
-- returns its day and how many records this version had counted in it (every consumer's).
-- Runs as the tables' owner, so that a role that may not TRUNCATE (a least-privileged service)
-- can age out what it could delete row by row anyway. One caller at a time (another returns at
-- once, declaring nothing); a partition another transaction holds for more than 100 ms is left
-- for a later round. It must run at READ COMMITTED: what it reads under a partition's lock
-- must include what committed before it.
CREATE FUNCTION inbox_age_out(for_consumer TEXT, kept_for INTERVAL)
RETURNS TABLE (emptied_day SMALLINT, records BIGINT)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET lock_timeout = '100ms'
AS $$
DECLARE
    newest   TIMESTAMPTZ;
    ready    BOOLEAN;
    part     TEXT;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'inbox_age_out must run at READ COMMITTED, not %',
            current_setting('transaction_isolation');
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('inbox_age_out', 0)) THEN
        RETURN;
    END IF;
    INSERT INTO inbox_retentions AS r (consumer, retention) VALUES (for_consumer, kept_for)
    ON CONFLICT (consumer) DO UPDATE SET retention = EXCLUDED.retention
    WHERE r.retention <> EXCLUDED.retention;
    FOR d IN 0..31 LOOP
        part := format('inbox_entries_d%s', lpad(d::text, 2, '0'));
        BEGIN
            -- Once before the lock, so as not to take it in vain, and again under it: a record
            -- or a declaration may have come meanwhile. One statement, so that the records,
            -- their consumers and the retentions are read in one snapshot.
            FOR attempt IN 1..2 LOOP
                IF attempt = 2 THEN
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', part);
                END IF;
                EXECUTE format(
                    'WITH RECURSIVE c AS (
                         (SELECT consumer FROM %1$I ORDER BY consumer LIMIT 1)
                         UNION ALL
                         SELECT (SELECT e.consumer FROM %1$I AS e WHERE e.consumer > c.consumer
                                 ORDER BY e.consumer LIMIT 1)
                         FROM c WHERE c.consumer IS NOT NULL
                     )
                     SELECT (SELECT max(received_at) FROM %1$I)
                                < now() - (SELECT max(retention) FROM inbox_retentions)
                        AND NOT EXISTS (
                            SELECT FROM c WHERE c.consumer IS NOT NULL AND NOT EXISTS (
                                SELECT FROM inbox_retentions AS r
                                WHERE r.consumer = c.consumer))',
                    part) INTO ready;
                IF ready IS NOT TRUE THEN
                    -- Empty, too new, or a consumer without a retention: undone, so that a
                    -- lock taken for it is let go at once.
                    RAISE SQLSTATE 'IA001';
                END IF;
            END LOOP;
            emptied_day := d;
            WITH gone AS (DELETE FROM inbox_day_counts AS c WHERE c.day = d RETURNING c.processed)
            SELECT COALESCE(sum(processed), 0) INTO records FROM gone;
            EXECUTE format('TRUNCATE %I', part);
            RETURN NEXT;
            RETURN;
        EXCEPTION WHEN lock_not_available OR SQLSTATE 'IA001' THEN
            CONTINUE;
        END;
    END LOOP;
END
$$;
-- The schema the tables are in, then pg_temp: a caller's temporary table of the same name is
-- never read instead of them.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION inbox_age_out(TEXT, INTERVAL) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
REVOKE EXECUTE ON FUNCTION inbox_age_out(TEXT, INTERVAL) FROM PUBLIC;

-- Roles granted rights on `inbox_records` and `inbox_counts` (a service running as a role that
-- may not change the schema) get the same on the tables that take their place, and those that
-- may delete records may age them out.
DO $$
DECLARE
    grant_ RECORD;
BEGIN
    FOR grant_ IN
        SELECT c.relname AS source,
               a.grantee::regrole::text AS grantee,
               string_agg(DISTINCT a.privilege_type, ', ') AS privileges,
               bool_or(a.privilege_type = 'DELETE') AS deletes
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid IN ('inbox_records'::regclass, 'inbox_counts'::regclass)
          AND a.grantee NOT IN (0, c.relowner)
        GROUP BY c.relname, a.grantee
    LOOP
        EXECUTE format('GRANT %s ON %I TO %s', grant_.privileges,
                       CASE grant_.source WHEN 'inbox_records' THEN 'inbox_entries'
                                          ELSE 'inbox_day_counts' END,
                       grant_.grantee);
        IF grant_.source = 'inbox_records' AND grant_.deletes THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION inbox_age_out(TEXT, INTERVAL) TO %s',
                           grant_.grantee);
        END IF;
    END LOOP;
END
$$;

-- No downtime, as with inbox_records before: nothing is copied. `inbox_records` (and `inbox`
-- before it) stay, are read beside this table and aged out row by row until the retention has
-- emptied them. Instances of the previous version still record into `inbox_records` while they
-- run; each record they make takes its key here too, so a message recorded by both versions at
-- once meets itself on this table's primary key (the later one's transaction waits, then fails
-- with a unique violation or finds a copy).
CREATE FUNCTION inbox_entry_of_record() RETURNS TRIGGER
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO inbox_entries (consumer, key, received_at, day, from_previous, digest)
    VALUES (NEW.consumer, NEW.key, NEW.received_at, inbox_day(NEW.key), true, NEW.digest);
    RETURN NULL;
END
$$;
CREATE TRIGGER inbox_entry_of_record AFTER INSERT ON inbox_records
FOR EACH ROW EXECUTE FUNCTION inbox_entry_of_record();
