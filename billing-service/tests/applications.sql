-- For tests: logs every committed change billing makes to an invoice, one row per application.
-- A BEFORE trigger fires for every row an INSERT proposes, before ON CONFLICT is checked, and
-- for every row an UPDATE touches, so neither `invoices.order_id UNIQUE` nor the insert's
-- ON CONFLICT DO NOTHING can hide a message applied twice: only the inbox can prevent it.
-- Work that rolls back (a failed or not-yet message) takes its log rows with it.
CREATE TABLE test_applications (
    order_id TEXT NOT NULL,
    change   TEXT NOT NULL
);
CREATE FUNCTION test_log_application() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_applications (order_id, change)
    VALUES (NEW.order_id, CASE TG_OP WHEN 'INSERT' THEN 'open' ELSE NEW.status END);
    RETURN NEW;
END
$$;
CREATE TRIGGER test_log_application BEFORE INSERT OR UPDATE ON invoices
    FOR EACH ROW EXECUTE FUNCTION test_log_application();
