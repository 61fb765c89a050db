//! How order events change invoices, against the real PostgreSQL.

use billing_service::invoices::{self, ApplyError, Change};
use sqlx::PgPool;

fn open(order_id: &str, total_minor: i64) -> Change {
    Change::Open {
        order_id: order_id.into(),
        total_minor,
    }
}

fn pay(order_id: &str) -> Change {
    Change::Pay {
        order_id: order_id.into(),
    }
}

/// Every invoice as (order, total, status), by order.
async fn invoices(pool: &PgPool) -> Vec<(String, i64, String)> {
    sqlx::query_as("SELECT order_id, total_minor, status FROM invoices ORDER BY order_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Changes apply in their order, though each run of one kind is one statement: a payment after
/// its order's opening in the same call finds the invoice, a second opening of an order changes
/// nothing, and a payment before its opening (or with none) is not applicable yet, reported
/// under the place it was given with.
#[sqlx::test(migrations = false)]
async fn changes_apply_in_their_order_a_run_at_a_time(pool: PgPool) {
    billing_service::startup::migrate(&pool).await.unwrap();
    let changes = [
        (10, open("o1", 100)),
        (11, open("o2", 200)),
        (12, open("o1", 999)),
        (13, pay("o1")),
        (14, open("o3", 300)),
        (15, pay("o3")),
        (16, pay("o1")),
    ];
    let mut tx = pool.begin().await.unwrap();
    let applied = invoices::apply(&mut tx, &changes).await.unwrap();
    assert_eq!(applied.len(), changes.len());
    tx.commit().await.unwrap();
    let paid_and_open = [
        ("o1".to_owned(), 100, "paid".to_owned()),
        ("o2".to_owned(), 200, "open".to_owned()),
        ("o3".to_owned(), 300, "paid".to_owned()),
    ];
    assert_eq!(invoices(&pool).await, paid_and_open);

    let mut tx = pool.begin().await.unwrap();
    let too_early = [
        (0, pay("o2")),
        (1, pay("o4")),
        (2, pay("o1")),
        (3, open("o4", 400)),
    ];
    let (place, error) = invoices::apply(&mut tx, &too_early).await.unwrap_err();
    assert_eq!(place, 1, "the payment of o4, before its opening");
    assert!(matches!(error, ApplyError::NotYet(_)), "{error:?}");
    drop(tx);
    assert_eq!(invoices(&pool).await, paid_and_open, "rolled back");

    let mut tx = pool.begin().await.unwrap();
    let (place, error) = invoices::apply(&mut tx, &[(7, pay("o5"))])
        .await
        .unwrap_err();
    assert_eq!(place, 7);
    assert!(matches!(error, ApplyError::NotYet(_)), "{error:?}");
}
