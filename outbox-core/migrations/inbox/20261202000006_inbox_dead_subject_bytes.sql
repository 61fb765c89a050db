-- A subject PostgreSQL cannot store as text (it holds a NUL byte, which NATS carries) is kept
-- here byte for byte; `subject` then holds a readable view of it. NULL for every other letter.
-- Adding a nullable column without a default rewrites nothing.
ALTER TABLE inbox_dead ADD COLUMN subject_bytes BYTEA;
