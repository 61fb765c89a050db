//! Billing's drain: `OrderPlaced` messages already on the stream, applied by one
//! billing-service with its default settings (the messages waiting in one transaction), and the
//! same with `CONSUMER_APPLY_BATCH=1` (a transaction per message).

use std::time::Duration;

use async_nats::HeaderMap;
use chrono::{DateTime, Utc};
use jetstream_outbox::headers;
use service_kit::testing;
use sqlx::PgPool;

use super::http::{all_invoiced, env, log_dir};
use crate::Names;
use crate::process::{Kind, Service};

/// Publishes `messages` orders' `OrderPlaced`, starts billing-service (with
/// `CONSUMER_APPLY_BATCH` set to `apply_batch` when given) and returns invoices per second, from
/// its first inbox transaction to its last invoice.
pub async fn drain(messages: usize, apply_batch: Option<usize>) -> anyhow::Result<f64> {
    let names = Names::unique();
    let js = async_nats::jetstream::new(async_nats::connect(testing::nats_url()).await?);
    super::refs::create_stream(&js, &names.stream, &names.prefix).await?;
    let prefix = names.prefix.clone();
    super::refs::publish_all(
        &js,
        (0..messages).map(|i| {
            let id = uuid::Uuid::now_v7().to_string();
            let mut headers = HeaderMap::new();
            headers.insert(headers::SPECVERSION, "1.0");
            headers.insert(headers::ID, id.as_str());
            headers.insert(headers::TYPE, "OrderPlaced");
            headers.insert(headers::SUBJECT, format!("b{i}").as_str());
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let subject = format!("{prefix}.OrderPlaced.b{i}");
            let body = format!(
                r#"{{"orderId":"b{i}","customer":"bench","totalMinor":1999,"status":"placed"}}"#
            );
            (subject, headers, body.into())
        }),
    )
    .await?;

    let mut env = env(&names, &names.billing_db, &testing::nats_url());
    // The reference the batched default is compared with: one transaction per message.
    if let Some(batch) = apply_batch {
        env.push(("CONSUMER_APPLY_BATCH".into(), batch.to_string()));
    }
    let mut billing = Service::start(Kind::Billing, env, &log_dir()).await;
    let db = PgPool::connect(&testing::database_url(&names.billing_db)).await?;
    all_invoiced(&db, messages as u64, Duration::from_secs(600)).await?;
    let (first, last): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT (SELECT min(received_at) FROM inbox_entries), (SELECT max(created_at) FROM invoices)",
    )
    .fetch_one(&db)
    .await?;
    db.close().await;
    billing.terminate().await;
    names.clean_up().await;
    let span = (last - first).num_microseconds().unwrap_or(1).max(1) as f64 / 1e6;
    Ok(messages as f64 / span)
}
