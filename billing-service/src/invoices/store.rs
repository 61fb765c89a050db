//! Every SQL statement on the invoices table.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Invoice, InvoiceStatus};
use service_kit::pagination::Cursor;

/// Opens the invoice of each order of `order_ids` (with `ids` and `totals` alike) that has
/// none, in one statement.
pub(super) async fn open(
    conn: &mut PgConnection,
    ids: &[Uuid],
    order_ids: &[&str],
    totals: &[i64],
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        INSERT INTO invoices (id, order_id, total_minor)
        SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])
        ON CONFLICT (order_id) DO NOTHING
        "#,
        ids,
        order_ids as &[&str],
        totals,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks the invoices of `order_ids` paid, in one statement; returns the orders that have one.
pub(super) async fn pay(conn: &mut PgConnection, order_ids: &[&str]) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"
        UPDATE invoices SET status = 'paid', paid_at = COALESCE(paid_at, clock_timestamp())
        WHERE order_id = ANY($1::text[])
        RETURNING order_id
        "#,
        order_ids as &[&str],
    )
    .fetch_all(conn)
    .await
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
