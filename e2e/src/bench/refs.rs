//! The machine's references: what the broker and the database do with nothing of ours around.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use orders_service::orders::{self, NewOrder};
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
    let spec = outbox_core::publisher::StreamSpec {
        name: name.to_owned(),
        subjects: vec![format!("{prefix}.>")],
        duplicate_window: Duration::from_secs(120),
        replicas: 1,
    };
    outbox_core::publisher::ensure_stream(js, &spec).await?;
    Ok(())
}

/// Publishes `messages` with a unique `Nats-Msg-Id` each, awaiting PubAcks in windows, and
/// returns messages per second.
pub async fn raw_publish(messages: usize) -> anyhow::Result<f64> {
    let stream = testing::unique("BENCH_RAW");
    let prefix = stream.to_lowercase();
    let js = jetstream::new(async_nats::connect(testing::nats_url()).await?);
    create_stream(&js, &stream, &prefix).await?;

    let start = Instant::now();
    let mut acks = Vec::with_capacity(WINDOW);
    for i in 0..messages {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
        let subject = format!("{prefix}.OrderPlaced.o{}", i % 10_000);
        acks.push(
            js.publish_with_headers(subject, headers, sample_payload(i))
                .await?,
        );
        if acks.len() == WINDOW || i + 1 == messages {
            for ack in futures::future::join_all(acks.drain(..).map(IntoFuture::into_future)).await
            {
                ack?;
            }
        }
    }
    let rate = messages as f64 / start.elapsed().as_secs_f64();

    let stored = js.get_stream(&stream).await?.info().await?.state.messages;
    js.delete_stream(&stream).await?;
    anyhow::ensure!(
        stored == messages as u64,
        "the stream holds {stored} of {messages} messages"
    );
    Ok(rate)
}

/// Runs the transaction of `POST /orders` (the order row and its outbox event) directly through
/// sqlx from `clients` tasks for `length`, on a pool the size of the service's default, and
/// returns transactions per second.
pub async fn direct_sqlx(clients: usize, length: Duration) -> anyhow::Result<f64> {
    let database = testing::unique("bench_sqlx");
    let pool = service_kit::infra::connect_db(&testing::database_url(&database), 10).await?;
    orders_service::startup::migrate(&pool).await?;

    let start = Instant::now();
    let deadline = start + length;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut done = 0_u64;
                while Instant::now() < deadline {
                    let order = NewOrder {
                        id: None,
                        customer: "bench".into(),
                        total_minor: 1999,
                    }
                    .validate()
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    orders::place(&pool, order, None)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
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
    pool.close().await;
    testing::drop_database(&database).await;
    Ok(rate)
}
