-- A dead letter is closed either by a replay that applied it or by an operator who gave up on
-- it; both keep the row, and the resolution says which.
ALTER TABLE inbox_dead RENAME COLUMN retried_at TO closed_at;
ALTER TABLE inbox_dead ADD COLUMN resolution TEXT
    CHECK (resolution IN ('applied', 'skipped'));
-- Until now only a successful replay closed a dead letter.
UPDATE inbox_dead SET resolution = 'applied' WHERE closed_at IS NOT NULL;
ALTER TABLE inbox_dead ADD CONSTRAINT inbox_dead_closed_has_resolution
    CHECK ((closed_at IS NULL) = (resolution IS NULL));
