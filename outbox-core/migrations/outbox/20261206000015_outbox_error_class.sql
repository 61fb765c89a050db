-- The kind of an event's last failure, beside its text: a stable name (`unpublishable`,
-- `not-accepted`, `storage-full`, ...) that operators filter and group dead events by, where the
-- text names values that differ from one event to the next. NULL for rows failed before it.
ALTER TABLE outbox ADD COLUMN error_class text;
