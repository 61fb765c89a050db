//! The benchmark (see `e2e::bench` and docs/performance.md): `bench --help` lists its flags.

use std::path::PathBuf;

use clap::Parser as _;
use e2e::bench::{self, Options};

/// Measures the machine's references (raw publishing, a plain transaction) and the services'
/// figures as ratios to them, against the PostgreSQL and nats-server of DATABASE_URL and
/// NATS_URL; writes results.json, latency.svg and throughput.svg into a folder per run.
#[derive(Debug, clap::Parser)]
#[command(name = "bench", version)]
struct Cli {
    /// A few seconds of each phase, to check the benchmark works (no figure is meaningful).
    #[arg(long)]
    smoke: bool,
    /// Where the runs' folders go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Published events and inbox records the growth phase fills its tables with.
    #[arg(long)]
    growth_rows: Option<i64>,
    /// Times the growth phase measures each side (empty, filled), interleaved.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    growth_runs: Option<u32>,
    /// Only one group of phases.
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// Instead of measuring: write the figures of these runs' results.json files, a column
    /// each, as Markdown to FILE (BENCHMARKS.md is written so).
    #[arg(long, value_name = "FILE", requires = "results")]
    markdown: Option<PathBuf>,
    /// The results.json files --markdown reads.
    #[arg(requires = "markdown")]
    results: Vec<PathBuf>,
}

/// The groups of phases that run alone.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Only {
    /// The growth phase: tables of growth-rows published events and inbox records.
    Growth,
    /// The steady phases at 500 orders/s.
    Steady,
    /// The maximum rates.
    MaxRate,
    /// Billing's two drains.
    Billing,
    /// Raw publishing and the drain with the broker syncing every write, and not.
    Sync,
    /// The operator views, with a few pending events and with a backlog.
    Views,
    /// The relay polling against the relay also woken from a replication slot
    /// (RELAY_WAL_SLOT): the server needs wal_level = logical.
    Wal,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(target) = cli.markdown {
        let runs = cli
            .results
            .iter()
            .map(|path| {
                let json = std::fs::read(path)?;
                serde_json::from_slice(&json)
                    .map_err(|e| anyhow::anyhow!("{}: not a results.json: {e}", path.display()))
            })
            .collect::<anyhow::Result<Vec<bench::Results>>>()?;
        std::fs::write(&target, bench::report::markdown(&runs))?;
        return Ok(());
    }
    let mut options = if cli.smoke {
        Options::smoke(cli.out)
    } else {
        Options::full(cli.out)
    };
    if let Some(rows) = cli.growth_rows {
        options.growth_rows = rows;
    }
    if let Some(runs) = cli.growth_runs {
        options.growth_runs = runs as usize;
    }
    match cli.only {
        Some(Only::Growth) => drop(bench::run_growth(&options).await?),
        Some(Only::Steady) => bench::run_steady(&options).await?,
        Some(Only::MaxRate) => bench::run_max_rate(&options).await?,
        Some(Only::Billing) => bench::run_billing(&options).await?,
        Some(Only::Sync) => bench::run_sync(&options).await?,
        Some(Only::Views) => bench::run_views(&options).await?,
        Some(Only::Wal) => bench::run_wal(&options).await?,
        // Boxed: the whole run's state is too big for the stack of main's future.
        None => drop(Box::pin(bench::run(&options)).await?),
    }
    Ok(())
}
