//! The audit log of operator actions: each admin action (retry, skip, replay; one item or
//! every item a filter matches) is recorded with the name of the token that authorised it,
//! what it did, to what, and how many items it took. `GET /ops/audit` lists it, newest first,
//! to the admin and the read-only token alike; the `/ops` page shows it. A retry or a skip
//! commits with its row; a replay's effect commits in the consumer's own transaction, before
//! the letter's closing and its row (a bulk replay's row comes after all its letters).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::migrate::Migrator;
use sqlx::{PgExecutor, PgPool};
use utoipa::ToSchema;

/// The migrations of the audit table, applied by each service beside its own.
pub fn migrations() -> Migrator {
    sqlx::migrate!("../migrations/ops")
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Its number, increasing in the order rows were written (a replay's before its effect
    /// commits), not always in the order they were committed.
    pub id: i64,
    /// When it was taken.
    pub at: DateTime<Utc>,
    /// The name of the token that authorised it (`admin`).
    pub actor: String,
    /// What was done: `retry`, `skip` or `replay`.
    pub action: String,
    /// To what: an item's id, or the filter of a bulk action.
    pub target: String,
    /// How many items it took.
    pub count: i64,
}

/// An action whose row is written, to log once its transaction committed.
#[derive(Debug)]
#[must_use = "log it with `committed` once its transaction committed"]
pub struct Recorded {
    actor: String,
    action: String,
    target: String,
    count: u64,
}

impl Recorded {
    /// Logs the action, now that its row and the action itself are committed.
    pub fn committed(self) {
        let Self {
            actor,
            action,
            target,
            count,
        } = self;
        tracing::warn!(actor, action, target, count, "operator action");
    }
}

/// Records an action through `executor`: where it can be, the transaction that takes the
/// action, so that the action is never taken without its row, nor recorded without being taken.
pub async fn record(
    executor: impl PgExecutor<'_>,
    actor: &str,
    action: &str,
    target: &str,
    count: u64,
) -> sqlx::Result<Recorded> {
    sqlx::query!(
        "INSERT INTO ops_audit (actor, action, target, count) VALUES ($1, $2, $3, $4)",
        actor,
        action,
        target,
        i64::try_from(count).unwrap_or(i64::MAX),
    )
    .execute(executor)
    .await?;
    Ok(Recorded {
        actor: actor.to_owned(),
        action: action.to_owned(),
        target: target.to_owned(),
        count,
    })
}

/// Up to `limit` entries older than `before` (all when `None`), newest first.
pub async fn list(pool: &PgPool, before: Option<i64>, limit: i64) -> sqlx::Result<Vec<AuditEntry>> {
    sqlx::query_as!(
        AuditEntry,
        r#"SELECT id, at, actor, action, target, count FROM ops_audit
           WHERE $1::bigint IS NULL OR id < $1
           ORDER BY id DESC LIMIT $2"#,
        before,
        limit,
    )
    .fetch_all(pool)
    .await
}
