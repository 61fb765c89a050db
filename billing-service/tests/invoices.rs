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
    let (place, error) =
        invoices::apply(&mut tx, &[(7, pay("o2")), (8, pay("o5")), (9, pay("o6"))])
            .await
            .unwrap_err();
    assert_eq!(place, 8, "the first payment without its invoice");
    assert!(matches!(error, ApplyError::NotYet(_)), "{error:?}");
}

/// Each payment is a row update of its own, a second payment of an order in the same call too
/// (the test log of applications counts copies applied twice by the updates they make), and a
/// statement's database error is laid at its run's first change.
#[sqlx::test(migrations = false)]
async fn a_payment_repeated_in_one_call_is_an_update_of_its_own(pool: PgPool) {
    billing_service::startup::migrate(&pool).await.unwrap();
    sqlx::raw_sql(include_str!("applications.sql"))
        .execute(&pool)
        .await
        .unwrap();
    let changes = [
        (0, open("o1", 100)),
        (1, open("o2", 200)),
        (2, pay("o1")),
        (3, pay("o2")),
        (4, pay("o1")),
    ];
    let mut tx = pool.begin().await.unwrap();
    invoices::apply(&mut tx, &changes).await.unwrap();
    tx.commit().await.unwrap();
    let payments: Vec<(String, i64)> = sqlx::query_as(
        "SELECT order_id, count(*) FROM test_applications WHERE change = 'paid' \
         GROUP BY order_id ORDER BY order_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(payments, [("o1".to_owned(), 2), ("o2".to_owned(), 1)]);

    let mut tx = pool.begin().await.unwrap();
    let refused = [(0, pay("o1")), (1, open("o3", 300)), (2, open("o4", -1))];
    let (place, error) = invoices::apply(&mut tx, &refused).await.unwrap_err();
    assert_eq!(
        place, 1,
        "the run's first opening, though the second is at fault"
    );
    assert!(matches!(error, ApplyError::Database(_)), "{error:?}");
}
