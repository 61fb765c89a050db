//! `RELAY_WAL_SLOT` across processes: two orders-service instances share a slot, the one
//! streaming it is killed with SIGKILL, and the other streams it within seconds; events that
//! another application enqueued with SQL, telling no relay, are published and invoiced.

use std::time::Duration;

use e2e::cluster::{Cluster, Setup};
use e2e::eventually;
use service_kit::testing;
use sqlx::PgPool;

const SLOT: &str = "e2e_wal_takeover";

/// Within seconds: the standby retries every second, and a killed instance's connections
/// close with it.
const TAKEOVER: Duration = Duration::from_secs(10);

/// The backend streaming the slot, once one does.
async fn streamed_by(pool: &PgPool) -> i32 {
    eventually("the slot streamed", TAKEOVER, || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(SLOT)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
        .flatten()
    })
    .await
}

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
    let setup = Setup {
        // Relays poll hourly, so that only the slot can wake one within the test's limits.
        env: &[
            ("RELAY_WAL_SLOT", SLOT),
            ("RELAY_POLL_INTERVAL_MS", "3600000"),
        ],
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    let orders = cluster.orders_pool().clone();
    let billing = PgPool::connect(&testing::database_url(&cluster.names.billing_db))
        .await
        .expect("billing's database");
    let first = streamed_by(&orders).await;
    cluster.start_orders().await;

    enqueue_elsewhere(&orders, "o-wal-1").await;
    invoiced(&billing, 1).await;
    cluster.orders[0].kill().await;
    eventually("the standby streaming", TAKEOVER, || async {
        (streamed_by(&orders).await != first).then_some(())
    })
    .await;
    enqueue_elsewhere(&orders, "o-wal-2").await;
    invoiced(&billing, 2).await;

    cluster.orders[1].kill().await;
    // A slot keeps its database from being dropped.
    eventually("the slot dropped", TAKEOVER, || async {
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(SLOT)
            .execute(&orders)
            .await
            .ok()
    })
    .await;
    billing.close().await;
    cluster.stop().await;
}
