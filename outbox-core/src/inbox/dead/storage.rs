//! Every SQL statement on the dead letters.

use std::borrow::Cow;

use sqlx::{PgConnection, PgExecutor, PgPool};

use super::{DeadLetter, DeadLetterFilter, NewDeadLetter};

/// Inserts a dead letter and returns its id and whether it is new. A redelivery (more than one
/// delivery) of a message the consumer holds an open letter of, the same in every field kept,
/// is that letter: its acknowledgement was lost. With `once`, nothing (and `None`) when the
/// consumer has a letter with the same message id. Text PostgreSQL cannot store (a NUL byte) is
/// shown as `\u{2400}`; a subject holding one is also kept byte for byte in `subject_bytes`.
pub(crate) async fn insert_dead(
    pool: &PgPool,
    consumer: &str,
    letter: &NewDeadLetter<'_>,
    once: bool,
) -> sqlx::Result<Option<(i64, bool)>> {
    let subject = storable(letter.subject);
    let subject_bytes = matches!(subject, Cow::Owned(_)).then_some(letter.subject.as_bytes());
    let message_id = letter.message_id.map(storable);
    let error = storable(letter.error);
    let error_class = letter.error_class.map(storable);
    let row = sqlx::query!(
        r#"
        WITH open_copy AS (
            SELECT id FROM inbox_dead
            WHERE $8::bigint > 1 AND consumer = $1 AND closed_at IS NULL
              AND message_id IS NOT DISTINCT FROM $2 AND subject = $3 AND headers = $5
              AND payload = $6
            ORDER BY id
            LIMIT 1
        ), kept AS (
            INSERT INTO inbox_dead
                (consumer, message_id, subject, subject_bytes, headers, payload, error, deliveries,
                 error_class)
            SELECT $1, $2, $3, $4, $5, $6, $7, $8, $10
            WHERE NOT EXISTS (SELECT FROM open_copy)
              AND (NOT $9 OR NOT EXISTS (
                  SELECT FROM inbox_dead WHERE consumer = $1 AND message_id = $2
              ))
            RETURNING id
        )
        SELECT id AS "id!", true AS "new!" FROM kept
        UNION ALL
        SELECT id, false FROM open_copy
        "#,
        consumer,
        message_id.as_deref(),
        &*subject,
        subject_bytes,
        letter.headers,
        letter.payload,
        &*error,
        letter.deliveries,
        once,
        error_class.as_deref(),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| (row.id, row.new)))
}

/// `text` with every NUL byte, which a PostgreSQL text value cannot hold, shown as `␀`.
fn storable(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{2400}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Open dead letters of `consumer` grouped by `ce-type` and error class (by error text where
/// there is no class), of the first `read`.
pub(crate) async fn dead_groups(
    pool: &PgPool,
    consumer: &str,
    read: i64,
    limit: i64,
) -> sqlx::Result<Vec<crate::groups::DeadGroup>> {
    sqlx::query_as!(
        crate::groups::DeadGroup,
        r#"
        SELECT event_type AS "event_type?", error_class, max(error) AS "error!",
            count(*) AS "count!", min(created_at) AS "oldest!", max(created_at) AS "newest!"
        FROM (SELECT headers->($3::text)->>0 AS event_type, error_class, error, created_at
              FROM inbox_dead
              WHERE consumer = $1 AND closed_at IS NULL LIMIT $2) d
        GROUP BY event_type, error_class, CASE WHEN error_class IS NULL THEN error END
        ORDER BY count(*) DESC, min(created_at)
        LIMIT $4
        "#,
        consumer,
        read,
        crate::headers::TYPE,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// Lists open dead letters matching `filter` after `after_id`.
pub(crate) async fn dead(
    pool: &PgPool,
    consumer: &str,
    filter: &DeadLetterFilter,
    after_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<DeadLetter>> {
    sqlx::query_as!(
        DeadLetter,
        r#"
        SELECT id, message_id, subject, headers, payload, error, error_class, deliveries,
            created_at
        FROM inbox_dead
        WHERE consumer = $1 AND closed_at IS NULL AND id > $2
          AND ($4::text IS NULL OR headers->($6::text)->>0 = $4)
          AND ($5::text IS NULL OR strpos(error, $5) > 0)
          AND ($7::timestamptz IS NULL OR created_at >= $7)
          AND ($8::timestamptz IS NULL OR created_at < $8)
          AND ($9::text IS NULL OR error_class = $9)
        ORDER BY id
        LIMIT $3
        "#,
        consumer,
        after_id,
        limit,
        filter.event_type,
        filter.error_contains,
        crate::headers::TYPE,
        filter.since,
        filter.until,
        filter.error_class,
    )
    .fetch_all(pool)
    .await
}

/// Reads open dead letter `id`.
pub(crate) async fn find_dead(
    pool: &PgPool,
    consumer: &str,
    id: i64,
) -> sqlx::Result<Option<DeadLetter>> {
    sqlx::query_as!(
        DeadLetter,
        r#"
        SELECT id, message_id, subject, headers, payload, error, error_class, deliveries,
            created_at
        FROM inbox_dead
        WHERE consumer = $1 AND id = $2 AND closed_at IS NULL
        "#,
        consumer,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// Reads open dead letter `id` and locks it until `tx` ends.
pub(crate) async fn lock_dead(
    tx: &mut PgConnection,
    consumer: &str,
    id: i64,
) -> sqlx::Result<Option<DeadLetter>> {
    sqlx::query_as!(
        DeadLetter,
        r#"
        SELECT id, message_id, subject, headers, payload, error, error_class, deliveries,
            created_at
        FROM inbox_dead
        WHERE consumer = $1 AND id = $2 AND closed_at IS NULL
        FOR UPDATE
        "#,
        consumer,
        id,
    )
    .fetch_optional(tx)
    .await
}

/// Closes dead letter `id`, locked by `tx` ([`lock_dead`]), as applied.
pub(crate) async fn close_held_dead(
    tx: &mut PgConnection,
    consumer: &str,
    id: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE inbox_dead SET closed_at = now(), resolution = 'applied' \
         WHERE consumer = $1 AND id = $2",
        consumer,
        id,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Closes the open dead letters matching `id` (when given) and `filter` with `resolution`
/// (`applied` or `skipped`), and returns how many there were.
pub(crate) async fn close_dead(
    executor: impl PgExecutor<'_>,
    consumer: &str,
    id: Option<i64>,
    filter: &DeadLetterFilter,
    resolution: &str,
) -> sqlx::Result<u64> {
    let result = sqlx::query!(
        r#"
        UPDATE inbox_dead SET closed_at = now(), resolution = $3
        WHERE consumer = $1 AND closed_at IS NULL
          AND ($2::bigint IS NULL OR id = $2)
          AND ($4::text IS NULL OR headers->($6::text)->>0 = $4)
          AND ($5::text IS NULL OR strpos(error, $5) > 0)
          AND ($7::timestamptz IS NULL OR created_at >= $7)
          AND ($8::timestamptz IS NULL OR created_at < $8)
          AND ($9::text IS NULL OR error_class = $9)
        "#,
        consumer,
        id,
        resolution,
        filter.event_type,
        filter.error_contains,
        crate::headers::TYPE,
        filter.since,
        filter.until,
        filter.error_class,
    )
    .execute(executor)
    .await?;
    Ok(result.rows_affected())
}
