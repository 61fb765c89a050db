-- The relay's claim skips every row behind a dead or failing event of its aggregate. Such rows
-- are few (usually none); without this index finding them meant reading the whole table on
-- every pass, published rows included.
CREATE INDEX outbox_blocking ON outbox (aggregate_type, aggregate_id, seq)
    WHERE status = 'dead' OR (status = 'pending' AND attempts > 0);
