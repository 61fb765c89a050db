//! The tables this crate needs, as sqlx migrators.
//!
//! They are tracked in the application's `_sqlx_migrations` table next to its own migrations,
//! with versions that do not collide with timestamped application migrations. Both migrators
//! ignore migrations they do not know, so they can share the table with the application's.

use sqlx::PgPool;
use sqlx::migrate::Migrator;

use crate::Error;

/// Applies the outbox tables (for a producing service).
pub async fn outbox(pool: &PgPool) -> Result<(), Error> {
    run(sqlx::migrate!("./migrations/outbox"), pool).await
}

/// Applies the inbox tables (for a consuming service).
pub async fn inbox(pool: &PgPool) -> Result<(), Error> {
    run(sqlx::migrate!("./migrations/inbox"), pool).await
}

/// Runs `migrator` while tolerating the application's own migrations in the same table.
pub async fn run(mut migrator: Migrator, pool: &PgPool) -> Result<(), Error> {
    migrator.set_ignore_missing(true);
    migrator.run(pool).await?;
    Ok(())
}
