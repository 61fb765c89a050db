-- Counts per consumer kept by the inbox's own statements, so that its stats read a few rows
-- instead of every record: `processed` (records written) and `duplicates` (copies recognised),
-- over the inbox's retention (the cleanup subtracts what it deletes). Spread over slots, so
-- that concurrent transactions seldom wait on one row.
CREATE TABLE inbox_counts (
    consumer   TEXT     NOT NULL,
    slot       SMALLINT NOT NULL,
    processed  BIGINT   NOT NULL DEFAULT 0,
    duplicates BIGINT   NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, slot)
);
-- What the inbox holds now, counted once. Records written meanwhile by instances still running
-- the code before this migration are not counted (the counts are then that much low until
-- those records age out).
INSERT INTO inbox_counts (consumer, slot, processed, duplicates)
SELECT consumer, 0, count(*), COALESCE(sum(duplicates), 0) FROM inbox GROUP BY consumer;
