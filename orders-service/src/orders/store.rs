//! Every SQL statement on the orders table.

use sqlx::{PgConnection, PgPool};

use super::{Order, OrderStatus, ValidOrder};
use service_kit::pagination::Cursor;

/// Inserts the order; `None` when an order with this id exists.
pub(super) async fn insert(
    conn: &mut PgConnection,
    new: &ValidOrder,
) -> sqlx::Result<Option<Order>> {
    sqlx::query_as!(
        Order,
        r#"
        INSERT INTO orders (id, customer, total_minor) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO NOTHING
        RETURNING id, customer, total_minor, status AS "status: OrderStatus", created_at, updated_at
        "#,
        new.id,
        new.customer,
        new.total_minor,
    )
    .fetch_optional(conn)
    .await
}

/// Reads one order.
pub(super) async fn find(pool: &PgPool, id: &str) -> sqlx::Result<Option<Order>> {
    sqlx::query_as!(
        Order,
        r#"
        SELECT id, customer, total_minor, status AS "status: OrderStatus", created_at, updated_at
        FROM orders WHERE id = $1
        "#,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// Reads up to `limit` orders older than `after`, newest first.
pub(super) async fn list(
    pool: &PgPool,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Vec<Order>> {
    let (after_t, after_id) = after.map(|c| (c.t, c.id)).unzip();
    sqlx::query_as!(
        Order,
        r#"
        SELECT id, customer, total_minor, status AS "status: OrderStatus", created_at, updated_at
        FROM orders
        WHERE $1::timestamptz IS NULL OR (created_at, id) < ($1, $2::text)
        ORDER BY created_at DESC, id DESC
        LIMIT $3
        "#,
        after_t,
        after_id,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// Moves the order from `from` to `to`, locking its row; `None` when it is not in `from`.
pub(super) async fn set_status(
    conn: &mut PgConnection,
    id: &str,
    from: OrderStatus,
    to: OrderStatus,
) -> sqlx::Result<Option<Order>> {
    sqlx::query_as!(
        Order,
        r#"
        UPDATE orders SET status = $3, updated_at = clock_timestamp()
        WHERE id = $1 AND status = $2
        RETURNING id, customer, total_minor, status AS "status: OrderStatus", created_at, updated_at
        "#,
        id,
        from as OrderStatus,
        to as OrderStatus,
    )
    .fetch_optional(conn)
    .await
}
