//! End-to-end throughput as the deployment scales out: one or two instances of each service,
//! against one nats-server or a 3-node JetStream cluster holding the stream with 3 replicas.

use std::time::Duration;

use jetstream_outbox::testing::slot_streamed_by;
use serde::{Deserialize, Serialize};
use service_kit::testing;
use sqlx::PgPool;

use super::http::{all_invoiced, env, hammer, log_dir};
use super::wal::Wake;
use crate::Names;
use crate::process::{Kind, NatsServer, Service};

/// One deployment's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Scale {
    /// orders-service instances, each with its relay (and as many billing-service instances).
    pub replicas: usize,
    /// nats-server nodes (and stream replicas).
    pub nats_nodes: usize,
    /// `POST /orders` accepted per second at maximum rate.
    pub accepted_per_sec: f64,
    /// Invoices per second, from the first order's commit to the last invoice's.
    pub invoiced_per_sec: f64,
}

/// Runs `replicas` of each service against `nats_nodes` (1 or 3) servers, the relays woken as
/// `wake` says, `POST`s from `connections` clients for `length`, and waits until every
/// accepted order is invoiced.
pub async fn scale(
    replicas: usize,
    nats_nodes: usize,
    connections: usize,
    length: Duration,
    wake: Wake,
) -> anyhow::Result<Scale> {
    let names = Names::unique();
    let logs = log_dir();
    let cluster = if nats_nodes > 1 {
        NatsServer::start_cluster(&logs, nats_nodes).await
    } else {
        Vec::new()
    };
    let nats_url = if cluster.is_empty() {
        testing::nats_url()
    } else {
        let urls: Vec<String> = cluster.iter().map(NatsServer::url).collect();
        urls.join(",")
    };
    let with_replicas = |mut env: Vec<(String, String)>| {
        env.push(("NATS_STREAM_REPLICAS".into(), nats_nodes.to_string()));
        env
    };
    // One slot for all the instances, as deployed: one of them streams it. Declared before
    // the services, so that on an error it is dropped after they end.
    let (wake_env, slot) = wake.orders_env(&names.orders_db);
    let mut services = Vec::new();
    // orders-service first: it makes the stream, which billing waits for.
    let mut urls = Vec::new();
    for _ in 0..replicas {
        let mut env = with_replicas(env(&names, &names.orders_db, &nats_url));
        env.extend(wake_env.iter().cloned());
        let orders = Service::start(Kind::Orders, env, &logs).await;
        urls.push(orders.url.clone());
        services.push(orders);
    }
    for _ in 0..replicas {
        let env = env(&names, &names.billing_db, &nats_url);
        services.push(Service::start(Kind::Billing, env, &logs).await);
    }

    let orders_db = PgPool::connect(&testing::database_url(&names.orders_db)).await?;
    if let Some(slot) = &slot {
        // The service streams its slot only once it is ready.
        slot_streamed_by(&orders_db, slot.name()).await;
    }
    let accepted_per_sec = hammer(&urls, connections, length).await?;
    let billing_db = PgPool::connect(&testing::database_url(&names.billing_db)).await?;
    let invoiced_per_sec = invoiced_per_sec(&orders_db, &billing_db).await?;

    orders_db.close().await;
    billing_db.close().await;
    for service in &mut services {
        service.terminate().await;
    }
    drop(slot);
    names.clean_up().await;
    Ok(Scale {
        replicas,
        nats_nodes,
        accepted_per_sec,
        invoiced_per_sec,
    })
}

/// Waits (up to 2 minutes) until every order has its invoice; returns invoices per second
/// from the first order's commit to the last invoice's.
async fn invoiced_per_sec(orders_db: &PgPool, billing_db: &PgPool) -> anyhow::Result<f64> {
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(orders_db)
        .await?;
    all_invoiced(billing_db, orders as u64, Duration::from_secs(120)).await?;
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT min(created_at) FROM outbox_events")
            .fetch_one(orders_db)
            .await?;
    let last: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT max(created_at) FROM invoices")
            .fetch_one(billing_db)
            .await?;
    let span = (last - first).num_microseconds().unwrap_or(1).max(1) as f64 / 1e6;
    Ok(orders as f64 / span)
}
