//! Scenarios against the real binaries, with real faults, judged by the checker: nothing
//! lost, nothing applied twice, nothing unexpected, every order's events in order.

use std::time::Duration;

use e2e::cluster::Cluster;
use service_kit::testing::eventually;

/// Orders accepted between two faults.
const STEP: usize = 150;

/// orders-service is killed with SIGKILL mid-load, twice, and restarted; hostile requests are
/// mixed into the load and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_service_killed_twice_under_load() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, true);
    for _ in 0..2 {
        load.progress(STEP).await;
        cluster.orders[0].kill().await;
        cluster.orders[0].restart().await;
    }
    load.progress(STEP).await;
    let ledger = load.finish().await;
    assert!(
        ledger.refused.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "hostile requests were sent"
    );
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// nats-server is killed with SIGKILL and restarted on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_killed_and_restarted_on_its_store() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    cluster.nats.kill().await;
    load.progress(STEP / 3).await;
    cluster.nats.restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// NATS stays down for longer than the relay's first retries; the backlog drains afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_drains_after_a_long_broker_outage() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    cluster.nats.kill().await;
    let pool = cluster.orders_pool().clone();
    eventually(
        "the relay to fail a few times",
        Duration::from_secs(60),
        || async {
            let attempts: Option<i32> =
                sqlx::query_scalar("SELECT max(attempts) FROM outbox WHERE status = 'pending'")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (attempts? >= 3).then_some(())
        },
    )
    .await;
    cluster.nats.restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// Two orders-service and two billing-service instances at once, one of each killed and
/// restarted mid-load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_each_with_kills() {
    let mut cluster = Cluster::start(2, 2).await;
    let load = cluster.load(6, false);
    load.progress(STEP).await;
    cluster.orders[1].kill().await;
    cluster.billing[0].kill().await;
    load.progress(STEP).await;
    cluster.orders[1].restart().await;
    cluster.billing[0].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}
