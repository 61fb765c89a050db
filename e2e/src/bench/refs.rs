//! The machine's references: what the broker and the database do with nothing of ours around.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use service_kit::testing;

/// Acks awaited together, as `JetStreamPublisher` does by default.
const WINDOW: usize = 4096;

/// A payload the size of an `OrderPlaced` event.
pub(crate) fn sample_payload(i: usize) -> Bytes {
    Bytes::from(format!(
        r#"{{"orderId":"0193a0c4-7d1e-7c3b-9f1a-{i:012}","customer":"bench","totalMinor":1999,"status":"placed"}}"#
    ))
}

/// A file-backed stream capturing `{prefix}.>`, as the services create it.
pub(crate) async fn create_stream(
    js: &jetstream::Context,
    name: &str,
    prefix: &str,
) -> anyhow::Result<()> {
    let spec = jetstream_outbox::publisher::StreamSpec::new(name, vec![format!("{prefix}.>")]);
    jetstream_outbox::publisher::ensure_stream(js, &spec).await?;
    Ok(())
}

/// Publishes `messages` with a unique `Nats-Msg-Id` each, awaiting PubAcks in windows, and
/// returns messages per second.
pub async fn raw_publish(messages: usize) -> anyhow::Result<f64> {
    raw_publish_at(messages, &testing::nats_url()).await
}

/// [`raw_publish`] to the nats-server at `url`.
pub async fn raw_publish_at(messages: usize, url: &str) -> anyhow::Result<f64> {
    let stream = testing::unique("BENCH_RAW");
    let prefix = stream.to_lowercase();
    let js = jetstream::new(async_nats::connect(url).await?);
    create_stream(&js, &stream, &prefix).await?;

    let start = Instant::now();
    publish_all(
        &js,
        (0..messages).map(|i| {
            let mut headers = HeaderMap::new();
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                uuid::Uuid::now_v7().to_string().as_str(),
            );
            let subject = format!("{prefix}.OrderPlaced.o{}", i % 10_000);
            (subject, headers, sample_payload(i))
        }),
    )
    .await?;
    let rate = messages as f64 / start.elapsed().as_secs_f64();

    let stored = js.get_stream(&stream).await?.info().await?.state.messages;
    js.delete_stream(&stream).await?;
    anyhow::ensure!(
        stored == messages as u64,
        "the stream holds {stored} of {messages} messages"
    );
    Ok(rate)
}

/// Publishes every (subject, headers, body) of `messages`, pipelined: PubAcks are awaited in
/// windows, as `JetStreamPublisher` does.
pub(crate) async fn publish_all(
    js: &jetstream::Context,
    messages: impl ExactSizeIterator<Item = (String, HeaderMap, Bytes)>,
) -> anyhow::Result<()> {
    let total = messages.len();
    let mut acks = Vec::with_capacity(WINDOW);
    for (i, (subject, headers, body)) in messages.enumerate() {
        acks.push(js.publish_with_headers(subject, headers, body).await?);
        if acks.len() == WINDOW || i + 1 == total {
            for ack in futures::future::join_all(acks.drain(..).map(IntoFuture::into_future)).await
            {
                ack?;
            }
        }
    }
    Ok(())
}

/// What the database can do: the two inserts of `POST /orders` (an order row and an outbox row,
/// no advisory lock, no notification) in one transaction, from `clients` tasks on a pool of as
/// many connections, for `length`; transactions per second.
pub async fn plain_transaction(clients: usize, length: Duration) -> anyhow::Result<f64> {
    with_orders_database(
        clients,
        |pool| pool,
        |pool| async move {
            let mut tx = pool.begin().await?;
            let id = uuid::Uuid::now_v7();
            sqlx::query(
                "INSERT INTO orders (id, customer, total_minor) VALUES ($1, 'bench', 1999)",
            )
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, 'order', $2, 'OrderPlaced', $3)",
            )
            .bind(id)
            .bind(id.to_string())
            .bind(serde_json::json!({"orderId": id, "customer": "bench", "totalMinor": 1999}))
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        },
        length,
    )
    .await
}

/// The transaction of `POST /orders` as orders-service runs it (the order row and its event in
/// one statement, on a connection handed from one order to the next), with the clients, pool
/// and length of [`plain_transaction`].
pub async fn order_transaction(clients: usize, length: Duration) -> anyhow::Result<f64> {
    with_orders_database(
        clients,
        |pool| service_kit::reuse::Connections::new(pool, clients as u32),
        |connections| async move {
            let wakeup = jetstream_outbox::Wakeup::in_process();
            let order = orders_service::orders::NewOrder {
                id: None,
                customer: "bench".into(),
                total_minor: 1999,
            }
            .validate()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let mut conn = connections.acquire().await?;
            orders_service::orders::place(&mut conn, &wakeup, order, None)
                .await
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            conn.hand_back();
            Ok(())
        },
        length,
    )
    .await
}

/// Runs `transaction` from `clients` tasks for `length`, each given what `connect` makes of a
/// pool of as many connections to a fresh orders database; returns transactions per second.
async fn with_orders_database<C, F, Fut>(
    clients: usize,
    connect: impl FnOnce(sqlx::PgPool) -> C,
    transaction: F,
    length: Duration,
) -> anyhow::Result<f64>
where
    C: Clone + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let database = testing::unique("bench_tx");
    let pool =
        service_kit::infra::connect_db(&testing::database_url(&database), clients as u32).await?;
    orders_service::startup::migrate(&pool).await?;
    let connections = connect(pool.clone());

    let start = Instant::now();
    let deadline = start + length;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (connections, transaction) = (connections.clone(), transaction.clone());
            tokio::spawn(async move {
                let mut done = 0_u64;
                while Instant::now() < deadline {
                    transaction(connections.clone()).await?;
                    done += 1;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await??;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    drop(connections);
    pool.close().await;
    testing::drop_database(&database).await;
    Ok(rate)
}
