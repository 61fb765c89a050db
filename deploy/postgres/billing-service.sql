-- The role billing-service runs as: no superuser, no schema changes, only the rows it works on.
--
-- Run in the billing database as a superuser (or as a role with CREATEROLE that owns the
-- tables), after the migrations were applied by the owner (billing-service migrate, with the
-- owner's DATABASE_URL). Then set a password:
--   ALTER ROLE billing_app PASSWORD '…';
-- and run billing-service with DATABASE_URL=postgres://billing_app:…@host/billing and
-- DATABASE_MIGRATE=false. e2e/tests/least_privilege.rs runs the service with exactly these grants.
CREATE ROLE billing_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT USAGE ON SCHEMA public TO billing_app;
GRANT SELECT, INSERT, UPDATE ON invoices TO billing_app;
-- UPDATE counts duplicates; DELETE: the cleanup task removes records after INBOX_RETENTION_MS
-- that no partition's ageing-out takes.
GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_entries TO billing_app;
-- Empties a day's partition of inbox_entries once all its records are past the retention (it
-- runs as the owner: the role itself may not TRUNCATE).
GRANT EXECUTE ON FUNCTION inbox_age_out(TEXT, INTERVAL) TO billing_app;
-- The records of jetstream-outbox's earlier versions, read until they age out.
GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_records, inbox TO billing_app;
-- The counts the inbox keeps as it records and deletes.
GRANT SELECT, INSERT, UPDATE ON inbox_day_counts, inbox_counts TO billing_app;
-- Dead letters are kept: closed by an operator, never deleted.
GRANT SELECT, INSERT, UPDATE ON inbox_dead TO billing_app;
-- The audit log of operator actions: written by each action, read by GET /ops/audit.
GRANT SELECT, INSERT ON ops_audit TO billing_app;
-- Read only: start-up checks that every migration was applied.
GRANT SELECT ON _sqlx_migrations TO billing_app;
