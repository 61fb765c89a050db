//! Outages the relay rides out without making an event dead or flooding the stream: a broker
//! with no room left, a record that fails after its publishes, an acknowledgement lost for a
//! message the broker stored. In a test binary of its own, one test at a time: the gauges and
//! counters they read live in the process-wide metrics recorder, which a relay's start writes
//! from its own state.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use async_nats::jetstream::stream::DiscardPolicy;
use common::{TestStream, count, enqueue, migrate};
use jetstream_outbox::relay::BrokerState;
use jetstream_outbox::testing::{Fault, FaultyPublisher, eventually};
use jetstream_outbox::{Relay, outbox};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Held by each test: another test's relay would overwrite the gauge this one waits for.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of metric `name` (without labels) in this binary's recorder.
fn metric(name: &str) -> Option<f64> {
    static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();
    let handle = METRICS.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
        handle
    });
    handle.render().lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.parse().ok()
    })
}

/// A stream at its limits that discards new messages answers every publish "no room": an
/// outage, not a refusal. `max_attempts` is 1, so that a refusal counted would make the event
/// dead at once: none is. The gauge and the relay's health say the broker is full until room
/// is made; then every event is published.
#[sqlx::test(migrations = false)]
async fn a_full_stream_is_an_outage_not_a_refusal(pool: PgPool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    metric("outbox_broker_storage_full");
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut full = stream.stream().await.cached_info().config.clone();
    full.max_messages = 5;
    full.discard = DiscardPolicy::New;
    stream.jetstream.update_stream(&full).await.unwrap();
    for order in 0..10 {
        enqueue(&pool, &format!("o{order}"), "OrderPlaced", json!({})).await;
    }
    let mut config = stream.relay_config();
    config.max_attempts = 1;
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(pool.clone(), stream.publisher(), config);
    let health = relay.health();
    let running = tokio::spawn(relay.run(stop.clone()));

    eventually("the broker full", Duration::from_secs(10), || async {
        (metric("outbox_broker_storage_full")? > 0.5).then_some(())
    })
    .await;
    eventually(
        "the relay's health to say so",
        Duration::from_secs(10),
        || async { (health.broker() == BrokerState::StorageFull).then_some(()) },
    )
    .await;
    assert_eq!(stream.published().await.len(), 5);
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (5, 0), "{stats:?}");

    full.max_messages = -1;
    stream.jetstream.update_stream(&full).await.unwrap();
    eventually("every event published", Duration::from_secs(20), || async {
        (outbox::stats(&pool).await.ok()?.pending == 0).then_some(())
    })
    .await;
    assert_eq!(stream.published().await.len(), 10);
    assert_eq!(outbox::stats(&pool).await.unwrap().dead, 0);
    eventually("the gauge back to 0", Duration::from_secs(10), || async {
        (metric("outbox_broker_storage_full")? < 0.5).then_some(())
    })
    .await;
    assert_eq!(health.broker(), BrokerState::Ok);
    stop.cancel();
    running.await.unwrap();
    stream.delete().await;
}

/// The relay's role may not delete from the outbox (a grant forgotten in an upgrade), so
/// recording a pass fails after its publishes. The outcome is recorded again after growing
/// pauses, each failure counted, and nothing is published again meanwhile; once the grant is
/// made, every event is recorded published, none dead.
#[sqlx::test(migrations = false)]
async fn a_record_that_fails_backs_off_without_publishing_again(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let _alone = ONE_AT_A_TIME.lock().await;
    metric("outbox_record_failures_total");
    let pool = options.connect_with(connect.clone()).await.unwrap();
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let role = format!("relay_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN;
         GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT, INSERT, UPDATE ON outbox TO {role};
         GRANT SELECT, INSERT ON outbox_published TO {role};"
    )))
    .execute(&pool)
    .await
    .unwrap();
    for order in 0..10 {
        enqueue(&pool, &format!("o{order}"), "OrderPlaced", json!({})).await;
    }
    let relay_pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(connect.username(&role))
        .await
        .unwrap();
    let publisher = FaultyPublisher::new(stream.publisher());
    let asked = publisher.asked();
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = Relay::new(relay_pool.clone(), publisher, stream.relay_config());
    let running = tokio::spawn(relay.run(stop.clone()));

    // Three failures in a row take at least 0.1 + 0.2 + 0.4 s of pauses.
    eventually("three failed records", Duration::from_secs(20), || async {
        (metric("outbox_record_failures_total")? >= 3.0).then_some(())
    })
    .await;
    assert_eq!(asked.lock().unwrap().len(), 10, "each event published once");
    assert_eq!(stream.published().await.len(), 10);
    assert_eq!(outbox::stats(&pool).await.unwrap().pending, 10);

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT DELETE ON outbox TO {role}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    eventually("every event recorded", Duration::from_secs(90), || async {
        (count(&pool, "outbox_published").await == 10).then_some(())
    })
    .await;
    let stats = outbox::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0), "{stats:?}");
    assert_eq!(asked.lock().unwrap().len(), 10, "nothing published again");
    stop.cancel();
    running.await.unwrap();
    relay_pool.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(&pool)
    .await
    .unwrap();
    stream.delete().await;
}

/// The stream of `stream` with a duplicate window of one second, so that a scenario can wait
/// it out; the broker's own default is two minutes, which an outage also outlasts.
async fn with_short_window(stream: &TestStream) -> Duration {
    let window = Duration::from_secs(1);
    let mut config = stream.stream().await.cached_info().config.clone();
    config.duplicate_window = window;
    stream.jetstream.update_stream(&config).await.unwrap();
    window
}

/// An event whose acknowledgement was lost (the broker stored it) and which is published again
/// only after the broker's duplicate window: the relay finds it in the stream and records it
/// published where the broker stored it, instead of storing a second copy. An earlier event of
/// the same subject, published before, is not taken for it.
#[sqlx::test(migrations = false)]
async fn an_unacknowledged_event_retried_past_the_window_is_not_stored_twice(pool: PgPool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let window = with_short_window(&stream).await;
    enqueue(&pool, "o1", "OrderPlaced", json!({"n": 1})).await;
    let plain = Relay::new(pool.clone(), stream.publisher(), stream.relay_config());
    assert_eq!(plain.run_once().await.unwrap().published, 1);

    enqueue(&pool, "o1", "OrderPlaced", json!({"n": 2})).await;
    let lossy = FaultyPublisher::new(stream.publisher()).with_faults([Fault::After]);
    let relay = Relay::new(pool.clone(), lossy, stream.relay_config());
    assert_eq!(relay.run_once().await.unwrap().failed, 1);
    assert_eq!(stream.published().await.len(), 2, "stored, unacknowledged");
    // The broker's window is a time: the scenario waits it out.
    tokio::time::sleep(window * 2).await;

    assert_eq!(relay.run_once().await.unwrap().published, 1);
    assert_eq!(stream.published().await.len(), 2, "no second copy");
    let stream_seqs: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT stream_seq FROM outbox_published ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stream_seqs, [Some(1), Some(2)]);
    stream.delete().await;
}

/// The same, but the stream does not hold the event (an operator removed it, as a broker that
/// never stored an unacknowledged message would have, and its window passed): it is published
/// again.
#[sqlx::test(migrations = false)]
async fn an_unacknowledged_event_the_stream_lacks_is_published_again(pool: PgPool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let window = with_short_window(&stream).await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;
    let lossy = FaultyPublisher::new(stream.publisher()).with_faults([Fault::After]);
    let relay = Relay::new(pool.clone(), lossy, stream.relay_config());
    assert_eq!(relay.run_once().await.unwrap().failed, 1);
    let maybe: bool = sqlx::query_scalar("SELECT maybe_published FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(maybe, "the lost acknowledgement is remembered");
    stream.stream().await.delete_message(1).await.unwrap();
    // Within the window the broker would answer a copy as a duplicate of what it removed.
    tokio::time::sleep(window * 2).await;

    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let published = stream.published().await;
    assert_eq!(published.len(), 1, "{published:?}");
    let stream_seq: Option<i64> = sqlx::query_scalar("SELECT stream_seq FROM outbox_published")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stream_seq, Some(2));
    stream.delete().await;
}
