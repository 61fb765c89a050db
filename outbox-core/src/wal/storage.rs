//! The SQL of the WAL wake-up: the publication, the slot, and who streams it.
//!
//! Names of publications and slots are identifiers, which PostgreSQL does not take as
//! parameters; [`super::WalWakeup::new`] allows only `[a-z0-9_]` in them, so they are quoted
//! safely.

use sqlx::{PgConnection, PgPool};

/// The server's `wal_level`.
pub(super) async fn wal_level(pool: &PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!(r#"SELECT current_setting('wal_level') AS "level!""#)
        .fetch_one(pool)
        .await
}

/// Publishes the outbox's inserts under `name`, once: a concurrent creation is not an error.
pub(super) async fn ensure_publication(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1) AS "exists!""#,
        name
    )
    .fetch_one(&mut *conn)
    .await?;
    if exists {
        return Ok(());
    }
    let created = sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE PUBLICATION \"{name}\" FOR TABLE outbox WITH (publish = 'insert')"
    )))
    .execute(conn)
    .await;
    ignore_duplicate(created.map(drop))
}

/// What the server says of a slot.
#[derive(Debug)]
pub(super) struct Slot {
    /// The backend streaming it, if any.
    pub(super) active_pid: Option<i32>,
    /// `lost` once the server removed WAL the slot still needed (`max_slot_wal_keep_size`).
    pub(super) wal_status: Option<String>,
    /// Whether it is a logical slot of this database on `pgoutput`: the only kind the wake-up
    /// streams, drops or ends the stream of.
    pub(super) ours: bool,
}

/// The slot named `name`, if it exists (slot names are the server's, not the database's).
pub(super) async fn slot(conn: &mut PgConnection, name: &str) -> sqlx::Result<Option<Slot>> {
    sqlx::query_as!(
        Slot,
        r#"SELECT active_pid, wal_status,
                  (slot_type = 'logical' AND plugin = 'pgoutput'
                   AND database = current_database()) AS "ours!"
           FROM pg_replication_slots WHERE slot_name = $1"#,
        name
    )
    .fetch_optional(conn)
    .await
}

/// Creates the logical slot `name` on the `pgoutput` plugin; a concurrent creation is not an
/// error.
pub(super) async fn create_slot(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    let created = sqlx::query!(
        "SELECT 1 AS one FROM pg_create_logical_replication_slot($1, 'pgoutput')",
        name
    )
    .fetch_one(conn)
    .await;
    ignore_duplicate(created.map(drop))
}

/// Drops the slot `name` (a lost one cannot be streamed again).
pub(super) async fn drop_slot(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query!("SELECT pg_drop_replication_slot($1)", name)
        .execute(conn)
        .await
        .map(drop)
}

/// Ends the stream of the slot `name` of this database, if one runs: an instance that lost
/// its lock left it. Returns whether one did.
pub(super) async fn end_stream(conn: &mut PgConnection, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT COALESCE(bool_or(pg_terminate_backend(active_pid)), false) AS "ended!"
           FROM pg_replication_slots
           WHERE slot_name = $1 AND database = current_database() AND active_pid IS NOT NULL"#,
        name
    )
    .fetch_one(conn)
    .await
}

/// Takes the session lock that makes its holder the one instance streaming `slot`, if free.
pub(super) async fn try_lock(conn: &mut PgConnection, slot: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_lock(hashtextextended('outbox_wal/' || $1, 0)) AS "locked!""#,
        slot
    )
    .fetch_one(conn)
    .await
}

/// The server's WAL position and the one the slot confirmed, in bytes from the WAL's start;
/// `None` when there is no such slot.
pub(super) async fn positions(pool: &PgPool, slot: &str) -> sqlx::Result<Option<(i64, i64)>> {
    let row = sqlx::query!(
        r#"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS "current!",
                  pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint AS "confirmed"
           FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()"#,
        slot
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|row| Some((row.current, row.confirmed?))))
}

/// `Ok` for an object another instance created first.
fn ignore_duplicate(result: sqlx::Result<()>) -> sqlx::Result<()> {
    match result {
        Err(sqlx::Error::Database(error))
            if error.code().as_deref() == Some("42710") || error.is_unique_violation() =>
        {
            Ok(())
        }
        other => other,
    }
}
