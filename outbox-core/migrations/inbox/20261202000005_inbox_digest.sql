-- A digest of each processed message's content, so that an id reused by a different message is
-- told apart from a copy of the first (a copy is acknowledged, a reused id is not applied).
-- Rows recorded before this column existed keep NULL and are taken as matching any copy.
-- Adding a nullable column without a default rewrites nothing: no downtime on a large inbox.
ALTER TABLE inbox ADD COLUMN digest BYTEA;
