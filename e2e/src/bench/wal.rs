//! The relay polling alone against the relay also woken from a replication slot
//! (`RELAY_WAL_SLOT`), side by side in one run, each measurement in both modes one after the
//! other: the drain, `POST /orders` and the whole pipeline at maximum rate, the steady
//! phase with its CPU time and WAL
//! per order, and the commits another application makes with SQL `outbox_enqueue`, which only
//! the slot tells a relay of. Skipped unless the server's `wal_level` is `logical` and the
//! role has `REPLICATION`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use jetstream_outbox::testing::{SlotGuard, slot_streamed_by};
use serde::{Deserialize, Serialize};
use service_kit::testing;
use sqlx::PgPool;

use super::http::{self, Latency, Steady};
use super::{Options, drain, filled, progress, refs, scale};
use crate::Names;
use crate::process::{Kind, Service};

/// How a relay learns of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Its own process's commits wake it and other instances' NOTIFY; any other commit waits
    /// for its next poll.
    Poll,
    /// Also every commit that enqueued events, read from a replication slot.
    Wal,
}

impl Wake {
    /// Both, in the order each measurement runs them.
    const BOTH: [Self; 2] = [Self::Poll, Self::Wal];

    /// orders-service's settings for this mode on `database`, and the guard of the slot they
    /// name: drop it after the service has ended and before the database.
    pub(super) fn orders_env(self, database: &str) -> (Vec<(String, String)>, Option<SlotGuard>) {
        match self {
            Self::Poll => (Vec::new(), None),
            // The setting the phase measures against its default, unset; a slot of the
            // phase's own, since slot names are the server's.
            Self::Wal => {
                let slot = testing::unique("bench_wal");
                let guard = SlotGuard::new(&database_options(database), &slot);
                (vec![("RELAY_WAL_SLOT".into(), slot)], Some(guard))
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Poll => "polling",
            Self::Wal => "woken from the WAL",
        }
    }
}

/// The connect options of `database` on the benchmark's server.
pub(super) fn database_options(database: &str) -> sqlx::postgres::PgConnectOptions {
    testing::server_options().database(database)
}

/// One mode's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Mode {
    /// The drain of a backlog by one relay, events per second.
    pub drain_per_sec: f64,
    /// `POST /orders` at maximum rate, orders per second.
    pub http_orders_per_sec: f64,
    /// The whole pipeline at maximum rate, one instance of each service: invoices per second.
    /// Runs before it was measured hold 0.
    #[serde(default)]
    pub pipeline_per_sec: f64,
    /// The steady phase through both services, with its [`super::cost::Cost`].
    pub steady: Steady,
    /// Another application's SQL commits: commit → the relay's claim.
    pub elsewhere_ms: Latency,
}

/// The phase's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Wal {
    /// Raw pipelined publishing, per second: the drain's reference.
    pub raw_publish_per_sec: f64,
    /// The plain two-insert transaction, per second: `POST /orders`' reference.
    pub plain_tx_per_sec: f64,
    /// SQL commits per second of the other application.
    pub elsewhere_rate: u32,
    /// The relay polling.
    pub poll: Mode,
    /// The relay also woken from the slot.
    pub wal: Mode,
}

impl Wal {
    fn mode(&mut self, wake: Wake) -> &mut Mode {
        match wake {
            Wake::Poll => &mut self.poll,
            Wake::Wal => &mut self.wal,
        }
    }
}

/// Runs the phase with the run's sizes; `None` if the server cannot stream its WAL.
pub async fn wal(options: &Options) -> anyhow::Result<Option<Wal>> {
    let server = PgPool::connect_with(testing::server_options()).await?;
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&server)
        .await?;
    let replication: bool = sqlx::query_scalar(
        "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&server)
    .await?;
    server.close().await;
    if level != "logical" {
        progress(&format!(
            "  skipped: wal_level is {level}, and a replication slot needs logical"
        ));
        return Ok(None);
    }
    if !replication {
        progress("  skipped: DATABASE_URL's role has no REPLICATION, which a slot needs");
        return Ok(None);
    }
    let mut figures = Wal {
        raw_publish_per_sec: refs::raw_publish(options.raw_messages).await?,
        elsewhere_rate: options.steady_rate,
        ..Wal::default()
    };
    filled::settle().await;
    figures.plain_tx_per_sec =
        refs::plain_transaction(options.connections, options.max_rate_for).await?;
    progress(&format!(
        "  references: raw publishing {:.0} msgs/s, the plain transaction {:.0} tx/s",
        figures.raw_publish_per_sec, figures.plain_tx_per_sec
    ));
    for wake in Wake::BOTH {
        filled::settle().await;
        let rate = drain::drain_woken(options.drain_events, wake).await?;
        progress(&format!("  drain, {}: {rate:.0} events/s", wake.name()));
        figures.mode(wake).drain_per_sec = rate;
    }
    for wake in Wake::BOTH {
        filled::settle().await;
        let rate = http::max_rate(options.connections, options.max_rate_for, None, wake).await?;
        progress(&format!(
            "  POST /orders, {}: {rate:.0} orders/s",
            wake.name()
        ));
        figures.mode(wake).http_orders_per_sec = rate;
    }
    for wake in Wake::BOTH {
        filled::settle().await;
        let run = scale::scale(1, 1, options.connections, options.max_rate_for, wake).await?;
        progress(&format!(
            "  the whole pipeline, {}: {:.0} invoiced/s",
            wake.name(),
            run.invoiced_per_sec
        ));
        figures.mode(wake).pipeline_per_sec = run.invoiced_per_sec;
    }
    for wake in Wake::BOTH {
        filled::settle().await;
        let run = http::steady(options.steady_rate, options.steady_for, 1, None, wake).await?;
        progress(&format!(
            "  steady, {}: p50 {:.2} ms, p99 {:.2} ms",
            wake.name(),
            run.latency_ms.p50,
            run.latency_ms.p99
        ));
        figures.mode(wake).steady = run;
    }
    // Half the steady phase's length: the polling mode's latency is the poll interval's, and
    // needs no more orders to show.
    let length = options.steady_for / 2;
    for wake in Wake::BOTH {
        filled::settle().await;
        let latency = elsewhere(options.steady_rate, length, wake).await?;
        progress(&format!(
            "  SQL commits of another application, {}: p50 {:.2} ms, p99 {:.2} ms",
            wake.name(),
            latency.p50,
            latency.p99
        ));
        figures.mode(wake).elsewhere_ms = latency;
    }
    Ok(Some(figures))
}

/// Commits `rate` events per second for `length` with SQL `outbox_enqueue`, as another
/// application on the database would, beside an orders-service whose relay publishes them;
/// returns commit → the relay's claim.
async fn elsewhere(rate: u32, length: Duration, wake: Wake) -> anyhow::Result<Latency> {
    let names = Names::unique();
    let mut env = http::env(&names, &names.orders_db, &testing::nats_url());
    let (wake_env, slot) = wake.orders_env(&names.orders_db);
    env.extend(wake_env);
    let mut orders = Service::start(Kind::Orders, env, &http::log_dir()).await;
    let pool = PgPool::connect_with(database_options(&names.orders_db)).await?;
    if let Some(slot) = &slot {
        // Commits made before the slot streams would wait for the poll.
        slot_streamed_by(&pool, slot.name()).await;
    }

    let total = (f64::from(rate) * length.as_secs_f64()) as u64;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    let mut commits = Vec::with_capacity(total as usize);
    for i in 0..total {
        ticks.tick().await;
        let pool = pool.clone();
        commits.push(tokio::spawn(async move {
            sqlx::query(
                "SELECT outbox_enqueue(gen_random_uuid(), 'order', $1, 'OrderPlaced',
                        jsonb_build_object('orderId', $1::text, 'customer', 'elsewhere',
                                           'totalMinor', 100, 'status', 'placed'))",
            )
            .bind(format!("e{i}"))
            .execute(&pool)
            .await
        }));
    }
    for commit in futures::future::join_all(commits).await {
        commit??;
    }
    drain::none_pending(&pool, Duration::from_secs(60)).await?;
    // `created_at` is the insert's clock_timestamp(), the last statement before the commit;
    // `published_at` the claiming transaction's start.
    let stamps: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT created_at, published_at FROM outbox_events WHERE published_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await?;
    anyhow::ensure!(
        stamps.len() as u64 == total,
        "{} of {total} events published",
        stamps.len()
    );
    let latencies = stamps
        .into_iter()
        .filter_map(|(at, published)| {
            (published - at)
                .num_microseconds()
                .map(|us| us as f64 / 1e3)
        })
        .collect();

    pool.close().await;
    orders.terminate().await;
    drop(slot);
    names.clean_up().await;
    Ok(Latency::of_unsorted(latencies))
}
