//! The benchmark: every figure of the quality bars, each with the machine's reference measured
//! in the same run.
//!
//! - [`refs`]: what the machine can do: raw pipelined JetStream publishing with message ids,
//!   and a plain two-insert transaction from 16 clients through sqlx (no advisory lock, no
//!   notification); also our order transaction through sqlx, for comparison;
//! - [`drain`]: pre-filled pending outbox rows drained by 1 relay (rows kept, then rows
//!   deleted as published) and by 4 relays;
//! - [`sync`]: raw publishing and the drain against a nats-server that syncs every write, and
//!   one with JetStream's default sync interval;
//! - [`billing`]: pre-published messages applied by billing, the messages waiting per
//!   transaction (the default) and a transaction per message;
//! - [`http`]: `POST /orders` at maximum rate, and a steady rate through both services with
//!   order-commit → invoice-commit latency from the databases' own timestamps and peak RSS,
//!   with one orders-service and with two (one of them without a relay);
//! - [`views`]: the operator views (`/outbox/stats`, `/metrics`, `/ops`) with a few pending
//!   events and with a backlog of a million;
//! - [`wal`]: the relay polling against the relay also woken from a replication slot, side by
//!   side: the drain, `POST /orders`, the steady phase with its CPU time and WAL per order
//!   ([`cost`]), and another application's SQL commits;
//! - [`growth`]: the drain, `POST /orders` and the steady phase again with the outbox and the
//!   inbox holding many finished rows, the bytes per event on each side, and the cleanup's
//!   rate against the insert rate;
//! - [`report`]: the printed table, `results.json` and the SVG charts.
//!
//! Everything runs against the real PostgreSQL and nats-server (`DATABASE_URL`, `NATS_URL`),
//! the services as the release binaries of `scripts/build-services`, each phase with its own
//! databases and stream.

pub mod billing;
mod charts;
pub mod cost;
pub mod drain;
pub mod filled;
pub mod growth;
pub mod http;
pub mod refs;
pub mod report;
pub mod scale;
pub mod sync;
pub mod views;
pub mod wal;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wal::Wake;

/// What to run, and how big.
#[derive(Debug, Clone)]
pub struct Options {
    /// Messages of the raw publish reference.
    pub raw_messages: usize,
    /// Pending rows each relay drain starts with.
    pub drain_events: i64,
    /// Messages each billing drain starts with.
    pub billing_messages: usize,
    /// Pending events of the operator views' backlog.
    pub views_backlog: i64,
    /// Published events and inbox records the growth phase fills its tables with.
    pub growth_rows: i64,
    /// Times the growth phase measures each side (empty, filled), interleaved; its steady
    /// phases each last `steady_for` divided by this, so that each side has as many orders as
    /// the steady phase.
    pub growth_runs: usize,
    /// Clients of the maximum-rate phases (HTTP and direct sqlx).
    pub connections: usize,
    /// Length of each maximum-rate phase.
    pub max_rate_for: Duration,
    /// Orders per second of the steady phase.
    pub steady_rate: u32,
    /// Length of the steady phase.
    pub steady_for: Duration,
    /// Where results go (a folder per run is made inside).
    pub out: PathBuf,
}

impl Options {
    /// The full benchmark, as BENCHMARKS.md's figures are measured.
    pub fn full(out: PathBuf) -> Self {
        Self {
            raw_messages: 200_000,
            drain_events: 200_000,
            billing_messages: 20_000,
            views_backlog: 1_000_000,
            growth_rows: 20_000_000,
            growth_runs: 2,
            connections: 16,
            max_rate_for: Duration::from_secs(10),
            steady_rate: 500,
            steady_for: Duration::from_secs(60),
            out,
        }
    }

    /// A few seconds in all: proves the benchmark still works (CI runs it).
    pub fn smoke(out: PathBuf) -> Self {
        Self {
            raw_messages: 5_000,
            drain_events: 5_000,
            billing_messages: 1_000,
            views_backlog: 20_000,
            growth_rows: 20_000,
            growth_runs: 1,
            connections: 4,
            max_rate_for: Duration::from_secs(1),
            steady_rate: 100,
            steady_for: Duration::from_secs(2),
            out,
        }
    }
}

/// Every figure of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
    /// The workspace's commit the run measured, `-dirty` with changes not committed (absent in
    /// runs from before it, or without git).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Sizes used.
    pub settings: Settings,
    /// Whether the connections to PostgreSQL use TLS (`sslmode` in `DATABASE_URL`; the
    /// default `prefer` uses it whenever the server offers it).
    pub postgres_tls: bool,
    /// Raw pipelined JetStream publishes with message ids, per second.
    pub raw_publish_per_sec: f64,
    /// Relay drain with one relay, events per second.
    pub drain_1_relay_per_sec: f64,
    /// Relay drain with one relay deleting rows as it publishes them, events per second.
    pub drain_1_relay_deleting_per_sec: f64,
    /// Relay drain with four relays, events per second.
    pub drain_4_relays_per_sec: f64,
    /// The plain two-insert transaction through sqlx, per second: the database's reference.
    pub plain_tx_per_sec: f64,
    /// The order transaction of orders-service directly through sqlx, per second.
    pub order_tx_per_sec: f64,
    /// Billing applying pre-published messages, its defaults, invoices per second.
    pub billing_drain_per_sec: f64,
    /// The same with a transaction per message.
    pub billing_drain_single_per_sec: f64,
    /// `POST /orders` at maximum rate, accepted per second.
    pub http_orders_per_sec: f64,
    /// The steady phase, one orders-service.
    pub steady: http::Steady,
    /// The steady phase, two orders-service instances, only one of them with a relay.
    pub steady_two: http::Steady,
    /// End to end at maximum rate as the deployment scales out.
    pub scale: Vec<scale::Scale>,
    /// The operator views with 10 pending events, then with the backlog.
    pub views: Vec<views::Views>,
    /// The phases again on filled tables, sizes and the cleanup.
    pub growth: growth::Growth,
    /// Raw publishing and the drain with `sync_interval: always` and the default (absent in
    /// runs from before the phase, or where no nats-server 2.10 ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<sync::Sync>,
    /// The relay polling against the relay also woken from a replication slot (absent in runs
    /// from before the phase, or where the server's `wal_level` is not `logical`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal: Option<wal::Wal>,
}

/// The sizes of a run, recorded with its results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    /// See [`Options::raw_messages`].
    pub raw_messages: usize,
    /// See [`Options::drain_events`].
    pub drain_events: i64,
    /// See [`Options::billing_messages`].
    pub billing_messages: usize,
    /// See [`Options::views_backlog`].
    pub views_backlog: i64,
    /// See [`Options::growth_rows`].
    pub growth_rows: i64,
    /// See [`Options::growth_runs`]; 1 in runs from before it.
    #[serde(default = "one")]
    pub growth_runs: usize,
    /// See [`Options::connections`].
    pub connections: usize,
    /// See [`Options::max_rate_for`], in seconds.
    pub max_rate_secs: f64,
    /// See [`Options::steady_rate`].
    pub steady_rate: u32,
    /// See [`Options::steady_for`], in seconds.
    pub steady_secs: f64,
}

/// Whether a connection made as the services make theirs uses TLS.
async fn postgres_tls() -> anyhow::Result<bool> {
    let pool = sqlx::PgPool::connect_with(service_kit::testing::server_options()).await?;
    let tls = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(tls)
}

/// The workspace's commit, `-dirty` with changes to tracked files; `None` without git.
fn revision() -> Option<String> {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

/// Prints a progress line.
pub fn progress(what: &str) {
    eprintln!("[bench] {what}");
}

/// The sizes of `options`, as a run records them.
fn settings(options: &Options) -> Settings {
    Settings {
        raw_messages: options.raw_messages,
        drain_events: options.drain_events,
        billing_messages: options.billing_messages,
        views_backlog: options.views_backlog,
        growth_rows: options.growth_rows,
        growth_runs: options.growth_runs,
        connections: options.connections,
        max_rate_secs: options.max_rate_for.as_secs_f64(),
        steady_rate: options.steady_rate,
        steady_secs: options.steady_for.as_secs_f64(),
    }
}

/// Runs every phase, then writes and prints the report; returns the results folder.
pub async fn run(options: &Options) -> anyhow::Result<PathBuf> {
    let started_at = chrono::Utc::now();
    progress("the service binaries: SERVICES_BIN_DIR, or scripts/build-services builds them");
    crate::process::binary("orders-service");

    let postgres_tls = postgres_tls().await?;
    progress(&format!(
        "PostgreSQL connections {} TLS",
        if postgres_tls { "use" } else { "do not use" }
    ));

    progress(&format!(
        "raw JetStream publishing: {} messages",
        options.raw_messages
    ));
    let raw_publish_per_sec = refs::raw_publish(options.raw_messages).await?;
    progress(&format!("  {raw_publish_per_sec:.0} msgs/s"));

    let drains = relay_drains(options.drain_events).await?;
    let sync = sync_phase(options).await?;

    progress(&format!(
        "plain two-insert transaction through sqlx (reference): {} clients for {:?}",
        options.connections, options.max_rate_for
    ));
    filled::settle().await;
    let plain_tx_per_sec =
        refs::plain_transaction(options.connections, options.max_rate_for).await?;
    progress(&format!("  {plain_tx_per_sec:.0} tx/s"));
    progress("the order transaction of orders-service through sqlx, the same clients");
    filled::settle().await;
    let order_tx_per_sec =
        refs::order_transaction(options.connections, options.max_rate_for).await?;
    progress(&format!("  {order_tx_per_sec:.0} tx/s"));

    let billing_drains = billing_drains(options.billing_messages).await?;

    progress(&format!(
        "POST /orders at maximum rate: {} connections for {:?}",
        options.connections, options.max_rate_for
    ));
    filled::settle().await;
    let http_orders_per_sec =
        http::max_rate(options.connections, options.max_rate_for, None, Wake::Poll).await?;
    progress(&format!("  {http_orders_per_sec:.0} orders/s"));

    let (steady, steady_two) = steady_phases(options).await?;

    let scaled = scale_out(options).await?;

    let views = operator_views(options.views_backlog).await?;

    let wal = wal_phase(options).await?;

    let growth = growth(options).await?;

    let results = Results {
        started_at: started_at.to_rfc3339(),
        revision: revision(),
        settings: settings(options),
        postgres_tls,
        raw_publish_per_sec,
        drain_1_relay_per_sec: drains[0],
        drain_1_relay_deleting_per_sec: drains[1],
        drain_4_relays_per_sec: drains[2],
        plain_tx_per_sec,
        order_tx_per_sec,
        billing_drain_per_sec: billing_drains[0],
        billing_drain_single_per_sec: billing_drains[1],
        http_orders_per_sec,
        steady,
        steady_two,
        scale: scaled,
        views,
        growth,
        sync,
        wal,
    };
    let dir = options
        .out
        .join(started_at.format("%Y%m%dT%H%M%SZ").to_string());
    report::write(&results, &dir)?;
    report::print(&results);
    Ok(dir)
}

/// The steady phases: one orders-service, then two of which only the first runs a relay.
async fn steady_phases(options: &Options) -> anyhow::Result<(http::Steady, http::Steady)> {
    let mut steady = Vec::new();
    for instances in [1, 2] {
        progress(&format!(
            "steady load through both services: {} orders/s for {:?}, {instances} orders-service \
             instance(s){}",
            options.steady_rate,
            options.steady_for,
            if instances > 1 {
                ", a relay in the first only"
            } else {
                ""
            }
        ));
        // The latency is this phase's alone, not that of the previous phases' write-back.
        filled::settle().await;
        steady.push(
            http::steady(
                options.steady_rate,
                options.steady_for,
                instances,
                None,
                Wake::Poll,
            )
            .await?,
        );
    }
    let steady_two = steady.pop().unwrap_or_default();
    let steady = steady.pop().unwrap_or_default();
    Ok((steady, steady_two))
}

/// The sync phase ([`sync`]) with the run's sizes.
async fn sync_phase(options: &Options) -> anyhow::Result<Option<sync::Sync>> {
    progress(&format!(
        "the broker syncing every write, and not: {} messages raw, {} events drained",
        options.raw_messages, options.drain_events
    ));
    filled::settle().await;
    sync::sync(options.raw_messages, options.drain_events).await
}

/// The WAL phase ([`wal`]) with the run's sizes.
async fn wal_phase(options: &Options) -> anyhow::Result<Option<wal::Wal>> {
    progress(&format!(
        "the relay polling, and woken from a replication slot: {} events drained, {} \
         connections for {:?}, {}/s for {:?} steady and half of it from SQL",
        options.drain_events,
        options.connections,
        options.max_rate_for,
        options.steady_rate,
        options.steady_for
    ));
    wal::wal(options).await
}

/// Runs the WAL phase alone and writes a run of it (the other figures absent), for
/// BENCHMARKS.md.
pub async fn run_wal(options: &Options) -> anyhow::Result<()> {
    let started_at = chrono::Utc::now();
    crate::process::binary("orders-service");
    let wal = wal_phase(options).await?;
    anyhow::ensure!(
        wal.is_some(),
        "the server cannot stream a slot (wal_level, REPLICATION): no phase to run"
    );
    write_alone(
        options,
        started_at,
        Results {
            wal,
            ..Results::default()
        },
    )
    .await
}

/// Writes and prints a run of one phase alone: `phase` holds its figures, the others absent.
async fn write_alone(
    options: &Options,
    started_at: chrono::DateTime<chrono::Utc>,
    phase: Results,
) -> anyhow::Result<()> {
    let results = Results {
        started_at: started_at.to_rfc3339(),
        revision: revision(),
        settings: settings(options),
        postgres_tls: postgres_tls().await?,
        ..phase
    };
    let dir = options
        .out
        .join(started_at.format("%Y%m%dT%H%M%SZ").to_string());
    report::write(&results, &dir)?;
    report::print(&results);
    Ok(())
}

/// Runs the sync phase alone and writes a run of it (the other figures absent), for
/// BENCHMARKS.md.
pub async fn run_sync(options: &Options) -> anyhow::Result<()> {
    let started_at = chrono::Utc::now();
    let sync = sync_phase(options).await?;
    anyhow::ensure!(
        sync.is_some(),
        "no nats-server 2.10 or later to run the phase with"
    );
    write_alone(
        options,
        started_at,
        Results {
            sync,
            ..Results::default()
        },
    )
    .await
}

/// Runs the steady phases alone and prints their lines.
pub async fn run_steady(options: &Options) -> anyhow::Result<()> {
    crate::process::binary("orders-service");
    let (one, two) = steady_phases(options).await?;
    report::print_steady(&one, options.steady_rate, "1 orders-service");
    report::print_steady(&two, options.steady_rate, "2, relay in 1");
    Ok(())
}

/// Runs the maximum-rate phases alone with their reference, the plain transaction, and prints
/// each as a ratio to it.
pub async fn run_max_rate(options: &Options) -> anyhow::Result<()> {
    crate::process::binary("orders-service");
    let (connections, length) = (options.connections, options.max_rate_for);
    // Each phase starts with what the one before wrote on disk (a checkpoint), so that it does
    // not pay for the I/O of another.
    filled::settle().await;
    let plain = refs::plain_transaction(connections, length).await?;
    filled::settle().await;
    let order = refs::order_transaction(connections, length).await?;
    filled::settle().await;
    let http = http::max_rate(connections, length, None, Wake::Poll).await?;
    filled::settle().await;
    let pipeline = scale::scale(1, 1, connections, length, Wake::Poll).await?;
    println!("plain transaction      {plain:>8.0} tx/s");
    for (figure, rate) in [
        ("order transaction", order),
        ("POST /orders", http),
        ("whole pipeline", pipeline.invoiced_per_sec),
    ] {
        println!(
            "{figure:<22} {rate:>8.0}/s  {:>4.0}% of plain",
            rate / plain * 100.0
        );
    }
    Ok(())
}

/// Runs billing's two drains alone (batched, the default; a transaction per message) and prints
/// them with their ratio.
pub async fn run_billing(options: &Options) -> anyhow::Result<()> {
    crate::process::binary("billing-service");
    let drains = billing_drains(options.billing_messages).await?;
    println!(
        "billing drain          {:>8.0} invoices/s  {:.1}x a transaction per message ({:.0}/s)",
        drains[0],
        drains[0] / drains[1],
        drains[1]
    );
    Ok(())
}

/// The relay drains: 1 relay keeping rows, 1 deleting them, 4 keeping them.
async fn relay_drains(events: i64) -> anyhow::Result<Vec<f64>> {
    let mut drains = Vec::new();
    for (relays, delete_published) in [(1, false), (1, true), (4, false)] {
        progress(&format!(
            "relay drain: {} pending events, {relays} relay(s), rows {}",
            events,
            if delete_published {
                "deleted as published (OUTBOX_RETENTION_MS=0)"
            } else {
                "kept (default)"
            }
        ));
        let rate = drain::drain(events, relays, delete_published, None).await?;
        progress(&format!("  {rate:.0} events/s"));
        drains.push(rate);
    }

    Ok(drains)
}

/// Billing's drains: the default (the messages waiting per transaction), then a transaction per
/// message.
async fn billing_drains(messages: usize) -> anyhow::Result<Vec<f64>> {
    let mut billing_drains = Vec::new();
    for apply_batch in [None, Some(1)] {
        progress(&format!(
            "billing drain: {} messages on the stream, {}",
            messages,
            if apply_batch.is_some() {
                "a transaction per message (CONSUMER_APPLY_BATCH=1)"
            } else {
                "the messages waiting per transaction (default)"
            }
        ));
        let rate = billing::drain(messages, apply_batch).await?;
        progress(&format!("  {rate:.0} invoices/s"));
        billing_drains.push(rate);
    }

    Ok(billing_drains)
}

/// End to end at maximum rate, 1 and 2 instances of each service, on one nats-server and on a
/// 3-node cluster.
async fn scale_out(options: &Options) -> anyhow::Result<Vec<scale::Scale>> {
    let mut scaled = Vec::new();
    for (replicas, nats_nodes) in [(1, 1), (2, 1), (1, 3), (2, 3)] {
        progress(&format!(
            "end to end at maximum rate: {replicas} orders + {replicas} billing instance(s), \
             {nats_nodes} NATS node(s), {} connections for {:?}",
            options.connections, options.max_rate_for
        ));
        let figures = scale::scale(
            replicas,
            nats_nodes,
            options.connections,
            options.max_rate_for,
            Wake::Poll,
        )
        .await?;
        progress(&format!(
            "  {:.0} accepted/s, {:.0} invoiced/s",
            figures.accepted_per_sec, figures.invoiced_per_sec
        ));
        scaled.push(figures);
    }

    Ok(scaled)
}

/// The growth phase: the tables filled once, then each measurement on empty tables and on
/// copies of the filled ones, one after the other.
async fn growth(options: &Options) -> anyhow::Result<growth::Growth> {
    progress(&format!(
        "growth: an outbox with {0} published events and an inbox with {0} records",
        options.growth_rows
    ));
    filled::drop_leftovers().await?;
    let (filled, mut figures) = filled::fill(options.growth_rows).await?;
    progress(&format!(
        "  filled in {:.0} s: {:.0} bytes per outbox event, {:.0} per inbox record",
        figures.fill_secs, figures.outbox_bytes_per_event, figures.inbox_bytes_per_record
    ));
    let (empty, _) = filled::fill(0).await?;
    measure_growth(options, &empty, &filled, &mut figures).await?;
    empty.drop().await;
    filled.drop().await;
    Ok(figures)
}

/// The growth phase's measurements on copies of `empty` and of `filled`, each side
/// [`Options::growth_runs`] times in the order empty, filled, filled, empty, …: a drift over
/// the phase (the disk's write-back after a copy, the page cache) weighs on both sides alike,
/// and one stall of the machine weighs on one of several runs.
async fn measure_growth(
    options: &Options,
    empty: &filled::Filled,
    filled: &filled::Filled,
    figures: &mut growth::Growth,
) -> anyhow::Result<()> {
    let runs: Vec<(&str, &filled::Filled)> = (0..options.growth_runs)
        .flat_map(|i| {
            let pair = [("empty", empty), ("filled", filled)];
            if i % 2 == 0 { pair } else { [pair[1], pair[0]] }
        })
        .collect();
    let steady_for = options.steady_for / u32::try_from(options.growth_runs.max(1))?;
    let mut steady: [Vec<http::Steady>; 2] = Default::default();
    for &(tables, seed) in &runs {
        progress(&format!(
            "  relay drain, 1 relay, rows kept, {tables} tables"
        ));
        filled::settle().await;
        let rate = drain::drain(options.drain_events, 1, false, Some(seed)).await?;
        progress(&format!("    {rate:.0} events/s"));
        figures.phases(seed.rows > 0).drain_runs_per_sec.push(rate);
    }
    for &(tables, seed) in &runs {
        progress(&format!("  POST /orders at maximum rate, {tables} tables"));
        filled::settle().await;
        let rate = http::max_rate(
            options.connections,
            options.max_rate_for,
            Some(seed),
            Wake::Poll,
        )
        .await?;
        progress(&format!("    {rate:.0} orders/s"));
        figures.phases(seed.rows > 0).http_runs_per_sec.push(rate);
    }
    for &(tables, seed) in &runs {
        progress(&format!(
            "  steady load for {steady_for:?}, 1 orders-service, {tables} tables"
        ));
        filled::settle().await;
        let run = http::steady(options.steady_rate, steady_for, 1, Some(seed), Wake::Poll).await?;
        progress(&format!(
            "    p50 {:.2} ms, p99 {:.2} ms",
            run.latency_ms.p50, run.latency_ms.p99
        ));
        steady[usize::from(seed.rows > 0)].push(run);
    }
    for (side, runs) in steady.into_iter().enumerate() {
        let phases = figures.phases(side == 1);
        phases.steady_runs_p99_ms = runs.iter().map(|r| r.latency_ms.p99).collect();
        phases.steady = http::Steady::pooled(runs);
        phases.drain_1_relay_per_sec = mean(&phases.drain_runs_per_sec);
        phases.http_orders_per_sec = mean(&phases.http_runs_per_sec);
    }
    progress("  the cleanups under POST /orders at maximum rate");
    filled::settle().await;
    figures.cleanup = growth::cleanup(filled, options.connections).await?;
    let c = &figures.cleanup;
    for (table, round) in [("outbox", &c.outbox), ("inbox", &c.inbox)] {
        progress(&format!(
            "    {table}: {} rows aged out in {:.2} s, VACUUM {:.1} s",
            round.deleted, round.delete_secs, round.vacuum_secs
        ));
    }
    progress(&format!(
        "    meanwhile {:.0} orders/s inserted",
        c.inserted_per_sec
    ));
    Ok(())
}

/// The mean of `values`.
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Serde's default for figures that runs from before them had once.
fn one() -> usize {
    1
}

/// Runs the growth phase alone, then writes `growth.json` and prints its lines; returns the
/// results folder.
pub async fn run_growth(options: &Options) -> anyhow::Result<PathBuf> {
    let started_at = chrono::Utc::now();
    crate::process::binary("orders-service");
    let figures = growth(options).await?;
    let dir = options
        .out
        .join(started_at.format("growth-%Y%m%dT%H%M%SZ").to_string());
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("growth.json"),
        serde_json::to_vec_pretty(&figures)?,
    )?;
    report::print_growth(&figures);
    progress(&format!("results in {}", dir.display()));
    Ok(dir)
}

/// Runs the operator views alone (10 pending events, then the backlog); their lines are
/// printed as they are timed.
pub async fn run_views(options: &Options) -> anyhow::Result<()> {
    crate::process::binary("orders-service");
    operator_views(options.views_backlog).await.map(drop)
}

/// The operator views with 10 pending events, then with `backlog`.
async fn operator_views(backlog: i64) -> anyhow::Result<Vec<views::Views>> {
    let mut views = Vec::new();
    for pending in [10, backlog] {
        progress(&format!(
            "operator views with {pending} pending events (relay off)"
        ));
        let timed = views::views(pending).await?;
        progress(&format!(
            "  /outbox/stats {:.2} ms, /metrics {:.2} ms, /ops {:.2} ms (medians)",
            timed.stats_ms, timed.metrics_ms, timed.ops_ms
        ));
        views.push(timed);
    }
    Ok(views)
}
