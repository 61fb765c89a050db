//! `RELAY_WAL_SLOT` across processes: two orders-service instances share a slot, the one
//! streaming it is killed with SIGKILL, and the other streams it within seconds; events that
//! another application enqueued with SQL, telling no relay, are published and invoiced.

use std::time::Duration;

use e2e::cluster::{Cluster, Setup};
use e2e::eventually;
use jetstream_outbox::testing::{SlotGuard, slot_streamed_by, slot_streamed_by_another};
use service_kit::testing;
use sqlx::PgPool;

/// Within seconds: the standby retries every second, and a killed instance's connections
/// close with it.
const TAKEOVER: Duration = Duration::from_secs(10);

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

async fn invoiced(billing: &PgPool, orders: i64) {
    eventually("the orders invoiced", TAKEOVER, || async {
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
    // Slot names are the server's: each run names its own.
    let slot: &'static str = testing::unique("e2e_wal").to_lowercase().leak();
    let setup = Setup {
        // The setting under test (off by default), and relays that poll hourly, so that only
        // the slot can wake one within the test's limits.
        env: Vec::leak(vec![
            ("RELAY_WAL_SLOT", slot),
            ("RELAY_POLL_INTERVAL_MS", "3600000"),
        ]),
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let orders = cluster.orders_pool().clone();
    let slot_guard = SlotGuard::new(&orders.connect_options(), slot);
    // Dropped before the guard, on a panic too: no instance is left to make the slot again.
    let mut cluster = cluster;
    let billing = PgPool::connect(&testing::database_url(&cluster.names.billing_db))
        .await
        .expect("billing's database");
    let first = slot_streamed_by(&orders, slot).await;
    // Before the second instance starts, so that its relay's first pass cannot publish it.
    enqueue_elsewhere(&orders, "o-wal-1").await;
    invoiced(&billing, 1).await;
    cluster.start_orders().await;
    cluster.orders[0].kill().await;
    slot_streamed_by_another(&orders, slot, first).await;
    enqueue_elsewhere(&orders, "o-wal-2").await;
    invoiced(&billing, 2).await;

    cluster.orders[1].kill().await;
    drop(slot_guard);
    billing.close().await;
    cluster.stop().await;
}
