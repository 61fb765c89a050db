//! Every SQL statement of the repair: the lock, the recorded positions, and moving lost events
//! back into the outbox.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Transaction};

/// A position of the stream found holding what the relay published there.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub(super) created: DateTime<Utc>,
    pub(super) seq: u64,
    pub(super) message_id: Option<String>,
    pub(super) checked_at: DateTime<Utc>,
}

/// How long recorded positions are kept: the longest retention of published events.
const CHECKS_KEPT: Duration = crate::outbox::MAX_RETENTION;

/// Waits for the session lock of `stream`'s full check: one at a time, across relays.
pub(super) async fn lock(conn: &mut PgConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT pg_advisory_lock(hashtextextended('outbox_repair/' || $1, 0))::text AS "x""#,
        stream,
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// Lets the lock of [`lock`] go.
pub(super) async fn unlock(conn: &mut PgConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT pg_advisory_unlock(hashtextextended('outbox_repair/' || $1, 0)) AS "x!""#,
        stream,
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// The database's clock: the events' `published_at` are by it.
pub(super) async fn now(conn: &mut PgConnection) -> sqlx::Result<DateTime<Utc>> {
    sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "now!""#)
        .fetch_one(conn)
        .await
}

/// The positions recorded for `stream`, the newest first.
pub(super) async fn checks(conn: &mut PgConnection, stream: &str) -> sqlx::Result<Vec<Check>> {
    let rows = sqlx::query!(
        r#"SELECT created, seq, message_id, checked_at FROM outbox_stream_checks
           WHERE stream = $1 ORDER BY created DESC, seq DESC"#,
        stream,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Check {
            created: row.created,
            seq: row.seq.unsigned_abs(),
            message_id: row.message_id,
            checked_at: row.checked_at,
        })
        .collect())
}

/// Records that `stream` (made at `created`) held `message_id` at `seq`.
pub(super) async fn record_check(
    conn: &mut PgConnection,
    stream: &str,
    created: DateTime<Utc>,
    seq: u64,
    message_id: Option<String>,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"INSERT INTO outbox_stream_checks (stream, created, seq, message_id)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (stream, created, seq)
           DO UPDATE SET message_id = EXCLUDED.message_id, checked_at = now()"#,
        stream,
        created,
        seq_bound(seq),
        message_id,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Forgets the positions of `stream` older than any published event can be.
pub(super) async fn forget_old_checks(conn: &mut PgConnection, stream: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"DELETE FROM outbox_stream_checks
           WHERE stream = $1 AND checked_at < now() - make_interval(secs => $2)"#,
        stream,
        CHECKS_KEPT.as_secs_f64(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Begins the transaction of a scan, with the temporary tables of the ids it read and of those
/// [`note_above`] notes (dropped at its end).
pub(super) async fn begin_scan(conn: &mut PgConnection) -> sqlx::Result<Transaction<'_, Postgres>> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    // Not checked at compile time: the tables exist only in this transaction.
    for table in [
        "CREATE TEMPORARY TABLE outbox_repair_seen (id uuid PRIMARY KEY) ON COMMIT DROP",
        "CREATE TEMPORARY TABLE outbox_repair_above (id uuid PRIMARY KEY) ON COMMIT DROP",
    ] {
        sqlx::query(table).execute(&mut *tx).await?;
    }
    Ok(tx)
}

/// Adds ids read from the stream to the scan's table.
pub(super) async fn seen(conn: &mut PgConnection, ids: &[uuid::Uuid]) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO outbox_repair_seen SELECT DISTINCT unnest($1::uuid[]) ON CONFLICT DO NOTHING",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// The published events a check takes for lost unless its scan saw them: published between
/// `since` (when given) and `before`, acknowledged above `from_seq` and at most at `through`
/// (or without a sequence), or noted by [`note_above`]; and not older than the stream's
/// `max_age`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lost {
    pub(super) from_seq: u64,
    pub(super) through: u64,
    pub(super) since: Option<DateTime<Utc>>,
    pub(super) before: DateTime<Utc>,
    pub(super) max_age: Option<Duration>,
}

/// A stream sequence as the database keeps it.
fn seq_bound(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// Notes, in the scan's table `outbox_repair_above`, the events `lost` would name but for
/// being acknowledged above its `through`, which the scan read to: such an event may have
/// been stored after the stream's state was read. Whether there was any.
pub(super) async fn note_above(conn: &mut PgConnection, lost: &Lost) -> sqlx::Result<bool> {
    // Not checked at compile time: it writes the scan's temporary table.
    let noted: i64 = sqlx::query_scalar(
        "WITH above AS (
             INSERT INTO outbox_repair_above
             SELECT id FROM outbox_published
             WHERE published_at < $1
               AND ($2::timestamptz IS NULL OR published_at >= $2)
               AND ($3::float8 IS NULL OR published_at >= $1 - make_interval(secs => $3))
               AND stream_seq > $4
             ON CONFLICT DO NOTHING
             RETURNING id
         )
         SELECT count(*) FROM above",
    )
    .bind(lost.before)
    .bind(lost.since)
    .bind(lost.max_age.map(|age| age.as_secs_f64()))
    .bind(seq_bound(lost.through))
    .fetch_one(conn)
    .await?;
    Ok(noted > 0)
}

/// Moves back into the outbox, pending, with their seq, id and first publishing time, the
/// events `lost` names that the scan did not see. Returns their seqs, in order.
pub(super) async fn move_back_lost(conn: &mut PgConnection, lost: &Lost) -> sqlx::Result<Vec<i64>> {
    // Not checked at compile time: it reads the scan's temporary tables.
    sqlx::query_scalar(
        "WITH lost AS (
             DELETE FROM outbox_published p
             WHERE p.published_at < $1
               AND ($2::timestamptz IS NULL OR p.published_at >= $2)
               AND ($3::float8 IS NULL OR p.published_at >= $1 - make_interval(secs => $3))
               AND (p.stream_seq IS NULL OR (p.stream_seq > $4 AND p.stream_seq <= $5)
                    OR EXISTS (SELECT FROM outbox_repair_above a WHERE a.id = p.id))
               AND NOT EXISTS (SELECT FROM outbox_repair_seen s WHERE s.id = p.id)
             RETURNING p.seq, p.id, p.aggregate_type, p.aggregate_id, p.event_type, p.payload,
                       p.traceparent, p.created_at, p.published_at
         )
         INSERT INTO outbox (seq, id, aggregate_type, aggregate_id, event_type, payload,
                             traceparent, created_at, published_at)
         OVERRIDING SYSTEM VALUE
         SELECT seq, id, aggregate_type, aggregate_id, event_type, payload,
                -- A traceparent an earlier version let through would now be refused.
                CASE WHEN traceparent ~ '^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$'
                     THEN traceparent END,
                created_at, published_at
         FROM lost
         ORDER BY seq
         RETURNING seq",
    )
    .bind(lost.before)
    .bind(lost.since)
    .bind(lost.max_age.map(|age| age.as_secs_f64()))
    .bind(seq_bound(lost.from_seq))
    .bind(seq_bound(lost.through))
    .fetch_all(conn)
    .await
}
