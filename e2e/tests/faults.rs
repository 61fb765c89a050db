//! Scenarios against the real binaries, with real faults, judged by the checker: nothing
//! lost, nothing applied twice, nothing unexpected, every order's events in order.

use std::time::Duration;

use e2e::cluster::{Cluster, Setup};
use e2e::eventually;
use jetstream_outbox::NewEvent;
use jetstream_outbox::testing::{slot_streamed_by, slot_streamed_by_another};
use serde_json::json;

/// Orders accepted between two faults.
const STEP: usize = 150;

/// The relays woken from a replication slot (`RELAY_WAL_SLOT`), besides polling: the setting
/// is off by default, and these scenarios are its faults.
fn with_a_wal_slot() -> Setup {
    Setup {
        wal_slot: true,
        ..Setup::default()
    }
}

/// With [`Setup::wal_slot`], an instance streams the slot once the faults are over.
async fn slot_streamed_again(cluster: &Cluster) {
    if let Some(slot) = cluster.wal_slot() {
        slot_streamed_by(cluster.orders_pool(), slot).await;
    }
}

/// orders-service is killed with SIGKILL mid-load, twice, and restarted; hostile requests are
/// mixed into the load and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_service_killed_twice_under_load() {
    orders_service_killed_twice(Setup::default()).await;
}

/// The same with the relay woken from a replication slot: each kill ends the slot's stream
/// mid-transaction, and the restarted instance streams it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_service_killed_twice_under_load_with_a_wal_slot() {
    orders_service_killed_twice(with_a_wal_slot()).await;
}

async fn orders_service_killed_twice(setup: Setup) {
    let mut cluster = Cluster::start_with(1, 1, setup).await;
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
    slot_streamed_again(&cluster).await;
    cluster.stop().await;
}

/// nats-server is killed with SIGKILL and restarted on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_killed_and_restarted_on_its_store() {
    nats_server_killed_and_restarted(Setup::default()).await;
}

/// The same with the relay woken from a replication slot: commits keep waking a relay that
/// cannot publish, and nothing is lost or reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_killed_and_restarted_with_a_wal_slot() {
    nats_server_killed_and_restarted(with_a_wal_slot()).await;
}

async fn nats_server_killed_and_restarted(setup: Setup) {
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    cluster.nats[0].kill().await;
    load.progress(STEP / 3).await;
    cluster.nats[0].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    slot_streamed_again(&cluster).await;
    cluster.stop().await;
}

/// NATS down for three minutes under load, with the relay's default settings (10 attempts,
/// backoff up to 60 s): orders keep being accepted, and once the broker is back every one is
/// relayed and invoiced in order, none dead. Before the relay told an unreachable broker from a
/// refusal, the defaults made events dead 26-51 s into an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_minute_broker_outage_needs_no_operator() {
    const OUTAGE: Duration = Duration::from_secs(180);
    let mut cluster = Cluster::start(1, 1).await;
    // One client: three minutes of it is a backlog of thousands, which drains well within the
    // checker's bound.
    let load = cluster.load(1, false);
    load.progress(STEP).await;
    cluster.nats[0].kill().await;
    cluster.relay_failed(1).await;
    let accepted_before = load.ledger.count();
    // The outage itself: a duration the scenario chooses, not a wait for a condition.
    tokio::time::sleep(OUTAGE).await;
    assert!(
        load.ledger.count() > accepted_before + STEP,
        "orders were accepted while the broker was down"
    );
    cluster.nats[0].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// NATS goes down while the relay has nothing to publish: no publish fails, but its stream
/// checks do, and `outbox_broker_unreachable` and the stats' `broker` say so until the broker
/// is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_sees_the_broker_go_and_come_back() {
    let mut cluster = Cluster::start(1, 1).await;
    cluster.nats[0].kill().await;
    cluster
        .orders_summed("outbox_broker_unreachable", "the broker unreachable", |n| {
            n == 1
        })
        .await;
    cluster.orders_see_the_broker("unreachable").await;
    cluster.nats[0].restart().await;
    cluster
        .orders_summed("outbox_broker_unreachable", "the broker back", |n| n == 0)
        .await;
    cluster.orders_see_the_broker("ok").await;
    let load = cluster.load(1, false);
    load.progress(STEP / 3).await;
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

/// A transaction takes its outbox position early and commits late, after many later events
/// were published: its event is still published (the relay keeps no high-water mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_is_still_published() {
    let cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP / 3).await;

    let mut tx = cluster.orders_pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id, customer, total_minor) VALUES ('late-1', 'late', 4242)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let payload =
        json!({"orderId": "late-1", "customer": "late", "totalMinor": 4242, "status": "placed"});
    let event = NewEvent::new("order", "late-1", "OrderPlaced", &payload).unwrap();
    jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
    load.progress(STEP).await;
    tx.commit().await.unwrap();
    load.ledger.accept("late-1", 4242);

    load.progress(STEP / 3).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// A session sits idle in a transaction holding a snapshot and a lock on a pending outbox row:
/// the relay skips that row while it is locked (publishing later events of other orders
/// meanwhile), and publishes it once the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_in_a_transaction_makes_the_relay_skip_nothing() {
    let cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP / 3).await;

    // The session locks the newest event the moment it exists, before the relay can publish it.
    let mut tx = cluster.orders_pool().begin().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let locked: i64 = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no pending event to lock in 30 s"
        );
        let row: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM outbox WHERE status = 'pending' ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
        if let Some(seq) = row {
            break seq;
        }
    };
    load.progress(STEP).await;
    // Skipped, not waited on: other orders' events committed after the lock are published
    // while it is held (a relay that blocked on the locked row would publish none of them).
    let aggregate: String = sqlx::query_scalar("SELECT aggregate_id FROM outbox WHERE seq = $1")
        .bind(locked)
        .fetch_one(cluster.orders_pool())
        .await
        .unwrap();
    eventually(
        "later events of other orders published past the locked row",
        Duration::from_secs(30),
        || async {
            let published: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox_events \
                 WHERE seq > $1 AND aggregate_id <> $2 AND status = 'published'",
            )
            .bind(locked)
            .bind(&aggregate)
            .fetch_one(cluster.orders_pool())
            .await
            .ok()?;
            (published > 0).then_some(())
        },
    )
    .await;
    let status: String = sqlx::query_scalar("SELECT status FROM outbox_events WHERE seq = $1")
        .bind(locked)
        .fetch_one(cluster.orders_pool())
        .await
        .unwrap();
    assert_eq!(
        status, "pending",
        "the relay must not touch a row another session holds"
    );
    tx.rollback().await.unwrap();

    load.progress(STEP / 3).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// billing-service dies after its transaction committed and before the ack (a failpoint): the
/// message is delivered again, found in the inbox, and applied only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_killed_after_commit_before_ack() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP / 3).await;
    cluster.billing[0].set_env("FAILPOINT_CRASH_AFTER_COMMITS", Some("50"));
    cluster.billing[0].kill().await;
    // Not waiting for readiness: the backlog may reach the failpoint first.
    cluster.billing[0].respawn();
    let exit = cluster.billing[0].exited().await;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&exit),
        Some(6),
        "billing aborted (SIGABRT) at the failpoint, not at start-up: {exit}"
    );
    cluster.billing[0].set_env("FAILPOINT_CRASH_AFTER_COMMITS", None);
    cluster.billing[0].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    // The message in hand at the abort comes back after the ack wait (30 s by default), which
    // the checker's drain need not wait for: wait for it, then check that it changed nothing.
    let stats_url = format!("{}/inbox/stats", cluster.billing[0].url);
    eventually(
        "the unacked message back, as a duplicate",
        Duration::from_secs(90),
        || async {
            let stats: serde_json::Value =
                reqwest::get(&stats_url).await.ok()?.json().await.ok()?;
            (stats["duplicate"].as_i64()? >= 1).then_some(())
        },
    )
    .await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// Lost PubAcks: a proxy between the relay and NATS swallows the server's replies for a while.
/// The broker stored the messages; the relay, never acknowledged, publishes them again, and the
/// broker drops the copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_pub_acks() {
    let setup = Setup {
        proxy: true,
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(4, false);
    load.progress(STEP / 3).await;
    let proxy = cluster.proxy.as_ref().expect("proxied");
    proxy.swallow_replies(true);
    cluster.relay_failed(2).await;
    proxy.swallow_replies(false);
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// PostgreSQL restarted in immediate mode (every backend killed, crash recovery) under load:
/// the services recover on their own and no order is half-written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_immediately_under_load() {
    postgres_restarted_immediately(false).await;
}

/// The same with the relays woken from a replication slot (two instances sharing it): the
/// slot survives the crash and is streamed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_immediately_under_load_with_a_wal_slot() {
    postgres_restarted_immediately(true).await;
}

async fn postgres_restarted_immediately(wal_slot: bool) {
    let setup = Setup {
        own_postgres: true,
        wal_slot,
        ..Setup::default()
    };
    let orders = if wal_slot { 2 } else { 1 };
    let cluster = Cluster::start_with(orders, 1, setup).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    cluster
        .postgres
        .as_ref()
        .expect("own postgres")
        .restart_immediate()
        .await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();

    // Atomic write: every order has its OrderPlaced event and every event its order.
    let orphans: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM orders o WHERE NOT EXISTS \
                   (SELECT 1 FROM outbox_events e WHERE e.aggregate_id = o.id AND e.event_type = 'OrderPlaced')) \
              + (SELECT count(*) FROM outbox_events e WHERE NOT EXISTS \
                   (SELECT 1 FROM orders o WHERE o.id = e.aggregate_id))",
    )
    .fetch_one(cluster.orders_pool())
    .await
    .unwrap();
    assert_eq!(orphans, 0);
    if let Some(slot) = cluster.wal_slot() {
        // Longer than a kill's: each instance's retries double while the server recovers.
        eventually(
            "the slot streamed again",
            Duration::from_secs(30),
            || async {
                let active: bool = sqlx::query_scalar(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                )
                .bind(slot)
                .fetch_optional(cluster.orders_pool())
                .await
                .ok()??;
                active.then_some(())
            },
        )
        .await;
    }
    cluster.stop().await;
}

/// SIGTERM under load: both services stop accepting, finish what is in flight (the relay its
/// batch, the consumer its message) and exit 0 within a bounded time; after a restart nothing is
/// lost or duplicated and every answered request kept its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_under_load() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    let orders_exit = cluster.orders[0].terminate().await;
    let billing_exit = cluster.billing[0].terminate().await;
    assert!(
        orders_exit.success(),
        "orders-service exited with {orders_exit}"
    );
    assert!(
        billing_exit.success(),
        "billing-service exited with {billing_exit}"
    );
    cluster.orders[0].restart().await;
    cluster.billing[0].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// nats-server requires a user and password: the services authenticate with the credentials in
/// `NATS_URL`, and the whole path works as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_with_user_and_password() {
    let setup = Setup {
        nats_auth: true,
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    assert!(
        async_nats::connect(format!("nats://127.0.0.1:{}", cluster.nats[0].port))
            .await
            .is_err(),
        "the server refuses clients without credentials"
    );
    let load = cluster.load(2, false);
    load.progress(STEP / 3).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}

/// Three nats-servers as one JetStream cluster, the stream with three replicas, two instances
/// of each service: the stream leader's server is SIGKILLed under load and later restarted on
/// its store, then one orders-service and one billing-service are killed and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_loses_the_stream_leader_under_load() {
    nats_cluster_loses_the_stream_leader(Setup {
        nats_cluster: true,
        ..Setup::default()
    })
    .await;
}

/// The same with the relays woken from a replication slot the two orders-service instances
/// share: the one streaming it is killed, and the other takes the slot over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_loses_the_stream_leader_with_a_wal_slot() {
    nats_cluster_loses_the_stream_leader(Setup {
        nats_cluster: true,
        ..with_a_wal_slot()
    })
    .await;
}

async fn nats_cluster_loses_the_stream_leader(setup: Setup) {
    let mut cluster = Cluster::start_with(1, 2, setup).await;
    cluster.start_orders().await;
    let load = cluster.load(6, false);
    load.progress(STEP).await;

    let leader = cluster.stream_leader().await;
    cluster.nats[leader].kill().await;
    load.progress(STEP).await;
    let successor = cluster.stream_leader().await;
    assert_ne!(successor, leader, "a surviving node leads the stream");
    cluster.nats[leader].restart().await;
    load.progress(STEP).await;

    // The instance streaming the slot, if any, is killed: either may by now, and its backend
    // may have changed since it began.
    let (victim, streamer) = match cluster.wal_slot() {
        Some(slot) => {
            let victim = cluster.orders_streaming().await;
            let backend = slot_streamed_by(cluster.orders_pool(), slot).await;
            (victim, Some(backend))
        }
        None => (0, None),
    };
    cluster.orders[victim].kill().await;
    cluster.billing[1].kill().await;
    if let (Some(slot), Some(streamer)) = (cluster.wal_slot(), streamer) {
        slot_streamed_by_another(cluster.orders_pool(), slot, streamer).await;
    }
    load.progress(STEP).await;
    cluster.orders[victim].restart().await;
    cluster.billing[1].restart().await;
    load.progress(STEP).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    slot_streamed_again(&cluster).await;
    cluster.stop().await;
}
