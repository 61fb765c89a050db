//! The producer side: [`enqueue`] in the caller's transaction, stats, dead events and cleanup.

mod estimate;
pub(crate) mod storage;

use storage::Resolution;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::NewEvent;
use crate::groups::DeadGroup;

/// The PostgreSQL channel relays listen on, notified after commits by
/// [`crate::Wakeup::across_processes`] and by the operator's retries and skips.
pub const CHANNEL: &str = "outbox";

/// Writes `event` to the outbox inside the caller's transaction and returns its id.
///
/// The row becomes visible to the relay only when the caller commits; if the transaction rolls
/// back, the event never existed. Commit with [`crate::commit`] (or call
/// [`crate::Wakeup::committed`] after the commit) so that a relay publishes it at once; else
/// the relay's poll finds it. Transactions that enqueue events of the same aggregate are
/// serialised (a transaction-scoped advisory lock per aggregate), so per aggregate the outbox
/// order is the commit order.
///
/// It calls the SQL function `outbox_enqueue(event_id, aggregate_type, aggregate_id,
/// event_type, payload, traceparent)` that the outbox migrations install. A caller whose write
/// is one statement can call that function in the same statement instead (with
/// [`crate::event_id`] and the [`NewEvent`]'s accessors as arguments): a single statement is
/// its own transaction, so the row and its event commit in one round trip instead of four.
pub async fn enqueue(tx: &mut Transaction<'_, Postgres>, event: &NewEvent) -> sqlx::Result<Uuid> {
    let id = crate::event_id();
    storage::insert(tx, id, event).await?;
    Ok(id)
}

/// The most rows one count of [`stats`] reads: a dead or parked count that reaches it means
/// "at least this many", and a pending count past it is estimated. It keeps the stats as cheap
/// with millions of pending events as with ten, which is when operators watch them.
pub const COUNT_LIMIT: i64 = 10_000;

/// A snapshot of the outbox for dashboards and alerts, read in constant time.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct OutboxStats {
    /// Events not yet published (including those waiting behind a dead event): exact below
    /// 10,000, estimated beyond (see `pendingMargin`).
    pub pending: i64,
    /// How far the truth may be from `pending` (a 99.9% interval's half-width): 0 when it is
    /// exact.
    pub pending_margin: i64,
    /// Events that exhausted their attempts and wait for an operator, up to 10,000.
    pub dead: i64,
    /// Aggregates whose later events are held back by a dead event, up to 10,000.
    pub parked: i64,
    /// Age of the oldest pending event (always exact), 0 when nothing is pending.
    pub oldest_pending_seconds: f64,
    /// False when a count reached 10,000: `pending` is then an estimate, and `dead` or
    /// `parked` at 10,000 means "at least 10,000".
    pub exact: bool,
}

/// Reads the current [`OutboxStats`].
pub async fn stats(pool: &PgPool) -> sqlx::Result<OutboxStats> {
    let counts = storage::counts(pool, COUNT_LIMIT).await?;
    let (mut pending, mut pending_margin) = (counts.pending, 0);
    if counts.pending >= COUNT_LIMIT {
        let found = estimate_pending(pool).await?;
        (pending, pending_margin) = (found.count, found.margin);
    }
    Ok(OutboxStats {
        pending,
        pending_margin,
        dead: counts.dead,
        parked: counts.parked,
        oldest_pending_seconds: counts.oldest_pending_seconds,
        exact: [counts.pending, counts.dead, counts.parked]
            .iter()
            .all(|count| *count < COUNT_LIMIT),
    })
}

/// Estimates a backlog of at least [`COUNT_LIMIT`] pending events. When few probes of the whole
/// span found one (a few old events, held back or parked, stretch it far beyond the backlog),
/// the events before the lowest part that had one (or the two newest parts, when none had)
/// are counted, and the rest probed again.
async fn estimate_pending(pool: &PgPool) -> sqlx::Result<estimate::Estimate> {
    let whole = storage::probe_pending(pool, estimate::PROBES, None).await?;
    let found = estimate::estimate(whole.span, estimate::PROBES, whole.hits, COUNT_LIMIT);
    if whole.hits >= estimate::PRECISE_HITS {
        return Ok(found);
    }
    // A part the backlog covers always has a hit; with none, it lies across the newest parts.
    let part = (whole.span + estimate::PROBES - 1) / estimate::PROBES;
    let last = whole.first + whole.span - 1;
    let from = whole
        .lowest_hit
        .map_or(last - 2 * part + 1, |lowest| lowest - part)
        .max(whole.first);
    let head = storage::count_pending_before(pool, from, COUNT_LIMIT).await?;
    if head >= COUNT_LIMIT {
        return Ok(found);
    }
    let tail = storage::probe_pending(pool, estimate::PROBES, Some(from)).await?;
    let rest = estimate::estimate(tail.span, estimate::PROBES, tail.hits, COUNT_LIMIT - head);
    Ok(estimate::Estimate {
        count: head + rest.count,
        margin: rest.margin,
    })
}

/// An event that exhausted its attempts.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeadEvent {
    /// Position in the outbox, used to page.
    pub seq: i64,
    /// The CloudEvents id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Publish attempts made.
    pub attempts: i32,
    /// The last publish error.
    pub last_error: Option<String>,
    /// The kind of that error, a stable name to filter and group by ([`error_classes`]); `None`
    /// for an event that failed before the outbox stored kinds.
    pub error_class: Option<String>,
    /// When the event was enqueued.
    pub created_at: DateTime<Utc>,
    /// Its body: read by [`dead_event`], left out of [`dead`]'s listings (a dead event is often
    /// one too large to publish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// The W3C traceparent it carries, if any.
    pub traceparent: Option<String>,
    /// Later events of its aggregate held back behind it, counted up to [`WAITING_BEHIND_LIMIT`]:
    /// what a retry releases after it, and a skip releases without it.
    pub waiting_behind: i64,
}

/// The kinds of failure the relay stores with an event's last error (`error_class`).
pub mod error_classes {
    /// The row can never become a message (a name that is not a subject token): dead at once.
    pub const UNPUBLISHABLE: &str = "unpublishable";
    /// The broker refused the message for its size: over the server's max payload or the
    /// stream's maximum message size.
    pub const TOO_LARGE: &str = "too-large";
    /// The broker refused the message otherwise ([`crate::PublishError::NotAccepted`]): the
    /// stream rejected it.
    pub const NOT_ACCEPTED: &str = "not-accepted";
    /// No acknowledgement came ([`crate::PublishError::NoAck`]).
    pub const NO_ACK: &str = "no-ack";
    /// The broker could not be reached ([`crate::PublishError::Unreachable`]).
    pub const UNREACHABLE: &str = "unreachable";
    /// No stream answered for the subject ([`crate::PublishError::StreamNotFound`]).
    pub const STREAM_NOT_FOUND: &str = "stream-not-found";
    /// The stream or its account had no room ([`crate::PublishError::StorageFull`]).
    pub const STORAGE_FULL: &str = "storage-full";
}

/// The most events [`DeadEvent::waiting_behind`] counts, so that a listing stays cheap when an
/// aggregate has many events held back.
pub const WAITING_BEHIND_LIMIT: i64 = 100;

/// Which dead events a listing or a bulk action takes: those matching every filter set, all of
/// them when none is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadFilter {
    /// Only events of this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only events of this event type.
    pub event_type: Option<String>,
    /// Only events whose last error contains this text.
    pub error_contains: Option<String>,
    /// Only events whose last error is of this kind ([`error_classes`]).
    pub error_class: Option<String>,
    /// Only events of this aggregate (of any type, unless `aggregate_type` is set too).
    pub aggregate_id: Option<String>,
    /// Only events enqueued at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only events enqueued before this time.
    pub until: Option<DateTime<Utc>>,
}

impl DeadFilter {
    /// Every dead event.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only events of `aggregate_type`.
    #[must_use]
    pub fn aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only events of `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only events whose last error contains `text`.
    #[must_use]
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only events whose last error is of kind `class` ([`error_classes`]).
    #[must_use]
    pub fn error_class(mut self, class: impl Into<String>) -> Self {
        self.error_class = Some(class.into());
        self
    }

    /// Only events of aggregate `aggregate_id`.
    #[must_use]
    pub fn aggregate_id(mut self, aggregate_id: impl Into<String>) -> Self {
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Only events enqueued in `[since, until)`; either end may be open.
    #[must_use]
    pub fn enqueued(mut self, since: Option<DateTime<Utc>>, until: Option<DateTime<Utc>>) -> Self {
        (self.since, self.until) = (since, until);
        self
    }
}

/// Lists dead events matching `filter` in outbox order, after `after_seq`, at most `limit`.
pub async fn dead(
    pool: &PgPool,
    filter: &DeadFilter,
    after_seq: i64,
    limit: i64,
) -> sqlx::Result<Vec<DeadEvent>> {
    storage::dead(pool, filter, after_seq, limit).await
}

/// Dead events grouped by event type and the kind of their error (by the error's text for those
/// without one), the largest groups first, at most `limit`
/// groups of the first [`crate::groups::GROUPS_READ_LIMIT`] dead events.
pub async fn dead_groups(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<DeadGroup>> {
    storage::dead_groups(pool, crate::groups::GROUPS_READ_LIMIT, limit).await
}

/// Reads dead event `id` whole, its payload included; `None` when it is not a dead event.
pub async fn dead_event(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<DeadEvent>> {
    storage::dead_event(pool, id).await
}

/// Makes a dead event pending again (attempts reset): it is published, then the events it
/// held back follow. Returns false when `id` is not a dead event.
pub async fn retry_dead(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    retry_dead_in(&mut *pool.acquire().await?, id).await
}

/// [`retry_dead`] on `conn`, the caller's transaction (`&mut *tx`) for example: the change
/// commits with whatever else it writes (an audit row), and the relays are woken then.
pub async fn retry_dead_in(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let all = DeadFilter::all();
    Ok(storage::resolve_dead(conn, Some(id), &all, Resolution::Retry).await? == 1)
}

/// Gives up on a dead event: it stays recorded as `skipped` and the events it held back
/// follow. Returns false when `id` is not a dead event.
pub async fn skip_dead(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    skip_dead_in(&mut *pool.acquire().await?, id).await
}

/// [`skip_dead`] on `conn`, as [`retry_dead_in`].
pub async fn skip_dead_in(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let all = DeadFilter::all();
    Ok(storage::resolve_dead(conn, Some(id), &all, Resolution::Skip).await? == 1)
}

/// [`retry_dead`] for every dead event matching `filter`, in one statement; returns how many
/// there were. Repeating it is harmless (the events are no longer dead), and so is running it
/// while relays run: they never touch dead rows, and a row that dies meanwhile is either
/// retried or left dead, never half of each.
pub async fn retry_dead_matching(pool: &PgPool, filter: &DeadFilter) -> sqlx::Result<u64> {
    retry_dead_matching_in(&mut *pool.acquire().await?, filter).await
}

/// [`retry_dead_matching`] on `conn`, as [`retry_dead_in`].
pub async fn retry_dead_matching_in(
    conn: &mut PgConnection,
    filter: &DeadFilter,
) -> sqlx::Result<u64> {
    storage::resolve_dead(conn, None, filter, Resolution::Retry).await
}

/// [`skip_dead`] for every dead event matching `filter`, in one statement; returns how many
/// there were. Safe to repeat and to run beside relays, as [`retry_dead_matching`].
pub async fn skip_dead_matching(pool: &PgPool, filter: &DeadFilter) -> sqlx::Result<u64> {
    skip_dead_matching_in(&mut *pool.acquire().await?, filter).await
}

/// [`skip_dead_matching`] on `conn`, as [`retry_dead_in`].
pub async fn skip_dead_matching_in(
    conn: &mut PgConnection,
    filter: &DeadFilter,
) -> sqlx::Result<u64> {
    storage::resolve_dead(conn, None, filter, Resolution::Skip).await
}

/// The longest retention [`cleanup`] keeps published events for: the ring of
/// `outbox_published`'s partitions, 96 of two hours, less the one being filled and the one
/// being emptied.
pub const MAX_RETENTION: Duration = Duration::from_secs(188 * 3600);

/// Ages out what is older than `retention`: empties each partition of `outbox_published`
/// whose latest two hours ended `retention` ago (so a published event is kept for at least
/// `retention` from its `published_at`, when the relay's pass that published it began, and
/// while the cleanup runs every round at most two hours and one interval more), and deletes,
/// `batch` rows per statement, the skipped events and those a relay of an earlier version
/// marked published in the outbox itself. Returns how many events were aged
/// out: for an emptied partition, PostgreSQL's count of its live rows (its statistics, which
/// reach a transaction's changes some seconds after it commits; where they were lost, the last
/// `VACUUM` or `ANALYZE`'s estimate). A `batch` below 1 counts as 1. A `retention` over
/// [`MAX_RETENTION`] is refused (the database's error says so) rather than kept short: check it
/// where it is configured. The row-by-row deletion runs even when emptying partitions fails;
/// the first error is returned.
pub async fn cleanup(pool: &PgPool, retention: Duration, batch: i64) -> sqlx::Result<u64> {
    let emptied = storage::age_out_published(pool, retention).await;
    let deleted = crate::batches::in_batches(batch, |batch| {
        storage::delete_finished(pool, retention, batch)
    })
    .await;
    Ok(emptied? + deleted?)
}
