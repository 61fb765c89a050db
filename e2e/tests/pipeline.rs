//! The whole pipeline under broker faults (the relay wraps the real JetStream publisher with
//! injected failures, billing consumes for real), and a relay cut off from its database.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::ContextBuilder;
use e2e::proxy::Proxy;
use e2e::{Names, RunningApp, eventually};
use jetstream_outbox::testing::{Fault, FaultyPublisher};
use jetstream_outbox::{Ack, Backoff, JetStreamPublisher, Message, PublishError, Publisher, Relay};
use orders_service::orders::{self, NewOrder};
use service_kit::testing;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::Notify;

/// Twenty orders with totals 1000..=20000. The broker is unreachable for the first three
/// publishes, and four PubAcks are lost after the broker stored the message. The relay drains
/// everything; billing ends with exactly 20 invoices summing 210000, and nothing is pending.
#[tokio::test]
async fn twenty_orders_survive_broker_faults_and_lost_acks() {
    let names = Names::unique();
    // Billing first: the stream made for it, it creates its durable consumer.
    let billing = RunningApp::billing(names.billing_config()).await;
    e2e::checker::log_applications(&billing.pool).await;
    let config = names.orders_config();
    let pool = twenty_orders(&config).await;

    let nats = async_nats::connect(testing::nats_url()).await.unwrap();
    let jetstream = ContextBuilder::new()
        .timeout(Duration::from_secs(5))
        .build(nats);
    let faults = [Fault::Before; 3].into_iter().chain([Fault::After; 4]);
    let publisher =
        FaultyPublisher::new(JetStreamPublisher::new(jetstream.clone())).with_faults(faults);
    let mut relay_config = config.relay.clone();
    // The refusals' pauses are shortened (the default's first is 100 ms): the faults are under
    // test, not the pauses; the lost acknowledgements keep the default's.
    relay_config.backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(5));
    let relay = Relay::new(pool.clone(), publisher, relay_config);

    let failed = &Cell::new(0);
    let (relay, pool_ref) = (&relay, &pool);
    eventually(
        "the outbox to drain",
        Duration::from_secs(20),
        || async move {
            failed.set(failed.get() + relay.run_once().await.unwrap().failed);
            let stats = jetstream_outbox::outbox::stats(pool_ref).await.unwrap();
            (stats.pending == 0).then_some(())
        },
    )
    .await;
    assert_eq!(failed.get(), 7, "every injected fault was met");
    assert_eq!(
        jetstream_outbox::outbox::stats(&pool).await.unwrap().dead,
        0
    );

    // The relay found the four stored messages rather than send them again.
    let stream_messages = stream_messages(&jetstream, &names.stream).await;
    assert_eq!(stream_messages, 20);

    let (count, sum) = eventually("20 invoices", Duration::from_secs(20), || async {
        let row: (i64, Option<i64>) =
            sqlx::query_as("SELECT count(*), sum(total_minor)::bigint FROM invoices")
                .fetch_one(&billing.pool)
                .await
                .unwrap();
        (row.0 >= 20).then_some(row)
    })
    .await;
    assert_eq!((count, sum), (20, Some(210_000)));
    // The re-sent copies beyond the broker's reach were dropped by the inbox alone.
    let twice = e2e::checker::applied_twice(&billing.pool).await;
    assert!(twice.is_empty(), "applied more than once: {twice:?}");

    pool.close().await;
    billing.stop().await;
    names.clean_up().await;
}

/// A relay cut off from PostgreSQL in the middle of a pass, its rows claimed and its
/// connection silent but open (a dead network path): PostgreSQL ends its session after the
/// relay's lease, so another relay publishes those rows; nothing waits for the lost relay.
/// Without the lease the rows would stay locked for as long as the connection looks alive.
#[tokio::test]
async fn a_relay_cut_off_from_its_database_lets_its_rows_go() {
    let names = Names::unique();
    let config = names.orders_config();
    let pool = twenty_orders(&config).await;
    let nats = async_nats::connect(testing::nats_url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(nats);
    let spec = jetstream_outbox::publisher::StreamSpec::new(
        &names.stream,
        vec![format!("{}.>", names.prefix)],
    );
    service_kit::infra::ensure_stream(&jetstream, &spec, &service_kit::infra::Refusals::default())
        .await
        .unwrap();

    // Relay A reaches the database through a proxy, and its first publish waits for the test.
    let options: PgConnectOptions = config.common.database_url().parse().unwrap();
    let proxy = Proxy::start(options.get_port()).await;
    let pool_a = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.host("127.0.0.1").port(proxy.port))
        .await
        .unwrap();
    let mut relay_config = config.relay.clone();
    // The mechanism is under test, not the default's 30 s: a shorter lease, a shorter test.
    relay_config.lease = Duration::from_secs(3);
    // The lease must outlast a wave: four times the publish timeout.
    let gate = Gate::new(
        JetStreamPublisher::new(jetstream.clone()).with_timeout(Duration::from_millis(500)),
    );
    let (arrived, release, published_by_a) = (
        gate.arrived.clone(),
        gate.release.clone(),
        gate.published.clone(),
    );
    let relay_a = Relay::new(pool_a, gate, relay_config.clone());
    let pass_a = tokio::spawn(async move { relay_a.run_once().await });
    // Relay A has its claim, and holds it while publishing.
    tokio::time::timeout(Duration::from_secs(10), arrived.notified())
        .await
        .expect("relay A claimed and began to publish");
    proxy.cut();
    // Relay A publishes (the broker is reachable) and cannot record it.
    release.notify_one();

    let relay_b = Relay::new(
        pool.clone(),
        JetStreamPublisher::new(jetstream.clone()),
        relay_config,
    );
    let (relay_b, pool_ref) = (&relay_b, &pool);
    eventually(
        "relay B to publish the rows",
        Duration::from_secs(30),
        || async move {
            relay_b.run_once().await.unwrap();
            let stats = jetstream_outbox::outbox::stats(pool_ref).await.unwrap();
            (stats.pending == 0).then_some(())
        },
    )
    .await;
    assert!(!pass_a.is_finished(), "relay A is still cut off, unaware");
    eventually("relay A's publishes", Duration::from_secs(10), || async {
        (published_by_a.load(std::sync::atomic::Ordering::SeqCst) == 20).then_some(())
    })
    .await;
    // One more message on relay A's connection: once it is acknowledged, the broker has
    // handled every copy relay A sent before it, acknowledged in time or not.
    jetstream
        .publish(format!("{}.marker", names.prefix), "marker".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stream_messages = stream_messages(&jetstream, &names.stream).await;
    assert_eq!(
        stream_messages, 21,
        "relay A's copies were dropped by the broker"
    );

    pass_a.abort();
    drop(proxy);
    pool.close().await;
    names.clean_up().await;
}

/// A publisher whose first call says it arrived, then waits until released; it counts the
/// messages it sent to the broker (acknowledged, or sent and not acknowledged in time).
struct Gate<P> {
    inner: P,
    first: std::sync::atomic::AtomicBool,
    arrived: Arc<Notify>,
    release: Arc<Notify>,
    published: Arc<std::sync::atomic::AtomicUsize>,
}

impl<P> Gate<P> {
    fn new(inner: P) -> Self {
        Self {
            inner,
            first: true.into(),
            arrived: Arc::default(),
            release: Arc::default(),
            published: Arc::default(),
        }
    }
}

impl<P: Publisher> Publisher for Gate<P> {
    async fn publish(&self, messages: Vec<Message>) -> Vec<Result<Ack, PublishError>> {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.arrived.notify_one();
            self.release.notified().await;
        }
        // A message whose PubAck came after the short publish timeout (a loaded machine) was
        // sent all the same; one the broker never got was not.
        let results = self.inner.publish(messages).await;
        let sent = results
            .iter()
            .filter(|result| matches!(result, Ok(_) | Err(PublishError::NoAck(_))))
            .count();
        self.published
            .fetch_add(sent, std::sync::atomic::Ordering::SeqCst);
        results
    }
}

/// The orders database of `config`, migrated, with twenty orders placed (totals 1000..=20000).
async fn twenty_orders(config: &orders_service::Config) -> sqlx::PgPool {
    let pool = service_kit::infra::connect_db(config.common.database_url(), 5)
        .await
        .unwrap();
    orders_service::startup::migrate(&pool).await.unwrap();
    for i in 1..=20 {
        let order = NewOrder {
            id: Some(format!("o{i}")),
            customer: "ada".into(),
            total_minor: i * 1000,
        };
        orders::place(
            &mut pool.acquire().await.unwrap(),
            &jetstream_outbox::Wakeup::in_process(),
            order.validate().unwrap(),
            None,
        )
        .await
        .unwrap();
    }
    pool
}

/// How many messages `stream` holds.
async fn stream_messages(jetstream: &async_nats::jetstream::Context, stream: &str) -> u64 {
    let mut stream = jetstream.get_stream(stream).await.unwrap();
    stream.info().await.unwrap().state.messages
}
