-- `outbox_age_out` made safe against a clock stepped back, hand-called intervals and objects
-- others may create in the tables' schema:
--
-- * A partition holding an event published after the retention's cutoff is never emptied. The
--   ring's arithmetic alone took a partition being written for one eight days old when the
--   clock stepped back across a two-hour boundary (NTP correcting it): events the relay put in
--   the next two hours' partition by the clock before the step were emptied seconds later. The
--   check runs before the partition's lock and again under it (which waits for a relay still
--   writing there), and reads its BRIN index, summarised first: a few blocks.
-- * A retention is compared as seconds (a day 24 hours, a month 30 days), so an interval
--   written in days means the same on a day with a daylight-saving change.
-- * Every built-in function is called as pg_catalog's and every operator gets operands of the
--   exact types pg_catalog's takes: the function runs as the tables' owner, and a function or
--   operator someone created in the schema that matched a call's types better would otherwise
--   run with the owner's rights.
--
-- Same signature, owner and grants: nothing to migrate but the function.
CREATE OR REPLACE FUNCTION outbox_age_out(kept_for INTERVAL)
RETURNS TABLE (emptied_slot SMALLINT, events BIGINT)
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET lock_timeout = '100ms'
-- The freshness check below reads the BRIN index whatever the partition's statistics say (a
-- partition emptied and filled again since its last ANALYZE looks empty or full at random).
SET enable_seqscan = off
AS $$
DECLARE
    kept_s   NUMERIC := EXTRACT(epoch FROM kept_for);
    now_s    NUMERIC;
    current_ NUMERIC;
    latest   NUMERIC;
    part     TEXT;
    held     BOOLEAN;
    settled  BOOLEAN;
BEGIN
    IF kept_s > 676800.0 OR kept_s < 0.0 THEN
        RAISE EXCEPTION 'outbox_age_out: a retention of % is not within the 0 to 188 hours the ring of published events keeps',
            kept_for USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(
            pg_catalog.hashtextextended('outbox_age_out'::text, 0::bigint)) THEN
        RETURN;
    END IF;
    FOR s IN 0..95 LOOP
        part := pg_catalog.format('outbox_published_s%s', pg_catalog.lpad(s::text, 2, '0'::text));
        BEGIN
            -- Once before the lock, so as not to take it in vain, and again under it: the
            -- clock may have passed a boundary while it waited.
            FOR attempt IN 1..2 LOOP
                IF attempt = 2 THEN
                    EXECUTE pg_catalog.format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', part);
                END IF;
                now_s := EXTRACT(epoch FROM pg_catalog.clock_timestamp());
                current_ := pg_catalog.floor(now_s / 7200.0);
                -- The latest two hours of slot s that have begun.
                latest := current_
                    - pg_catalog.mod(pg_catalog.mod(current_ - s::numeric, 96.0) + 96.0, 96.0);
                IF latest = current_ OR (latest + 1.0) * 7200.0 > now_s - kept_s THEN
                    RAISE SQLSTATE 'OA001';
                END IF;
                IF attempt = 1 THEN
                    -- The blocks written since the last VACUUM are not summarised yet (the
                    -- last fifth of a partition, as autovacuum leaves it), and the check
                    -- would read them all under the lock. Only BRIN indexes: an operator's
                    -- B-tree beside them is no reason to fail.
                    PERFORM pg_catalog.brin_summarize_new_values(i.indexrelid::regclass)
                    FROM pg_catalog.pg_index AS i
                    JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid
                    JOIN pg_catalog.pg_am AS am ON am.oid = ic.relam
                    WHERE i.indrelid = part::regclass::oid AND am.amname = 'brin'::name
                      AND i.indisvalid;
                END IF;
                -- Holds events, none of them published after the cutoff by the clock as it
                -- was (it stepped back since).
                EXECUTE pg_catalog.format(
                    'SELECT EXISTS (SELECT FROM %I), NOT EXISTS (SELECT FROM %I WHERE published_at > $1)',
                    part, part)
                    INTO held, settled
                    USING pg_catalog.to_timestamp((now_s - kept_s)::double precision);
                IF NOT (held AND settled) THEN
                    RAISE SQLSTATE 'OA001';
                END IF;
            END LOOP;
            emptied_slot := s;
            SELECT COALESCE(NULLIF(pg_catalog.pg_stat_get_live_tuples(c.oid), 0::bigint),
                            GREATEST(c.reltuples, 0::real)::bigint)
            INTO events FROM pg_catalog.pg_class AS c WHERE c.oid = part::regclass::oid;
            EXECUTE pg_catalog.format('TRUNCATE %I', part);
            RETURN NEXT;
        EXCEPTION WHEN lock_not_available OR SQLSTATE 'OA001' THEN
            -- Too new, empty or in use: undone, so that a lock taken for it is let go at once.
            CONTINUE;
        END;
    END LOOP;
END
$$;
-- CREATE OR REPLACE dropped the search path set after the first version.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION outbox_age_out(INTERVAL) SET search_path = %I, pg_temp',
        pg_catalog.current_schema());
END
$$;
