//! The services as processes over HTTP: maximum `POST /orders` rate, and a steady rate through
//! both services with latency from the databases' own timestamps.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use jetstream_outbox::testing::slot_streamed_by;
use serde::{Deserialize, Serialize};
use service_kit::testing;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::cost::{Cost, Reading};
use super::filled::Filled;
use super::wal::Wake;
use crate::Names;
use crate::process::{Kind, Service};

/// Order-commit → invoice-commit latency of the steady phase, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// Percentiles of `sorted` (ascending).
    fn of(sorted: &[f64]) -> Self {
        if sorted.is_empty() {
            return Self::default();
        }
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }

    /// Percentiles of `values`, in any order.
    pub(super) fn of_unsorted(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self::of(&values)
    }
}

/// The steady phase's latency split at the relay's claim and billing's transaction start (both
/// `now()` of their transactions, on the same clock).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stages {
    /// Order commit → the relay's claiming transaction began.
    pub to_relay: Latency,
    /// The relay's claim → billing's inbox transaction began (publish, delivery, pull, queue).
    pub relay_to_billing: Latency,
    /// Billing's inbox transaction began → the invoice row (just before its commit).
    pub in_billing: Latency,
}

impl Stages {
    /// The percentiles of each stage's latencies.
    fn of([to_relay, relay_to_billing, in_billing]: [Vec<f64>; 3]) -> Self {
        Self {
            to_relay: Latency::of_unsorted(to_relay),
            relay_to_billing: Latency::of_unsorted(relay_to_billing),
            in_billing: Latency::of_unsorted(in_billing),
        }
    }
}

/// One second of the steady phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the first order.
    pub t: u64,
    /// Orders committed.
    pub accepted: u64,
    /// Events recorded published.
    pub relayed: u64,
    /// Invoices committed.
    pub invoiced: u64,
}

/// The steady phase's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Steady {
    /// Orders sent.
    pub sent: u64,
    /// Orders not accepted (any answer but 201, or no answer).
    pub failed: u64,
    /// Orders committed per second.
    pub accepted_per_sec: f64,
    /// Events published per second.
    pub relayed_per_sec: f64,
    /// Invoices committed per second.
    pub invoiced_per_sec: f64,
    /// Order-commit → invoice-commit.
    pub latency_ms: Latency,
    /// Where that latency goes: order commit → relay's claim, the claim → billing's
    /// transaction start, and billing's transaction up to the invoice row.
    pub stages_ms: Stages,
    /// Every latency, ascending, for the histogram.
    #[serde(skip)]
    pub latencies_ms: Vec<f64>,
    /// Every latency of each stage, as `stages_ms` splits them.
    #[serde(skip)]
    pub stage_latencies_ms: [Vec<f64>; 3],
    /// Per-second counts.
    pub timeline: Vec<Second>,
    /// orders-service's peak resident set, MiB.
    pub orders_peak_rss_mib: f64,
    /// billing-service's peak resident set, MiB.
    pub billing_peak_rss_mib: f64,
    /// CPU time and WAL per order, from the first order to the last invoice (absent in runs
    /// from before it, and where runs are pooled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

impl Steady {
    /// Several runs' orders as those of one phase: percentiles over all of them, rates the
    /// runs' mean, peaks the largest, the timelines one after another.
    pub fn pooled(runs: Vec<Self>) -> Self {
        let n = runs.len().max(1) as f64;
        let mut pooled = Self::default();
        for run in runs {
            pooled.sent += run.sent;
            pooled.failed += run.failed;
            pooled.accepted_per_sec += run.accepted_per_sec / n;
            pooled.relayed_per_sec += run.relayed_per_sec / n;
            pooled.invoiced_per_sec += run.invoiced_per_sec / n;
            pooled.orders_peak_rss_mib = pooled.orders_peak_rss_mib.max(run.orders_peak_rss_mib);
            pooled.billing_peak_rss_mib = pooled.billing_peak_rss_mib.max(run.billing_peak_rss_mib);
            pooled.latencies_ms.extend(run.latencies_ms);
            for (all, stage) in pooled
                .stage_latencies_ms
                .iter_mut()
                .zip(run.stage_latencies_ms)
            {
                all.extend(stage);
            }
            let offset = pooled.timeline.len() as u64;
            pooled
                .timeline
                .extend(run.timeline.into_iter().map(|second| Second {
                    t: second.t + offset,
                    ..second
                }));
        }
        pooled.latencies_ms.sort_by(f64::total_cmp);
        pooled.latency_ms = Latency::of(&pooled.latencies_ms);
        pooled.stages_ms = Stages::of(pooled.stage_latencies_ms.clone());
        pooled
    }
}

pub(super) fn log_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(testing::unique("bench-logs"));
    std::fs::create_dir_all(&dir).expect("log folder");
    dir
}

/// A service's environment against the NATS servers of `nats_url`.
pub(super) fn env(names: &Names, database: &str, nats_url: &str) -> Vec<(String, String)> {
    vec![
        ("DATABASE_URL".into(), testing::database_url(database)),
        ("NATS_URL".into(), nats_url.to_owned()),
        ("NATS_STREAM".into(), names.stream.clone()),
        ("NATS_SUBJECT_PREFIX".into(), names.prefix.clone()),
    ]
}

fn order(id: Option<&str>) -> serde_json::Value {
    serde_json::json!({"id": id, "customer": "bench", "totalMinor": 1999})
}

/// `POST /orders` from `connections` clients for `length` against orders-service (its relay
/// running, as deployed, woken as `wake` says), on a copy of `filled` if given; returns
/// accepted orders per second.
pub async fn max_rate(
    connections: usize,
    length: Duration,
    filled: Option<&Filled>,
    wake: Wake,
) -> anyhow::Result<f64> {
    let names = Names::unique();
    if let Some(filled) = filled {
        filled.copy_orders(&names.orders_db).await?;
    }
    let mut env = env(&names, &names.orders_db, &testing::nats_url());
    let (wake_env, slot) = wake.orders_env(&names.orders_db);
    env.extend(wake_env);
    let mut orders = Service::start(Kind::Orders, env, &log_dir()).await;
    if let Some(slot) = &slot {
        // The service streams its slot only once it is ready.
        let pool = PgPool::connect(&testing::database_url(&names.orders_db)).await?;
        slot_streamed_by(&pool, slot.name()).await;
        pool.close().await;
    }
    let accepted = hammer(&[orders.url.clone()], connections, length).await;
    orders.terminate().await;
    drop(slot);
    names.clean_up().await;
    accepted
}

/// `POST /orders` from `connections` clients for `length`, spread over the orders-service
/// instances at `urls`; returns accepted orders per second, an error if any was refused.
pub(super) async fn hammer(
    urls: &[String],
    connections: usize,
    length: Duration,
) -> anyhow::Result<f64> {
    let stop = CancellationToken::new();
    let timer = tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::time::sleep(length).await;
            stop.cancel();
        }
    });
    let rate = hammer_until(urls, connections, stop).await;
    timer.abort();
    rate
}

/// [`hammer`] until `stop` is cancelled.
pub(super) async fn hammer_until(
    urls: &[String],
    connections: usize,
    stop: CancellationToken,
) -> anyhow::Result<f64> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let (client, url) = (client.clone(), format!("{}/orders", urls[i % urls.len()]));
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut accepted, mut refused) = (0_u64, 0_u64);
                while !stop.is_cancelled() {
                    match client.post(&url).json(&order(None)).send().await {
                        // Read to its end: a response dropped unread closes its connection,
                        // and the next request would pay for a new one.
                        Ok(r) if r.status() == reqwest::StatusCode::CREATED => {
                            accepted += u64::from(r.bytes().await.is_ok());
                        }
                        _ => refused += 1,
                    }
                }
                (accepted, refused)
            })
        })
        .collect();
    let (mut accepted, mut refused) = (0, 0);
    for task in tasks {
        let (a, r) = task.await?;
        accepted += a;
        refused += r;
    }
    let rate = accepted as f64 / start.elapsed().as_secs_f64();
    anyhow::ensure!(refused == 0, "{refused} orders were not accepted");
    Ok(rate)
}

/// Waits (up to `limit`, polling) until the billing database holds `expected` invoices.
pub(super) async fn all_invoiced(
    billing_db: &PgPool,
    expected: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let invoiced: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(billing_db)
            .await?;
        if invoiced as u64 >= expected {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{invoiced} of {expected} invoices after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Peak resident set of process `pid` (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// Sends `rate` orders per second for `length` through both services and measures. With
/// `instances` > 1, the orders go round-robin to that many orders-service instances of which
/// only the first runs a relay: the others' commits reach it through the database. On copies
/// of `filled` if given; the relay woken as `wake` says.
pub async fn steady(
    rate: u32,
    length: Duration,
    instances: usize,
    filled: Option<&Filled>,
    wake: Wake,
) -> anyhow::Result<Steady> {
    let names = Names::unique();
    if let Some(filled) = filled {
        filled.copy_into(&names).await?;
    }
    let logs = log_dir();
    // The first instance runs the relay, the one the slot wakes.
    let (wake_env, slot) = wake.orders_env(&names.orders_db);
    // orders-service first: it makes the stream, which billing waits for.
    let mut services = Vec::with_capacity(instances);
    for instance in 0..instances {
        let mut env = env(&names, &names.orders_db, &testing::nats_url());
        // Issue 18's second scenario: an order committed through an instance without a relay
        // must still reach the other instance's relay at once (its NOTIFY after commit).
        if instance > 0 {
            env.push(("RELAY_ENABLED".into(), "false".into()));
        } else {
            env.extend(wake_env.clone());
        }
        services.push(Service::start(Kind::Orders, env, &logs).await);
    }

    let mut billing = Service::start(
        Kind::Billing,
        env(&names, &names.billing_db, &testing::nats_url()),
        &logs,
    )
    .await;
    let client = reqwest::Client::new();
    let urls: Vec<String> = services
        .iter()
        .map(|s| format!("{}/orders", s.url))
        .collect();

    let orders_db = PgPool::connect(&testing::database_url(&names.orders_db)).await?;
    let billing_db = PgPool::connect(&testing::database_url(&names.billing_db)).await?;
    if let Some(slot) = &slot {
        slot_streamed_by(&orders_db, slot.name()).await;
    }
    let orders_pids: Vec<u32> = services.iter().filter_map(Service::pid).collect();
    let billing_pid = billing.pid().unwrap_or_default();
    let before = Reading::take(&orders_db, &orders_pids, billing_pid).await?;

    let total = (f64::from(rate) * length.as_secs_f64()) as u64;
    let failed = Arc::new(AtomicU64::new(0));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    let mut sends = Vec::with_capacity(total as usize);
    for i in 0..total {
        ticks.tick().await;
        let url = urls[i as usize % urls.len()].clone();
        let (client, failed) = (client.clone(), failed.clone());
        sends.push(tokio::spawn(async move {
            let answer = client
                .post(&url)
                .json(&order(Some(&format!("s{i}"))))
                .send();
            let accepted = match answer.await {
                // Read to its end, so that its connection serves the next request.
                Ok(r) if r.status() == reqwest::StatusCode::CREATED => r.bytes().await.is_ok(),
                _ => false,
            };
            if !accepted {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    futures::future::join_all(sends).await;
    let failed = failed.load(Ordering::Relaxed);

    let accepted = total - failed;
    all_invoiced(&billing_db, accepted, Duration::from_secs(60)).await?;
    let after = Reading::take(&orders_db, &orders_pids, billing_pid).await?;
    let orders_peak_rss_mib = services[0].pid().map_or(f64::NAN, peak_rss_mib);
    let billing_peak_rss_mib = billing.pid().map_or(f64::NAN, peak_rss_mib);

    let mut result = measure(&orders_db, &billing_db, filled.map_or(0, |f| f.rows)).await?;
    result.sent = total;
    result.failed = failed;
    result.orders_peak_rss_mib = orders_peak_rss_mib;
    result.cost = Some(before.until(&after, accepted));
    result.billing_peak_rss_mib = billing_peak_rss_mib;

    orders_db.close().await;
    billing_db.close().await;
    for orders in &mut services {
        orders.terminate().await;
    }
    billing.terminate().await;
    drop(slot);
    names.clean_up().await;
    Ok(result)
}

type Stamp = DateTime<Utc>;

/// The (key, timestamp) rows of `sql`, by key.
async fn stamps(pool: &PgPool, sql: &'static str) -> anyhow::Result<HashMap<String, Stamp>> {
    let rows = sqlx::query_as::<_, (String, Stamp)>(sql)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Latency and rates from the timestamps both databases took before their commits, for the
/// events after the first `filled` (those the phase made).
async fn measure(orders_db: &PgPool, billing_db: &PgPool, filled: i64) -> anyhow::Result<Steady> {
    // The outbox row is the last statement of the order's transaction, the invoice row the
    // last of the message's: their clock_timestamp()s are taken just before each commit.
    // Published events are in the partitions of the last two two-hour slots (a phase lasts
    // minutes); any other would be read whole.
    let placed: Vec<(String, String, Stamp, Option<Stamp>)> = sqlx::query_as(
        "SELECT id::text, aggregate_id, created_at, published_at FROM outbox
         WHERE seq > $1 AND event_type = 'OrderPlaced'
         UNION ALL
         SELECT id::text, aggregate_id, created_at, published_at FROM outbox_published
         WHERE slot IN (outbox_published_slot(now()),
                        outbox_published_slot(now() - interval '2 hours'))
           AND seq > $1 AND event_type = 'OrderPlaced'",
    )
    .bind(filled)
    .fetch_all(orders_db)
    .await?;
    let first = placed.iter().map(|p| p.2).min().unwrap_or_else(Utc::now);
    let invoiced = stamps(billing_db, "SELECT order_id, created_at FROM invoices").await?;
    // The filled records were all received before the phase's first order. An event's id, a
    // UUID, is its inbox key.
    let received: HashMap<String, Stamp> = sqlx::query_as::<_, (String, Stamp)>(
        "SELECT key::text, received_at FROM inbox_entries WHERE received_at >= $1",
    )
    .bind(first)
    .fetch_all(billing_db)
    .await?
    .into_iter()
    .collect();

    let ms = |from: Stamp, to: Stamp| (to - from).num_microseconds().map(|us| us as f64 / 1e3);
    let mut latencies: Vec<f64> = Vec::with_capacity(placed.len());
    let (mut to_relay, mut relay_to_billing, mut in_billing) = (vec![], vec![], vec![]);
    for (event, order, at, published) in &placed {
        let Some(done) = invoiced.get(order) else {
            continue;
        };
        latencies.extend(ms(*at, *done));
        if let (Some(published), Some(began)) = (published, received.get(event)) {
            to_relay.extend(ms(*at, *published));
            relay_to_billing.extend(ms(*published, *began));
            in_billing.extend(ms(*began, *done));
        }
    }
    let stage_latencies_ms = [to_relay, relay_to_billing, in_billing];
    let stages_ms = Stages::of(stage_latencies_ms.clone());
    latencies.sort_by(f64::total_cmp);

    let second_of = |at: Stamp| (at - first).num_milliseconds().max(0) as u64 / 1000;
    let mut timeline: Vec<Second> = Vec::new();
    let mut bump = |at: Stamp, field: fn(&mut Second) -> &mut u64| {
        let t = second_of(at) as usize;
        if timeline.len() <= t {
            timeline.resize_with(t + 1, Second::default);
        }
        *field(&mut timeline[t]) += 1;
    };
    for (_, _, at, published) in &placed {
        bump(*at, |s| &mut s.accepted);
        if let Some(published) = published {
            bump(*published, |s| &mut s.relayed);
        }
    }
    for at in invoiced.values() {
        bump(*at, |s| &mut s.invoiced);
    }
    for (t, second) in timeline.iter_mut().enumerate() {
        second.t = t as u64;
    }

    let per_sec = |stamps: Vec<Stamp>| {
        let (Some(lo), Some(hi)) = (stamps.iter().min(), stamps.iter().max()) else {
            return 0.0;
        };
        let span = (*hi - *lo).num_microseconds().unwrap_or(1).max(1) as f64 / 1e6;
        stamps.len() as f64 / span
    };
    Ok(Steady {
        accepted_per_sec: per_sec(placed.iter().map(|p| p.2).collect()),
        relayed_per_sec: per_sec(placed.iter().filter_map(|p| p.3).collect()),
        invoiced_per_sec: per_sec(invoiced.values().copied().collect()),
        latency_ms: Latency::of(&latencies),
        stages_ms,
        latencies_ms: latencies,
        stage_latencies_ms,
        timeline,
        ..Steady::default()
    })
}
