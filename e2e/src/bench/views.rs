//! What the operator views cost as the outbox grows: `GET /outbox/stats`, `/metrics` and `/ops`
//! of an orders-service whose relay is off, with a few pending events and with a backlog.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use service_kit::testing;
use sqlx::PgPool;

use super::http::{env, log_dir};
use crate::Names;
use crate::process::{Kind, Service};

/// Median time of each view, in milliseconds, with `pending` events waiting.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Views {
    /// Pending events in the outbox.
    pub pending: i64,
    /// `GET /outbox/stats`.
    pub stats_ms: f64,
    /// `GET /metrics` (its gauges are computed at most once a second, so requests 1 s apart).
    pub metrics_ms: f64,
    /// `GET /ops` (the page; its script then polls the stats).
    pub ops_ms: f64,
}

/// Fills a fresh outbox with `pending` events and times each view 11 times.
pub async fn views(pending: i64) -> anyhow::Result<Views> {
    let names = Names::unique();
    let mut env = env(&names, &names.orders_db, &testing::nats_url());
    // No relay, so that the backlog stays pending while the views are timed: what an
    // operator sees during a broker outage.
    env.push(("RELAY_ENABLED".into(), "false".into()));
    let mut orders = Service::start(Kind::Orders, env, &log_dir()).await;
    let db = PgPool::connect(&testing::database_url(&names.orders_db)).await?;
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
         SELECT gen_random_uuid(), 'order', 'o' || i, 'OrderPlaced', '{}'
         FROM generate_series(1, $1) AS i",
    )
    .bind(pending)
    .execute(&db)
    .await?;
    // As autovacuum would have by the time anyone looks.
    sqlx::query("VACUUM ANALYZE outbox").execute(&db).await?;
    db.close().await;

    let client = reqwest::Client::new();
    let median = |path: &'static str, pause: Duration| {
        let (client, url) = (client.clone(), format!("{}{path}", orders.url));
        async move {
            let mut times = Vec::new();
            for _ in 0..11 {
                tokio::time::sleep(pause).await;
                let start = Instant::now();
                let response = client.get(&url).send().await?.error_for_status()?;
                response.bytes().await?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            times.sort_by(f64::total_cmp);
            anyhow::Ok(times[times.len() / 2])
        }
    };
    let views = Views {
        pending,
        stats_ms: median("/outbox/stats", Duration::ZERO).await?,
        metrics_ms: median("/metrics", service_kit::metrics::GAUGE_INTERVAL).await?,
        ops_ms: median("/ops", Duration::ZERO).await?,
    };
    orders.terminate().await;
    names.clean_up().await;
    Ok(views)
}
