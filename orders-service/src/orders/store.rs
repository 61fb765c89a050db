//! Every SQL statement on the orders table.

use jetstream_outbox::NewEvent;
use sqlx::PgConnection;

use super::{Order, OrderStatus, ValidOrder};
use service_kit::pagination::Cursor;

/// Inserts the order and enqueues `event` in one statement; `None` (and no event) when an
/// order with this id exists.
pub(super) async fn insert_placed(
    conn: &mut PgConnection,
    new: &ValidOrder,
    event: &NewEvent,
) -> sqlx::Result<Option<Order>> {
    // `enqueued` has a row for each row of `placed`, so the event is written exactly when the
    // order is; the statement is one transaction.
    sqlx::query_as!(
        Order,
        r#"
        WITH placed AS (
            INSERT INTO orders (id, customer, total_minor) VALUES ($1, $2, $3)
            ON CONFLICT (id) DO NOTHING
            RETURNING id, customer, total_minor, status, created_at, updated_at
        ), enqueued AS (
            SELECT outbox_enqueue($4, $5, placed.id, $6, $7, $8) FROM placed
        )
        SELECT id AS "id!", customer AS "customer!", total_minor AS "total_minor!",
            status AS "status!: OrderStatus", created_at AS "created_at!",
            updated_at AS "updated_at!"
        FROM placed, enqueued
        "#,
        new.id,
        new.customer,
        new.total_minor,
        jetstream_outbox::event_id(),
        event.aggregate_type(),
        event.event_type(),
        event.payload(),
        event.traceparent(),
    )
    .fetch_optional(conn)
    .await
}

/// Reads one order.
pub(super) async fn find(conn: &mut PgConnection, id: &str) -> sqlx::Result<Option<Order>> {
    sqlx::query_as!(
        Order,
        r#"
        SELECT id, customer, total_minor, status AS "status: OrderStatus", created_at, updated_at
        FROM orders WHERE id = $1
        "#,
        id,
    )
    .fetch_optional(conn)
    .await
}

/// Reads up to `limit` orders older than `after`, newest first.
pub(super) async fn list(
    conn: &mut PgConnection,
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
    .fetch_all(conn)
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
