//! The tables this crate needs, as sqlx migrators.
//!
//! They are tracked in the application's `_sqlx_migrations` table next to its own migrations;
//! their versions are timestamps, as `sqlx migrate add` makes. [`outbox`], [`inbox`] and [`run`]
//! ignore migrations they do not know, so they can share the table with the application's; the
//! migrators themselves ([`outbox_migrations`], [`inbox_migrations`]) are sqlx's own, which
//! refuse a table holding others (`VersionMissing`) unless told to ignore them.
//!
//! A service that runs as a least-privileged role cannot apply migrations (it may not create
//! tables); the owner applies them, and the service only [`verify`]s at start-up that its
//! database has every migration it needs.

use sqlx::PgPool;
use sqlx::migrate::Migrator;

use crate::MigrateError;

/// The outbox tables' migrations (for a producing service).
pub fn outbox_migrations() -> Migrator {
    sqlx::migrate!("./migrations/outbox")
}

/// The inbox tables' migrations (for a consuming service).
pub fn inbox_migrations() -> Migrator {
    sqlx::migrate!("./migrations/inbox")
}

/// Applies the outbox tables.
pub async fn outbox(pool: &PgPool) -> Result<(), MigrateError> {
    run(outbox_migrations(), pool).await
}

/// Applies the inbox tables.
pub async fn inbox(pool: &PgPool) -> Result<(), MigrateError> {
    run(inbox_migrations(), pool).await
}

/// Runs `migrator` while tolerating the application's own migrations in the same table.
pub async fn run(mut migrator: Migrator, pool: &PgPool) -> Result<(), MigrateError> {
    migrator.set_ignore_missing(true);
    migrator.run(pool).await?;
    Ok(())
}

/// Checks, without changing anything, that every migration of `migrator` was applied; else
/// [`MigrateError::NotMigrated`] lists the missing versions.
pub async fn verify(migrator: &Migrator, pool: &PgPool) -> Result<(), MigrateError> {
    // Not `query_scalar!`: the table is sqlx's own, absent from the schema queries are
    // checked against.
    let applied: Vec<i64> =
        match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await
        {
            Ok(applied) => applied,
            Err(e) if is_undefined_table(&e) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
    let missing: Vec<i64> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|m| m.version)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(MigrateError::NotMigrated { missing })
    }
}

fn is_undefined_table(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .as_deref()
        == Some("42P01")
}
