-- The kind of failure that made a dead letter, beside its text: a stable name the consumer
-- chooses (billing's `invalid-payload`, `body-too-large`, ...) that operators filter and group
-- dead letters by. NULL when the consumer gave none, and for letters kept before it.
ALTER TABLE inbox_dead ADD COLUMN error_class text;
