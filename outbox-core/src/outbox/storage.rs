//! The SQL of the outbox's producer and operator side: enqueue, stats, dead events, cleanup.
//! The relay's statements are in `relay::storage`.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection, PgExecutor, PgPool};
use uuid::Uuid;

use super::{DeadEvent, DeadFilter};
use crate::NewEvent;
use crate::groups::DeadGroup;

/// Inserts one event through `outbox_enqueue`, which takes the per-aggregate advisory lock
/// held until commit.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    id: Uuid,
    event: &NewEvent,
) -> sqlx::Result<()> {
    sqlx::query_scalar!(
        r#"SELECT outbox_enqueue($1, $2, $3, $4, $5, $6) AS "id!""#,
        id,
        event.aggregate_type,
        event.aggregate_id,
        event.event_type,
        event.payload,
        event.traceparent,
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// Pending, dead and parked events, each counted up to a limit, and the oldest pending age.
pub(crate) struct Counts {
    pub pending: i64,
    pub dead: i64,
    pub parked: i64,
    pub oldest_pending_seconds: f64,
}

/// Counts pending, dead and parked events, each up to `limit`, and reads the age of the oldest
/// pending one: every part through an index, so the cost does not grow with the table.
pub(crate) async fn counts(pool: &PgPool, limit: i64) -> sqlx::Result<Counts> {
    sqlx::query_as!(
        Counts,
        r#"
        SELECT
            (SELECT count(*) FROM (SELECT FROM outbox WHERE status = 'pending' LIMIT $1) p)
                AS "pending!",
            (SELECT count(*) FROM (SELECT FROM outbox WHERE status = 'dead' LIMIT $1) d)
                AS "dead!",
            (SELECT count(*) FROM (
                SELECT DISTINCT aggregate_type, aggregate_id FROM outbox WHERE status = 'dead'
                LIMIT $1
            ) a) AS "parked!",
            -- The claim's index, in seq order: the first pending row is the oldest.
            COALESCE(EXTRACT(EPOCH FROM now() - (
                SELECT created_at FROM outbox WHERE status = 'pending' ORDER BY seq LIMIT 1
            )), 0)::float8 AS "oldest_pending_seconds!"
        "#,
        limit,
    )
    .fetch_one(pool)
    .await
}

/// The span of sequence numbers pending events occupy from `from` (from the oldest when
/// `None`), and how many of `probes` sequence numbers drawn in it are pending events, one at
/// random in each of `probes` equal parts of the span, with the lowest that was: each probe is
/// one look-up in the claim's index, so the cost does not grow with the backlog.
pub(crate) struct Probe {
    pub first: i64,
    pub span: i64,
    pub hits: i64,
    pub lowest_hit: Option<i64>,
}

pub(crate) async fn probe_pending(
    pool: &PgPool,
    probes: i64,
    from: Option<i64>,
) -> sqlx::Result<Probe> {
    sqlx::query_as!(
        Probe,
        r#"
        WITH ends AS (
            SELECT
                COALESCE($2::bigint, (
                    SELECT seq FROM outbox WHERE status = 'pending' ORDER BY seq LIMIT 1
                )) AS first,
                (SELECT seq FROM outbox WHERE status = 'pending' ORDER BY seq DESC LIMIT 1)
                    AS last
        ),
        draws AS (
            -- One draw per part: a dense run and a sparse one are each sampled in proportion.
            SELECT first + floor((part - 1 + random()) * (last - first + 1) / $1::bigint)::bigint
                AS seq
            FROM ends, generate_series(1, $1::bigint) AS part
        ),
        hits AS (
            -- LIMIT keeps each probe a look-up of its own, never a join over the table.
            SELECT draws.seq FROM draws CROSS JOIN LATERAL (
                SELECT FROM outbox o WHERE o.seq = draws.seq AND o.status = 'pending' LIMIT 1
            ) hit
        )
        SELECT
            COALESCE((SELECT first FROM ends), 0) AS "first!",
            COALESCE((SELECT last - first + 1 FROM ends), 0) AS "span!",
            (SELECT count(*) FROM hits) AS "hits!",
            (SELECT min(seq) FROM hits) AS "lowest_hit?"
        "#,
        probes,
        from,
    )
    .fetch_one(pool)
    .await
}

/// Counts pending events before sequence number `before`, up to `limit`.
pub(crate) async fn count_pending_before(
    pool: &PgPool,
    before: i64,
    limit: i64,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"
        SELECT count(*) AS "count!" FROM (
            SELECT FROM outbox WHERE status = 'pending' AND seq < $1 LIMIT $2
        ) p
        "#,
        before,
        limit,
    )
    .fetch_one(pool)
    .await
}

/// Lists dead events matching `filter` after `after_seq` in outbox order.
pub(crate) async fn dead(
    pool: &PgPool,
    filter: &DeadFilter,
    after_seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<DeadEvent>> {
    sqlx::query_as!(
        DeadEvent,
        r#"
        SELECT d.seq, d.id, d.aggregate_type, d.aggregate_id, d.event_type, d.attempts,
            d.last_error, d.error_class, d.created_at, NULL::jsonb AS payload, d.traceparent,
            (SELECT count(*) FROM (
                SELECT FROM outbox w
                WHERE w.aggregate_type = d.aggregate_type AND w.aggregate_id = d.aggregate_id
                  AND w.status = 'pending' AND w.seq > d.seq
                LIMIT $6
            ) behind) AS "waiting_behind!"
        FROM outbox d
        WHERE d.status = 'dead' AND d.seq > $1
          AND ($3::text IS NULL OR d.aggregate_type = $3)
          AND ($4::text IS NULL OR d.event_type = $4)
          AND ($5::text IS NULL OR strpos(d.last_error, $5) > 0)
          AND ($7::text IS NULL OR d.aggregate_id = $7)
          AND ($8::timestamptz IS NULL OR d.created_at >= $8)
          AND ($9::timestamptz IS NULL OR d.created_at < $9)
          AND ($10::text IS NULL OR d.error_class = $10)
        ORDER BY d.seq
        LIMIT $2
        "#,
        after_seq,
        limit,
        filter.aggregate_type,
        filter.event_type,
        filter.error_contains,
        super::WAITING_BEHIND_LIMIT,
        filter.aggregate_id,
        filter.since,
        filter.until,
        filter.error_class,
    )
    .fetch_all(pool)
    .await
}

/// Dead event `id` with its payload.
pub(crate) async fn dead_event(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<DeadEvent>> {
    sqlx::query_as!(
        DeadEvent,
        r#"
        SELECT d.seq, d.id, d.aggregate_type, d.aggregate_id, d.event_type, d.attempts,
            d.last_error, d.error_class, d.created_at, d.payload AS "payload?", d.traceparent,
            (SELECT count(*) FROM (
                SELECT FROM outbox w
                WHERE w.aggregate_type = d.aggregate_type AND w.aggregate_id = d.aggregate_id
                  AND w.status = 'pending' AND w.seq > d.seq
                LIMIT $2
            ) behind) AS "waiting_behind!"
        FROM outbox d
        WHERE d.id = $1 AND d.status = 'dead'
        "#,
        id,
        super::WAITING_BEHIND_LIMIT,
    )
    .fetch_optional(pool)
    .await
}

/// Dead events grouped by event type and error class (by error text where there is no class),
/// of the first `read` dead events.
pub(crate) async fn dead_groups(
    pool: &PgPool,
    read: i64,
    limit: i64,
) -> sqlx::Result<Vec<DeadGroup>> {
    sqlx::query_as!(
        DeadGroup,
        r#"
        SELECT event_type AS "event_type?", error_class,
            COALESCE(max(last_error), '') AS "error!",
            count(*) AS "count!", min(created_at) AS "oldest!", max(created_at) AS "newest!"
        FROM (SELECT event_type, error_class, last_error, created_at FROM outbox
              WHERE status = 'dead' LIMIT $1) d
        GROUP BY event_type, error_class, CASE WHEN error_class IS NULL THEN last_error END
        ORDER BY count(*) DESC, min(created_at)
        LIMIT $2
        "#,
        read,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// Moves the dead events matching `id` (when given) and `filter` to `status`: `pending` with
/// fresh attempts (retried) or `skipped` (given up, releasing their aggregates); wakes the
/// relays and returns how many there were.
pub(crate) async fn resolve_dead(
    conn: &mut PgConnection,
    id: Option<Uuid>,
    filter: &DeadFilter,
    status: Resolution,
) -> sqlx::Result<u64> {
    let resolved = sqlx::query!(
        r#"
        UPDATE outbox
        SET status = $5,
            attempts = CASE WHEN $5 = 'pending' THEN 0 ELSE attempts END,
            next_attempt_at = CASE WHEN $5 = 'pending' THEN now() ELSE next_attempt_at END
        WHERE status = 'dead'
          AND ($1::uuid IS NULL OR id = $1)
          AND ($2::text IS NULL OR aggregate_type = $2)
          AND ($3::text IS NULL OR event_type = $3)
          AND ($4::text IS NULL OR strpos(last_error, $4) > 0)
          AND ($6::text IS NULL OR aggregate_id = $6)
          AND ($7::timestamptz IS NULL OR created_at >= $7)
          AND ($8::timestamptz IS NULL OR created_at < $8)
          AND ($9::text IS NULL OR error_class = $9)
        "#,
        id,
        filter.aggregate_type,
        filter.event_type,
        filter.error_contains,
        status.as_str(),
        filter.aggregate_id,
        filter.since,
        filter.until,
        filter.error_class,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    // The change is made: a relay that is not woken finds it at its next poll. In a savepoint,
    // so that a wake refused at once leaves the caller's transaction usable; in a transaction
    // the notification is sent when it commits.
    if resolved > 0
        && let Err(error) = wake_in_savepoint(conn).await
    {
        tracing::warn!(error = ?error, "cannot wake the relays; they find the events at their poll");
    }
    Ok(resolved)
}

/// What an operator does with a dead event.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resolution {
    /// Publish it again.
    Retry,
    /// Give up on it.
    Skip,
}

impl Resolution {
    fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "pending",
            Self::Skip => "skipped",
        }
    }
}

/// Notifies [`super::CHANNEL`]: outside a transaction relays claim at once, inside one when
/// it commits.
pub(crate) async fn wake(executor: impl PgExecutor<'_>) -> sqlx::Result<()> {
    sqlx::query_scalar!("SELECT pg_notify('outbox', '')::text")
        .fetch_one(executor)
        .await?;
    Ok(())
}

/// [`wake`] in a savepoint of `conn`'s transaction (in a transaction of its own outside one).
async fn wake_in_savepoint(conn: &mut PgConnection) -> sqlx::Result<()> {
    let mut savepoint = conn.begin().await?;
    wake(&mut *savepoint).await?;
    savepoint.commit().await
}

/// Empties the partitions of `outbox_published` whose latest two hours ended `retention` ago
/// or more; returns about how many events they held.
pub(crate) async fn age_out_published(pool: &PgPool, retention: Duration) -> sqlx::Result<u64> {
    let events = sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(events), 0)::bigint AS "events!"
           FROM outbox_age_out(make_interval(secs => $1))"#,
        retention.as_secs_f64(),
    )
    .fetch_one(pool)
    .await?;
    Ok(events.unsigned_abs())
}

/// Deletes up to `batch` published or skipped rows created more than `retention` ago.
pub(crate) async fn delete_finished(
    pool: &PgPool,
    retention: Duration,
    batch: i64,
) -> sqlx::Result<u64> {
    let result = sqlx::query!(
        r#"
        DELETE FROM outbox
        WHERE seq IN (
            SELECT seq FROM outbox
            WHERE status IN ('published', 'skipped')
              AND created_at < now() - make_interval(secs => $1)
            LIMIT $2
        )
        "#,
        retention.as_secs_f64(),
        batch,
    )
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}
