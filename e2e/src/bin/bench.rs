//! The benchmark (see `e2e::bench`):
//!
//!   cargo run --release -p e2e --bin bench                 # the full run, ≈ 30 minutes
//!   cargo run --release -p e2e --bin bench -- --smoke      # a few seconds, to check it works
//!   cargo run --release -p e2e --bin bench -- --out DIR    # results folder (default results/)
//!   cargo run --release -p e2e --bin bench -- --growth-rows N  # the growth phase's table size
//!   cargo run --release -p e2e --bin bench -- --growth-runs N  # times it measures each side
//!   cargo run --release -p e2e --bin bench -- --growth-only    # only the growth phase
//!   cargo run --release -p e2e --bin bench -- --steady-only    # only the steady phases
//!   cargo run --release -p e2e --bin bench -- --max-rate-only  # only the maximum rates
//!   cargo run --release -p e2e --bin bench -- --billing-only   # only billing's two drains
//!   cargo run --release -p e2e --bin bench -- --markdown BENCHMARKS.md results/*/results.json
//!                                       # the figures of those runs, a column each, as Markdown

use std::path::PathBuf;

use e2e::bench::{self, Options};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut smoke, mut growth_rows, mut growth_runs) = (false, None, None);
    // Which phases: all, or one group of them alone.
    let mut only = "";
    let mut out = PathBuf::from("results");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--growth-only" => only = "growth",
            "--steady-only" => only = "steady",
            "--max-rate-only" => only = "max-rate",
            "--billing-only" => only = "billing",
            "--growth-rows" => {
                let rows = args.next().unwrap_or_default();
                growth_rows =
                    Some(rows.parse().map_err(|_| {
                        anyhow::anyhow!("--growth-rows wants a number, not {rows:?}")
                    })?);
            }
            "--growth-runs" => {
                let runs = args.next().unwrap_or_default();
                growth_runs = Some(runs.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    anyhow::anyhow!("--growth-runs wants a number over 0, not {runs:?}")
                })?);
            }
            "--out" => out = args.next().map(PathBuf::from).unwrap_or(out),
            "--markdown" => {
                let target = PathBuf::from(args.next().unwrap_or_default());
                let runs = args
                    .by_ref()
                    .map(|path| {
                        let json = std::fs::read(&path)?;
                        serde_json::from_slice(&json)
                            .map_err(|e| anyhow::anyhow!("{path}: not a results.json: {e}"))
                    })
                    .collect::<anyhow::Result<Vec<bench::Results>>>()?;
                anyhow::ensure!(
                    !runs.is_empty(),
                    "--markdown wants a file, then results.json files"
                );
                std::fs::write(&target, bench::report::markdown(&runs))?;
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other}; see the README's Benchmark section"),
        }
    }
    let mut options = if smoke {
        Options::smoke(out)
    } else {
        Options::full(out)
    };
    if let Some(rows) = growth_rows {
        options.growth_rows = rows;
    }
    if let Some(runs) = growth_runs {
        options.growth_runs = runs;
    }
    match only {
        "growth" => drop(bench::run_growth(&options).await?),
        "steady" => bench::run_steady(&options).await?,
        "max-rate" => bench::run_max_rate(&options).await?,
        "billing" => bench::run_billing(&options).await?,
        // Boxed: the whole run's state is too big for the stack of main's future.
        _ => drop(Box::pin(bench::run(&options)).await?),
    }
    Ok(())
}
