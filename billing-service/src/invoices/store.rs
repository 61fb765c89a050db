//! Every SQL statement on the invoices table.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Invoice, InvoiceStatus};
use service_kit::pagination::Cursor;

/// Opens the invoice of an order unless it has one.
pub(super) async fn open(
    conn: &mut PgConnection,
    id: Uuid,
    order_id: &str,
    total_minor: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        INSERT INTO invoices (id, order_id, total_minor) VALUES ($1, $2, $3)
        ON CONFLICT (order_id) DO NOTHING
        "#,
        id,
        order_id,
        total_minor,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks the order's invoice paid; false when the order has no invoice.
pub(super) async fn pay(conn: &mut PgConnection, order_id: &str) -> sqlx::Result<bool> {
    let result = sqlx::query!(
        r#"
        UPDATE invoices SET status = 'paid', paid_at = COALESCE(paid_at, clock_timestamp())
        WHERE order_id = $1
        "#,
        order_id,
    )
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Reads one invoice.
pub(super) async fn find(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Invoice>> {
    sqlx::query_as!(
        Invoice,
        r#"
        SELECT id, order_id, total_minor, status AS "status: InvoiceStatus", created_at, paid_at
        FROM invoices WHERE id = $1
        "#,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// Reads up to `limit` invoices older than `after`, newest first, optionally of one order.
pub(super) async fn list(
    pool: &PgPool,
    order_id: Option<&str>,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Vec<Invoice>> {
    let (after_t, after_id) = after.map(|c| (c.t, c.id)).unzip();
    sqlx::query_as!(
        Invoice,
        r#"
        SELECT id, order_id, total_minor, status AS "status: InvoiceStatus", created_at, paid_at
        FROM invoices
        WHERE ($1::text IS NULL OR order_id = $1)
          AND ($2::timestamptz IS NULL OR (created_at, id::text) < ($2, $3::text))
        ORDER BY created_at DESC, id DESC
        LIMIT $4
        "#,
        order_id,
        after_t,
        after_id,
        limit,
    )
    .fetch_all(pool)
    .await
}
