//! A broker that forgets what it acknowledged, against the real binaries with their defaults:
//! nats-server restarted on an older copy of its store (what a power loss leaves of a store
//! JetStream had not synced), restarted empty, its stream deleted by an operator, its stream's
//! files removed from under it; in a three-node cluster, one node's store wiped and all three
//! restarted on older copies. Also a broker whose account is out of storage, and an outage
//! longer than billing's inbox retention. Each ends with every order invoiced exactly once, in
//! order, nothing dead.

use std::time::Duration;

use e2e::checker::Report;
use e2e::cluster::{Cluster, RunningLoad, Setup, account_config};
use e2e::eventually;
use e2e::process::NatsServer;

/// Orders accepted between two steps.
const STEP: usize = 100;

/// Stops the load after `more` orders, waits for the system to drain and checks it: the
/// relays must not have taken the stream for damaged.
async fn finish_clean(cluster: Cluster, load: RunningLoad, more: usize) {
    finish(cluster, load, more, Report::assert_clean).await;
}

/// [`finish_clean`] where the stream may have been damaged, and deleted as such.
async fn finish_clean_after_damage(cluster: Cluster, load: RunningLoad, more: usize) {
    finish(cluster, load, more, Report::assert_clean_after_damage).await;
}

async fn finish(cluster: Cluster, load: RunningLoad, more: usize, assert: fn(&Report)) {
    load.progress(more).await;
    let ledger = load.finish().await;
    assert(&cluster.check(&ledger).await);
    cluster.stop().await;
}

/// Billing is stopped, orders are placed and every event is published and acknowledged; then
/// nats-server restarts on a copy of its store taken before them. The events it forgot are
/// published again from `outbox_published`, and billing invoices them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restarted_on_an_older_copy_of_its_store() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(2, false);
    load.progress(STEP / 2).await;
    cluster.billing[0].kill().await;
    cluster.nats[0].kill().await;
    let copy = cluster.nats[0].copy_store();
    cluster.nats[0].restart().await;
    load.progress(STEP).await;
    cluster.all_published().await;

    cluster.nats[0].kill().await;
    cluster.nats[0].restore_store(&copy);
    cluster.nats[0].restart().await;
    cluster.billing[0].restart().await;
    finish_clean(cluster, load, STEP).await;
}

/// nats-server restarts with an empty store: the stream and billing's durable consumer are
/// gone. orders-service makes the stream again and publishes again what it held; billing makes
/// its consumer again; neither restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restarted_with_an_empty_store() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(2, false);
    load.progress(STEP).await;
    cluster.all_published().await;
    cluster.nats[0].kill().await;
    cluster.nats[0].wipe_store();
    cluster.nats[0].restart().await;
    finish_clean(cluster, load, STEP).await;
}

/// An operator deletes the stream under load: orders-service makes it again and publishes
/// again what it held, billing makes its consumer again. nats-server 2.9 may lose the files of
/// a stream made again so soon: the relays then delete it as damaged and make it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_deleted_by_an_operator() {
    let cluster = Cluster::start(1, 1).await;
    let load = cluster.load(2, false);
    load.progress(STEP).await;
    let client = service_kit::infra::connect_nats(&cluster.nats_url(), "operator")
        .await
        .unwrap();
    async_nats::jetstream::new(client)
        .delete_stream(&cluster.names.stream)
        .await
        .unwrap();
    finish_clean_after_damage(cluster, load, STEP).await;
}

/// The stream's files are removed from under the running broker, as nats-server 2.9 does to a
/// stream made again at once after its deletion: it goes on acknowledging every publish and
/// returns no message, nor takes a consumer, until it restarts. Billing is stopped meanwhile,
/// so that it must read them back. orders-service deletes the stream, makes it again and
/// publishes again what it held; billing makes its consumer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_files_removed_under_a_running_broker() {
    let mut cluster = Cluster::start(1, 1).await;
    let load = cluster.load(2, false);
    load.progress(STEP / 2).await;
    cluster.billing[0].kill().await;
    load.progress(STEP / 2).await;
    cluster.nats[0].remove_stream_files(&cluster.names.stream);
    load.progress(STEP / 2).await;
    // The relay sees the damage within a light check, and confirms it over at least 10 s.
    cluster.orders_see_the_broker("stream damaged").await;
    // Billing cannot make its consumer on the damaged stream: it starts once the relay made it
    // again.
    cluster
        .orders_counted("outbox_stream_damaged_total", 1)
        .await;
    cluster.orders_see_the_broker("ok").await;
    cluster.billing[0].restart().await;
    finish_clean_after_damage(cluster, load, STEP).await;
}

/// Three nodes, the stream with three replicas, two instances of each service: one node is
/// stopped, its store wiped, and started again (Jepsen's minority case); it catches up from the
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_node_restarted_with_its_store_wiped() {
    let setup = Setup {
        nats_cluster: true,
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(2, 2, setup).await;
    let load = cluster.load(4, false);
    load.progress(STEP).await;
    let leader = cluster.stream_leader().await;
    cluster.nats[leader].kill().await;
    cluster.nats[leader].wipe_store();
    cluster.nats[leader].restart().await;
    load.progress(STEP).await;
    finish_clean(cluster, load, STEP).await;
}

/// Three nodes, two instances of each service, billing stopped: orders are placed and
/// published, then all three nodes restart on copies of their stores taken before them (a
/// coordinated power loss). The events they forgot are published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_restarted_on_older_copies_of_its_stores() {
    let setup = Setup {
        nats_cluster: true,
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(2, 2, setup).await;
    let load = cluster.load(4, false);
    load.progress(STEP / 2).await;
    for billing in &mut cluster.billing {
        billing.kill().await;
    }
    for node in &mut cluster.nats {
        node.kill().await;
    }
    let copies: Vec<_> = cluster.nats.iter().map(NatsServer::copy_store).collect();
    for node in &mut cluster.nats {
        node.restart().await;
    }
    load.progress(STEP).await;
    cluster.all_published().await;

    for node in &mut cluster.nats {
        node.kill().await;
    }
    for (node, copy) in cluster.nats.iter().zip(&copies) {
        node.restore_store(copy);
    }
    for node in &mut cluster.nats {
        node.restart().await;
    }
    for billing in &mut cluster.billing {
        billing.restart().await;
    }
    finish_clean(cluster, load, STEP).await;
}

/// The services' account has 1 MB of JetStream storage: once the stream fills it, every publish
/// is refused for want of room. That is an outage: orders keep being accepted, the events wait,
/// none is dead, the gauge says so; once the operator raises the limit, all are published.
/// The operator reloads the server's configuration: a crash instead, JetStream having stored,
/// refused and removed messages whose removal had not reached its disk, would bring them back
/// beside the copies published since (docs/operations.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_out_of_storage_is_an_outage() {
    let setup = Setup {
        account_storage: Some(1 << 20),
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(4, false);
    let metrics = format!("{}/metrics", cluster.orders[0].url);
    eventually(
        "the broker's storage full",
        Duration::from_secs(120),
        || async {
            let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
            text.lines()
                .any(|line| line == "outbox_broker_storage_full 1")
                .then_some(())
        },
    )
    .await;
    cluster.orders_see_the_broker("storage full").await;
    load.progress(STEP).await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'dead'")
        .fetch_one(cluster.orders_pool())
        .await
        .unwrap();
    assert_eq!(dead, 0, "a full broker makes no event dead");

    let credentials = cluster.nats[0]
        .credentials
        .clone()
        .expect("the account's user");
    // The operator raises the limit and has the server reload its configuration.
    cluster.nats[0].config = Some(account_config(&credentials, 1 << 30));
    cluster.nats[0].reload().await;
    cluster.orders_see_the_broker("ok").await;
    finish_clean(cluster, load, STEP).await;
}

/// Settings of the scenario below: billing's inbox keeps records 20 s, so that an outage
/// longer than it lasts 30 s rather than a week; the other settings shrink with it because
/// billing refuses a retention shorter than the duplicate window, the ack wait and the retries
/// together.
const SHORT_RETENTION: &[(&str, &str)] = &[
    ("INBOX_RETENTION_MS", "20000"),
    ("NATS_DUPLICATE_WINDOW_MS", "2000"),
    ("CONSUMER_ACK_WAIT_MS", "5000"),
    ("CONSUMER_MAX_RETRIES", "5"),
];

/// The broker is down for longer than billing's inbox retention while orders keep coming: their
/// events wait in the outbox, and once published are as new as their first publish, so billing
/// applies them (before, it judged them by their creation and dead-lettered them). The broker
/// goes down before the first order, so that no message is in flight to billing then: one
/// delivered and lost on the way would come back as a redelivery stored longer ago than the
/// retention, which billing must not apply unless its record is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_inbox_retention() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let setup = Setup {
        env: SHORT_RETENTION,
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    cluster.nats[0].kill().await;
    let load = cluster.load(1, false);
    load.progress(STEP / 2).await;
    cluster.relay_failed(1).await;
    // The outage itself: a duration the scenario chooses, not a wait for a condition.
    tokio::time::sleep(OUTAGE).await;
    cluster.nats[0].restart().await;
    finish_clean(cluster, load, STEP / 2).await;
}
