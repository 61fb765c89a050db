-- The same keys as before, computed by one expression PostgreSQL can inline into the statement
-- that calls it. The first version read its hash in a FROM clause, which made it a function
-- call of its own in every statement: about 0.1 ms per recorded batch of one message, the most
-- expensive part of recording it. Inlining also needs the function not to be STRICT (the planner
-- cannot prove the CASE strict); a NULL id still gives a NULL key.
CREATE OR REPLACE FUNCTION inbox_key(message_id TEXT) RETURNS UUID
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN message_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-79a-f][0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$'
            THEN message_id::uuid
        ELSE encode(
            set_byte(
                set_byte(
                    substring(sha256(convert_to(message_id, 'UTF8')) FROM 1 FOR 16),
                    6, (get_byte(sha256(convert_to(message_id, 'UTF8')), 6) & 15) | 128),
                8, (get_byte(sha256(convert_to(message_id, 'UTF8')), 8) & 63) | 128),
            'hex')::uuid
    END
$$;
