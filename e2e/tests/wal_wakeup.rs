//! `RELAY_WAL_SLOT` across processes: two orders-service instances share a slot, the one
//! streaming it is killed with SIGKILL, and the other streams it within seconds; events that
//! another application enqueued with SQL, telling no relay, are published and invoiced; and
//! the service's own commits, which it tells its relay of at once, cost no second pass when
//! the slot brings them too.

use std::time::Duration;

use e2e::cluster::{Cluster, Setup};
use e2e::eventually;
use jetstream_outbox::testing::{slot_streamed_by, slot_streamed_by_another};
use service_kit::testing;
use sqlx::PgPool;

/// Another application's order, enqueued with SQL: no relay is told.
async fn enqueue_elsewhere(pool: &PgPool, order: &str) {
    sqlx::query(
        "SELECT outbox_enqueue(gen_random_uuid(), 'order', $1, 'OrderPlaced',
                jsonb_build_object('orderId', $1::text, 'customer', 'elsewhere',
                                   'totalMinor', 100, 'status', 'placed'))",
    )
    .bind(order)
    .execute(pool)
    .await
    .expect("enqueued");
}

/// The whole way, order to invoice, on a machine the cluster and the services share (the
/// takeover itself is bounded by `slot_streamed_by_another`).
const DELIVERED: Duration = Duration::from_secs(30);

async fn invoiced(billing: &PgPool, orders: i64) {
    eventually("the orders invoiced", DELIVERED, || async {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(billing)
            .await
            .ok()?;
        (count == orders).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_streaming_instance_is_replaced_within_seconds() {
    let setup = Setup {
        // The setting under test (off by default), and relays that poll hourly, so that only
        // the slot can wake one within the test's limits.
        wal_slot: true,
        env: &[("RELAY_POLL_INTERVAL_MS", "3600000")],
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    let slot = cluster.wal_slot().expect("a slot").to_owned();
    let orders = cluster.orders_pool().clone();
    let billing = PgPool::connect(&testing::database_url(&cluster.names.billing_db))
        .await
        .expect("billing's database");
    let first = slot_streamed_by(&orders, &slot).await;
    // Before the second instance starts, so that its relay's first pass cannot publish it.
    enqueue_elsewhere(&orders, "o-wal-1").await;
    invoiced(&billing, 1).await;
    cluster.start_orders().await;
    // Each instance says whether it streams: an operator knows which one does.
    assert_eq!(cluster.orders_streaming().await, 0);
    cluster.orders[0].kill().await;
    slot_streamed_by_another(&orders, &slot, first).await;
    assert_eq!(cluster.orders_streaming().await, 1);
    enqueue_elsewhere(&orders, "o-wal-2").await;
    invoiced(&billing, 2).await;

    billing.close().await;
    cluster.stop().await;
}

/// A commit made through the service wakes its relay through memory, and the slot brings the
/// same commit a moment later: that should not cost the relay a pass finding nothing. Counted
/// as the claims that found nothing, for the same orders with the slot and without it. A commit
/// the slot brings before the relay was told, or before the database shows it to other
/// sessions, may still cost one: fewer than one for each order, where waking for every commit
/// read cost two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_commits_seldom_cost_a_second_pass() {
    const ORDERS: u64 = 20;
    let without = empty_claims_for_orders(ORDERS, false).await;
    let with = empty_claims_for_orders(ORDERS, true).await;
    assert!(
        with < without + ORDERS,
        "{with} claims found nothing with the slot, {without} without it, for {ORDERS} orders"
    );
}

/// The relay's claims that found nothing while `orders` orders are placed one at a time, a
/// quarter of a second apart: more than the slot's second wake-up of a commit waits.
async fn empty_claims_for_orders(orders: u64, wal_slot: bool) -> u64 {
    let setup = Setup {
        wal_slot,
        // A poll's claim finds nothing too: hourly, none falls within the test.
        env: &[("RELAY_POLL_INTERVAL_MS", "3600000")],
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    if let Some(slot) = cluster.wal_slot() {
        slot_streamed_by(cluster.orders_pool(), slot).await;
    }
    let client = reqwest::Client::new();
    let url = cluster.orders[0].url.clone();
    let before = empty_claims(&client, &url).await;
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    for _ in 0..orders {
        pace.tick().await;
        let placed = client
            .post(format!("{url}/orders"))
            .json(&serde_json::json!({"customer": "wal", "totalMinor": 100}))
            .send()
            .await
            .expect("POST /orders");
        assert_eq!(placed.status(), reqwest::StatusCode::CREATED);
    }
    pace.tick().await;
    cluster.all_published().await;
    let after = empty_claims(&client, &url).await;
    cluster.stop().await;
    after - before
}

/// `outbox_relay_claims_total{outcome="empty"}` of the orders-service at `url`.
async fn empty_claims(client: &reqwest::Client, url: &str) -> u64 {
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("/metrics")
        .text()
        .await
        .expect("/metrics");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(r#"outbox_relay_claims_total{outcome="empty"} "#))
        .and_then(|count| count.trim().parse().ok())
        .expect("the empty claims' counter")
}
