//! billing-service when what is around it fails or misbehaves: its database down long enough
//! for well over `CONSUMER_MAX_RETRIES` deliveries of a waiting message, and a body larger than
//! billing reads, on a nats-server that carries it.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Context};
use e2e::process::NatsServer;
use e2e::proxy::Proxy;
use e2e::{Names, RunningApp, eventually};
use jetstream_outbox::headers;
use serde_json::json;
use service_kit::testing;
use sqlx::{ConnectOptions as _, PgPool};

const WAIT: Duration = Duration::from_secs(30);

/// Publishes an order event as the relay would.
async fn publish(
    jetstream: &Context,
    prefix: &str,
    event_type: &str,
    order_id: &str,
    body: Vec<u8>,
) {
    let id = uuid::Uuid::now_v7().to_string();
    let mut headers = HeaderMap::new();
    headers.insert(headers::SPECVERSION, "1.0");
    headers.insert(headers::ID, id.as_str());
    headers.insert(headers::TYPE, event_type);
    headers.insert(headers::SUBJECT, order_id);
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    let subject = format!("{prefix}.{event_type}.{order_id}");
    let ack = jetstream
        .publish_with_headers(subject, headers, body.into())
        .await
        .unwrap();
    ack.await.unwrap();
}

fn order(order_id: &str, total_minor: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"orderId": order_id, "customer": "ada", "totalMinor": total_minor}))
        .unwrap()
}

async fn invoice(pool: &PgPool, order_id: &str) -> Option<(i64, String)> {
    sqlx::query_as("SELECT total_minor, status FROM invoices WHERE order_id = $1")
        .bind(order_id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// Deliveries of the durable consumer so far (each redelivery counts).
async fn deliveries(jetstream: &Context, stream: &str, consumer: &str) -> Option<u64> {
    let stream = jetstream.get_stream(stream).await.ok()?;
    let info = stream.consumer_info(consumer).await.ok()?;
    Some(info.delivered.consumer_sequence)
}

/// Billing's database is down (every connection closed, new ones closed at once) while an
/// `OrderPaid` waits for its `OrderPlaced`: the message is delivered well over
/// `CONSUMER_MAX_RETRIES` (default 100) times, each a transient failure. Once the database is
/// back it is still "not yet" a few times, and then applied when its `OrderPlaced` comes: none
/// of the outage's deliveries brought it closer to a dead letter.
#[tokio::test]
async fn deliveries_during_a_database_outage_never_make_a_message_dead() {
    let names = Names::unique();
    let server = testing::server_options();
    let proxy = Proxy::start(server.get_port()).await;
    let mut config = names.billing_config();
    config.common.database_url = server
        .port(proxy.port)
        .database(&names.billing_db)
        .to_url_lossy()
        .to_string()
        .into();
    // Deliveries are what count here, not their pace: at the default 1 s between them the
    // outage would have to last over 150 s.
    config.consumer.retry_delay = Duration::from_millis(20);
    let max_retries = config.consumer.max_retries;
    let consumer = config.consumer.name.clone();
    let billing = RunningApp::billing(config).await;
    let jetstream = jetstream::new(async_nats::connect(testing::nats_url()).await.unwrap());

    proxy.set_down(true);
    publish(
        &jetstream,
        &names.prefix,
        "OrderPaid",
        "o1",
        order("o1", 500),
    )
    .await;
    let outage = (max_retries + 50) as u64;
    eventually(
        "150 deliveries while the database is down",
        Duration::from_secs(60),
        || async {
            let seen = deliveries(&jetstream, &names.stream, &consumer).await?;
            (seen >= outage).then_some(())
        },
    )
    .await;
    proxy.set_down(false);
    let back = deliveries(&jetstream, &names.stream, &consumer)
        .await
        .unwrap();
    eventually("not-yet outcomes after the outage", WAIT, || async {
        let seen = deliveries(&jetstream, &names.stream, &consumer).await?;
        (seen >= back + 3).then_some(())
    })
    .await;

    publish(
        &jetstream,
        &names.prefix,
        "OrderPlaced",
        "o1",
        order("o1", 500),
    )
    .await;
    let paid = eventually("o1's invoice paid", WAIT, || async {
        invoice(&billing.pool, "o1")
            .await
            .filter(|(_, status)| status == "paid")
    })
    .await;
    assert_eq!(paid.0, 500);
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_dead")
        .fetch_one(&billing.pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "no dead letter");
    billing.stop().await;
    names.clean_up().await;
}

/// A body of 1 MiB + 1, on a nats-server whose `max_payload` lets it through, is dead-lettered
/// unread (kept whole) and the next order is invoiced.
#[tokio::test]
async fn a_body_over_one_mebibyte_is_dead_lettered_unread() {
    let dir = std::env::temp_dir().join(testing::unique("e2e-payload"));
    let nats = NatsServer::start_with_max_payload(&dir, 4 * 1024 * 1024).await;
    let names = Names::unique();
    let mut config = names.billing_config();
    config.common.nats_url = nats.url().into();
    let billing = RunningApp::billing(config).await;
    let jetstream = jetstream::new(async_nats::connect(nats.url()).await.unwrap());

    let mut huge = order("o-huge", 100);
    huge.resize(1024 * 1024 + 1, b' ');
    publish(
        &jetstream,
        &names.prefix,
        "OrderPlaced",
        "o-huge",
        huge.clone(),
    )
    .await;
    publish(
        &jetstream,
        &names.prefix,
        "OrderPlaced",
        "o-next",
        order("o-next", 200),
    )
    .await;

    eventually("the next order's invoice", WAIT, || async {
        invoice(&billing.pool, "o-next").await
    })
    .await;
    let (error, payload): (String, Vec<u8>) = eventually("the dead letter", WAIT, || async {
        sqlx::query_as("SELECT error, payload FROM inbox_dead")
            .fetch_optional(&billing.pool)
            .await
            .unwrap()
    })
    .await;
    assert!(error.contains("over 1 MiB"), "{error}");
    assert!(payload == huge, "kept byte for byte");
    assert_eq!(invoice(&billing.pool, "o-huge").await, None);
    billing.stop().await;
    testing::drop_database(&names.billing_db).await;
    drop(nats);
    std::fs::remove_dir_all(&dir).ok();
}
