//! Every SQL statement on the inbox's records and counts; the dead letters' are in `dead::storage`.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use super::InboxStats;

/// What [`record`] found for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The id is new: recorded.
    New,
    /// The id was there with the same digest: the duplicate is counted.
    Copy,
    /// The id was there with another digest.
    OtherContent,
}

/// Records each of `ids` (distinct) with its digest for `consumer`, or says what was there; a
/// copy's duplicate counter goes up. The consumer's counts, in `slot`, go up with them.
pub(crate) async fn record(
    conn: &mut PgConnection,
    consumer: &str,
    ids: &[&str],
    digests: &[&[u8]],
    slot: i16,
) -> sqlx::Result<Vec<Recorded>> {
    let inserted = insert_new(conn, consumer, ids, digests, slot).await?;
    let mut recorded: Vec<Recorded> = ids
        .iter()
        .map(|id| {
            if inserted.iter().any(|new| new == id) {
                Recorded::New
            } else {
                Recorded::OtherContent
            }
        })
        .collect();
    let (seen, seen_digests): (Vec<&str>, Vec<&[u8]>) = ids
        .iter()
        .zip(digests)
        .zip(&recorded)
        .filter(|(_, recorded)| **recorded != Recorded::New)
        .map(|((id, digest), _)| (*id, *digest))
        .unzip();
    if seen.is_empty() {
        return Ok(recorded);
    }
    let copies = count_copies(conn, consumer, &seen, &seen_digests, slot).await?;
    for (id, recorded) in ids.iter().zip(&mut recorded) {
        if *recorded == Recorded::OtherContent && copies.iter().any(|copy| copy == id) {
            *recorded = Recorded::Copy;
        }
    }
    Ok(recorded)
}

/// The digest recorded for message `id` of `consumer` (`Some(None)`: recorded without one, by
/// an early version), or `None` when it is not recorded; reads the older tables too.
pub(crate) async fn recorded_digest(
    pool: &PgPool,
    consumer: &str,
    id: &str,
) -> sqlx::Result<Option<Option<Vec<u8>>>> {
    let found = sqlx::query!(
        r#"
        SELECT digest FROM inbox_entries
        WHERE consumer = $1 AND key = inbox_key($2) AND day = inbox_day(inbox_key($2))
        UNION ALL
        SELECT digest FROM inbox_records WHERE consumer = $1 AND key = inbox_key($2)
        UNION ALL
        SELECT digest FROM inbox WHERE consumer = $1 AND message_id = $2
        LIMIT 1
        "#,
        consumer,
        id,
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.map(|row| row.digest))
}

/// Records the ids of `ids` not recorded yet and returns them, counting them in `slot`.
async fn insert_new(
    conn: &mut PgConnection,
    consumer: &str,
    ids: &[&str],
    digests: &[&[u8]],
    slot: i16,
) -> sqlx::Result<Vec<String>> {
    // In key order, so that two consumers of this version recording overlapping batches take
    // the rows' locks in the same order and never deadlock. A message recorded in the tables
    // before `inbox_entries` is no new one. Of two ids of a batch sharing a key, one is
    // recorded and the other is judged as a delivery of it (`count_copies`).
    sqlx::query_scalar!(
        r#"
        WITH m AS (
            SELECT DISTINCT ON (key) message_id, digest, key, inbox_day(key) AS day
            FROM (
                SELECT message_id, digest, inbox_key(message_id) AS key
                FROM unnest($2::text[], $3::bytea[]) AS m(message_id, digest)
                -- Kept a subquery, so that inbox_day is inlined on a column (given the
                -- key's whole expression, PostgreSQL would call it as a function).
                OFFSET 0
            ) AS keyed
            ORDER BY key, message_id
        ),
        inserted AS (
            INSERT INTO inbox_entries (consumer, key, day, digest)
            SELECT $1, key, day, digest FROM m
            WHERE NOT EXISTS (
                SELECT FROM inbox_records r WHERE r.consumer = $1 AND r.key = m.key
            )
            AND NOT EXISTS (
                SELECT FROM inbox WHERE inbox.consumer = $1 AND inbox.message_id = m.message_id
            )
            ORDER BY key
            ON CONFLICT (consumer, key, day) DO NOTHING
            RETURNING key, day
        ),
        counted AS (
            INSERT INTO inbox_day_counts (consumer, day, slot, processed)
            SELECT $1, day, $4, count(*) FROM inserted GROUP BY day ORDER BY day
            ON CONFLICT (consumer, day, slot)
            DO UPDATE SET processed = inbox_day_counts.processed + EXCLUDED.processed
        )
        SELECT m.message_id AS "message_id!" FROM m JOIN inserted USING (key)
        "#,
        consumer,
        ids as &[&str],
        digests as &[&[u8]],
        slot,
    )
    .fetch_all(conn)
    .await
}

/// Counts a duplicate on the records of `ids` whose digest matches (or was not kept) and
/// returns those ids, counting them in `slot` (in `inbox_day_counts`, beyond the slots of
/// `insert_new`, so that two transactions recording batches that span the same days do not
/// take each other's count rows in opposite orders).
async fn count_copies(
    conn: &mut PgConnection,
    consumer: &str,
    ids: &[&str],
    digests: &[&[u8]],
    slot: i16,
) -> sqlx::Result<Vec<String>> {
    // A row from before digests were kept matches any copy. A message recorded in a table
    // before `inbox_entries` counts its copies there (and in `inbox_counts`), unless its key
    // was taken in a later table too (by the previous versions' instances while they ran
    // beside this one).
    sqlx::query_scalar!(
        r#"
        WITH m AS (
            SELECT message_id, digest, key, inbox_day(key) AS day
            FROM (
                SELECT message_id, digest, inbox_key(message_id) AS key
                FROM unnest($2::text[], $3::bytea[]) AS m(message_id, digest)
                -- Kept a subquery, so that inbox_day is inlined on a column (given the
                -- key's whole expression, PostgreSQL would call it as a function).
                OFFSET 0
            ) AS keyed
        ),
        entries AS (
            UPDATE inbox_entries e SET duplicates = e.duplicates + 1
            FROM m
            WHERE e.consumer = $1 AND e.key = m.key AND e.day = m.day
              AND (e.digest IS NULL OR e.digest = m.digest)
            RETURNING m.message_id, e.day
        ),
        keyed AS (
            UPDATE inbox_records r SET duplicates = r.duplicates + 1
            FROM m
            WHERE r.consumer = $1 AND r.key = m.key
              AND (r.digest IS NULL OR r.digest = m.digest)
              AND NOT EXISTS (
                  SELECT FROM inbox_entries e
                  WHERE e.consumer = $1 AND e.key = m.key AND e.day = m.day
              )
            RETURNING m.message_id
        ),
        named AS (
            UPDATE inbox SET duplicates = inbox.duplicates + 1
            FROM m
            WHERE inbox.consumer = $1 AND inbox.message_id = m.message_id
              AND (inbox.digest IS NULL OR inbox.digest = m.digest)
              AND NOT EXISTS (
                  SELECT FROM inbox_records r WHERE r.consumer = $1 AND r.key = m.key
              )
              AND NOT EXISTS (
                  SELECT FROM inbox_entries e
                  WHERE e.consumer = $1 AND e.key = m.key AND e.day = m.day
              )
            RETURNING m.message_id
        ),
        before AS (SELECT message_id FROM keyed UNION ALL SELECT message_id FROM named),
        counted AS (
            INSERT INTO inbox_day_counts (consumer, day, slot, duplicates)
            SELECT $1, day, $4::smallint + $5::smallint, count(*) FROM entries GROUP BY day ORDER BY day
            ON CONFLICT (consumer, day, slot)
            DO UPDATE SET duplicates = inbox_day_counts.duplicates + EXCLUDED.duplicates
        ),
        counted_before AS (
            INSERT INTO inbox_counts (consumer, slot, duplicates)
            SELECT $1, $4, count(*) FROM before HAVING count(*) > 0
            ON CONFLICT (consumer, slot)
            DO UPDATE SET duplicates = inbox_counts.duplicates + EXCLUDED.duplicates
        )
        SELECT message_id AS "message_id!" FROM entries
        UNION ALL
        SELECT message_id FROM before
        "#,
        consumer,
        ids as &[&str],
        digests as &[&[u8]],
        slot,
        super::COUNT_SLOTS.cast_signed(),
    )
    .fetch_all(conn)
    .await
}

/// Reads the consumer's counts and counts its open dead letters up to `limit`.
pub(crate) async fn stats(pool: &PgPool, consumer: &str, limit: i64) -> sqlx::Result<InboxStats> {
    sqlx::query_as!(
        InboxStats,
        r#"
        SELECT
            (COALESCE((SELECT sum(processed) FROM inbox_counts WHERE consumer = $1), 0)
             + COALESCE((SELECT sum(processed) FROM inbox_day_counts WHERE consumer = $1), 0)
            )::bigint AS "processed!",
            (COALESCE((SELECT sum(duplicates) FROM inbox_counts WHERE consumer = $1), 0)
             + COALESCE((SELECT sum(duplicates) FROM inbox_day_counts WHERE consumer = $1), 0)
            )::bigint AS "duplicate!",
            (SELECT count(*) FROM (
                SELECT FROM inbox_dead WHERE consumer = $1 AND closed_at IS NULL LIMIT $2
            ) d) AS "dead!",
            true AS "exact!"
        "#,
        consumer,
        limit,
    )
    .fetch_one(pool)
    .await
}

/// Empties at most one partition of `inbox_entries` whose records are all older than the
/// longest retention declared (declaring `retention` for `consumer`) and returns how many
/// records it held, or `None` when no partition was ready.
pub(crate) async fn age_out(
    pool: &PgPool,
    consumer: &str,
    retention: Duration,
) -> sqlx::Result<Option<u64>> {
    // At READ COMMITTED whatever the database's default: the function reads, under a
    // partition's lock, what committed before it.
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *tx)
        .await?;
    let records = sqlx::query_scalar!(
        r#"SELECT records AS "records!" FROM inbox_age_out($1, make_interval(secs => $2))"#,
        consumer,
        retention.as_secs_f64(),
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(records.map(i64::unsigned_abs))
}

/// Deletes up to `batch` records of `consumer` older than `retention` from each inbox table
/// (in `inbox_entries`, only those no partition's ageing-out will take: see the migration),
/// and takes them off the consumer's counts (a record is counted in the table where it was
/// first made; in `inbox_day_counts`, in a slot of the cleanup's own).
pub(crate) async fn delete_older(
    pool: &PgPool,
    consumer: &str,
    retention: Duration,
    batch: i64,
) -> sqlx::Result<u64> {
    let deleted = sqlx::query_scalar!(
        r#"
        WITH entries AS (
            DELETE FROM inbox_entries
            WHERE (consumer, key, day) IN (
                (SELECT consumer, key, day FROM inbox_entries
                 WHERE consumer = $1 AND day = -1
                   AND received_at < now() - make_interval(secs => $2)
                 LIMIT $3)
                UNION ALL
                (SELECT consumer, key, day FROM inbox_entries
                 WHERE consumer = $1 AND day >= 0 AND key < inbox_stale_below()
                   AND received_at < now() - make_interval(secs => $2)
                 LIMIT $3)
            )
            RETURNING day, duplicates, NOT from_previous AS was_counted
        ),
        keyed AS (
            DELETE FROM inbox_records
            WHERE (consumer, key) IN (
                SELECT consumer, key FROM inbox_records
                WHERE consumer = $1 AND received_at < now() - make_interval(secs => $2)
                LIMIT $3
            )
            RETURNING duplicates, NOT from_inbox AS was_counted
        ),
        named AS (
            DELETE FROM inbox
            WHERE (consumer, message_id) IN (
                SELECT consumer, message_id FROM inbox
                WHERE consumer = $1 AND received_at < now() - make_interval(secs => $2)
                LIMIT $3
            )
            RETURNING duplicates, true AS was_counted
        ),
        before AS (SELECT * FROM keyed UNION ALL SELECT * FROM named),
        counted AS (
            INSERT INTO inbox_day_counts (consumer, day, slot, processed, duplicates)
            SELECT $1, day, -1, -count(*) FILTER (WHERE was_counted), -sum(duplicates)
            FROM entries GROUP BY day ORDER BY day
            ON CONFLICT (consumer, day, slot) DO UPDATE
            SET processed = inbox_day_counts.processed + EXCLUDED.processed,
                duplicates = inbox_day_counts.duplicates + EXCLUDED.duplicates
        ),
        counted_before AS (
            INSERT INTO inbox_counts (consumer, slot, processed, duplicates)
            SELECT $1, 0, -count(*) FILTER (WHERE was_counted), -COALESCE(sum(duplicates), 0)
            FROM before HAVING count(*) > 0
            ON CONFLICT (consumer, slot) DO UPDATE
            SET processed = inbox_counts.processed + EXCLUDED.processed,
                duplicates = inbox_counts.duplicates + EXCLUDED.duplicates
        )
        SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM before) AS "deleted!"
        "#,
        consumer,
        retention.as_secs_f64(),
        batch,
    )
    .fetch_one(pool)
    .await?;
    Ok(deleted.unsigned_abs())
}
