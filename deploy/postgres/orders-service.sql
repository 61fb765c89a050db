-- The role orders-service runs as: no superuser, no schema changes, only the rows it works on.
--
-- Run in the orders database as a superuser (or as a role with CREATEROLE that owns the
-- tables), after the migrations were applied by the owner (orders-service migrate, with the
-- owner's DATABASE_URL). Then set a password:
--   ALTER ROLE orders_app PASSWORD '…';
-- and run orders-service with DATABASE_URL=postgres://orders_app:…@host/orders and
-- DATABASE_MIGRATE=false. e2e/tests/least_privilege.rs runs the service with exactly these grants.
CREATE ROLE orders_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT USAGE ON SCHEMA public TO orders_app;
GRANT SELECT, INSERT, UPDATE ON orders TO orders_app;
-- DELETE: the relay moves each event it publishes out of the outbox, and the cleanup task
-- removes skipped events after OUTBOX_RETENTION_MS.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO orders_app;
-- The relay moves each event it publishes to outbox_published, and back into the outbox if the
-- broker lost it (DELETE); the cleanup task empties its partitions past OUTBOX_RETENTION_MS
-- through outbox_age_out, which runs as the owner (the role itself may not TRUNCATE).
GRANT SELECT, INSERT, DELETE ON outbox_published TO orders_app;
-- The relay's checks of the stream against what it published.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_stream_checks TO orders_app;
GRANT SELECT ON outbox_events TO orders_app;
GRANT EXECUTE ON FUNCTION outbox_age_out(INTERVAL) TO orders_app;
-- The audit log of operator actions: written by each action, read by GET /ops/audit.
GRANT SELECT, INSERT ON ops_audit TO orders_app;
-- Read only: start-up checks that every migration was applied.
GRANT SELECT ON _sqlx_migrations TO orders_app;
