-- Published events leave the outbox: the relay moves each one, as it records it published, into
-- `outbox_published`, a ring of partitions by the two hours it was published in. Ageing them
-- out empties a partition whose two hours are past the retention (TRUNCATE: no row is
-- rewritten, nothing is left for VACUUM), and the outbox keeps only what is still to publish
-- (pending and dead events; skipped ones until the retention), so the relay's claim reads the
-- same small table however much history is kept.
--
-- Moving a row costs the relay less than marking it did: a DELETE writes no new row version
-- and no index entry, and the insert into a partition one heap tuple and, at most, a BRIN
-- summary's update, where the UPDATE to 'published' wrote a new version of the row and three
-- index entries. The relay's role so needs DELETE on `outbox` beside UPDATE (the grants below
-- give it what else it needs, but cannot give that: a role granted UPDATE and not DELETE gets
-- a warning here and its relay fails until it is granted).
--
-- The ring is fixed here, so nothing creates or drops a table at run time: 96 partitions of
-- two hours, eight days. A partition is emptied once the last two hours it took are `kept_for`
-- past, before the ring comes round to it again as long as `kept_for` is at most 188 hours
-- (the 96 slots less the current one and the one being emptied); a longer retention is
-- refused rather than kept short.

-- The slot of the ring that events published at `at` go to: its two hours since the epoch,
-- modulo 96.
CREATE FUNCTION outbox_published_slot(at TIMESTAMPTZ) RETURNS SMALLINT
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (floor(extract(epoch FROM at) / 7200)::bigint % 96)::smallint
$$;

-- Nothing on the relay's path reads this table: its one index is a BRIN (below), which costs
-- an insert next to nothing.
CREATE TABLE outbox_published (
    seq            BIGINT      NOT NULL,
    id             UUID        NOT NULL,
    aggregate_type TEXT        NOT NULL,
    aggregate_id   TEXT        NOT NULL,
    event_type     TEXT        NOT NULL,
    payload        JSONB       NOT NULL,
    traceparent    TEXT,
    -- Failed attempts before the one that was published.
    attempts       INTEGER     NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    published_at   TIMESTAMPTZ NOT NULL,
    -- outbox_published_slot(published_at): which partition holds the event.
    slot           SMALLINT    NOT NULL
) PARTITION BY LIST (slot);

-- An operator looking for an event by its id or publishing time reads a few blocks, not a
-- partition: the relay's ids are UUIDv7, time-ordered as the rows are written, and so are the
-- publishing times. A B-tree would cost each published event an entry.
CREATE INDEX outbox_published_id_published_at ON outbox_published
    USING brin (id, published_at);

DO $$
BEGIN
    FOR slot_ IN 0..95 LOOP
        EXECUTE format(
            'CREATE TABLE outbox_published_s%s PARTITION OF outbox_published FOR VALUES IN (%s)',
            lpad(slot_::text, 2, '0'), slot_);
    END LOOP;
END
$$;

-- Every event the database still holds, with its status: what is left in the outbox and what
-- was published, for operators and tests asking what became of an event.
CREATE VIEW outbox_events AS
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent, status,
       attempts, last_error, created_at, published_at
FROM outbox
UNION ALL
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, traceparent, 'published',
       attempts, NULL, created_at, published_at
FROM outbox_published;

-- Empties every partition whose latest two hours ended `kept_for` ago or more and that holds
-- events; returns each one's slot and PostgreSQL's count of its live rows: its statistics
-- (which reach a transaction's changes some seconds after it commits, up to a minute on a busy
-- server), or where they are lost (a crash, a database copied from a template) the estimate the
-- last VACUUM or ANALYZE made. Runs as the tables' owner, so that a role that may not TRUNCATE
-- (a least-privileged service) can age out published events without being able to empty the
-- table at will: only what is past the retention it gives, and never the partition being
-- written. One caller at a time (another returns at once, emptying nothing); a partition
-- another transaction holds for more than 100 ms is left for a later round.
--
-- Every event in a partition was published within its latest two hours or in an earlier round
-- of the ring (ones whose publishing transaction committed late included, as the lock waits
-- for them), so all of them are past `kept_for` when those two hours are. The time is the
-- clock's, read again under the lock, not the transaction's start: a caller's transaction
-- begun before a two-hour boundary would otherwise take the partition now being written for
-- one eight days old.
CREATE FUNCTION outbox_age_out(kept_for INTERVAL)
RETURNS TABLE (emptied_slot SMALLINT, events BIGINT)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET lock_timeout = '100ms'
AS $$
DECLARE
    at_      TIMESTAMPTZ;
    current_ BIGINT;
    latest   BIGINT;
    part     TEXT;
    held     BOOLEAN;
BEGIN
    IF kept_for > interval '188 hours' OR kept_for < interval '0' THEN
        RAISE EXCEPTION 'outbox_age_out: a retention of % is not within the 0 to 188 hours the ring of published events keeps',
            kept_for USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('outbox_age_out', 0)) THEN
        RETURN;
    END IF;
    FOR s IN 0..95 LOOP
        part := format('outbox_published_s%s', lpad(s::text, 2, '0'));
        BEGIN
            -- Once before the lock, so as not to take it in vain, and again under it: the
            -- clock may have passed a boundary while it waited.
            FOR attempt IN 1..2 LOOP
                IF attempt = 2 THEN
                    EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', part);
                END IF;
                at_ := clock_timestamp();
                current_ := floor(extract(epoch FROM at_) / 7200)::bigint;
                -- The latest two hours of slot s that have begun.
                latest := current_ - ((current_ - s) % 96 + 96) % 96;
                IF latest = current_ OR to_timestamp((latest + 1) * 7200) > at_ - kept_for THEN
                    RAISE SQLSTATE 'OA001';
                END IF;
                EXECUTE format('SELECT EXISTS (SELECT FROM %I)', part) INTO held;
                IF NOT held THEN
                    RAISE SQLSTATE 'OA001';
                END IF;
            END LOOP;
            emptied_slot := s;
            SELECT COALESCE(NULLIF(pg_stat_get_live_tuples(c.oid), 0),
                            greatest(c.reltuples, 0)::bigint)
            INTO events FROM pg_class AS c WHERE c.oid = part::regclass;
            EXECUTE format('TRUNCATE %I', part);
            RETURN NEXT;
        EXCEPTION WHEN lock_not_available OR SQLSTATE 'OA001' THEN
            -- Too new, empty or in use: undone, so that a lock taken for it is let go at once.
            CONTINUE;
        END;
    END LOOP;
END
$$;
-- The schema the tables are in, then pg_temp: a caller's temporary table of the same name is
-- never emptied instead of them.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_age_out(INTERVAL) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
REVOKE EXECUTE ON FUNCTION outbox_age_out(INTERVAL) FROM PUBLIC;

-- Roles granted rights on `outbox` (a service running as a role that may not change the
-- schema) may read the published events; those that may update it (the relay) may move them
-- here, and those that may delete from it (the relay, the cleanup) may age them out.
DO $$
DECLARE
    grant_ RECORD;
BEGIN
    FOR grant_ IN
        SELECT a.grantee::regrole::text AS grantee,
               bool_or(a.privilege_type = 'SELECT') AS reads,
               bool_or(a.privilege_type = 'UPDATE') AS updates,
               bool_or(a.privilege_type = 'DELETE') AS deletes
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'outbox'::regclass AND a.grantee NOT IN (0, c.relowner)
        GROUP BY a.grantee
    LOOP
        IF grant_.reads THEN
            EXECUTE format('GRANT SELECT ON outbox_published, outbox_events TO %s',
                           grant_.grantee);
        END IF;
        IF grant_.updates THEN
            EXECUTE format('GRANT INSERT ON outbox_published TO %s', grant_.grantee);
            IF NOT grant_.deletes THEN
                RAISE WARNING 'role % may update outbox but not delete from it: its relay needs DELETE on outbox from this version on (GRANT DELETE ON outbox TO %)',
                    grant_.grantee, grant_.grantee;
            END IF;
        END IF;
        IF grant_.deletes THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION outbox_age_out(INTERVAL) TO %s',
                           grant_.grantee);
        END IF;
    END LOOP;
END
$$;

-- No downtime: nothing is copied or locked for long. Events published before this migration,
-- or by instances of the previous version while they still run (they mark rows 'published' in
-- the outbox), stay in the outbox and are deleted row by row after the retention, as before.
