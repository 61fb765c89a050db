//! The benchmark (see `e2e::bench`):
//!
//!   cargo run --release -p e2e --bin bench                 # the full run, ≈ 8 minutes
//!   cargo run --release -p e2e --bin bench -- --smoke      # a few seconds, to check it works
//!   cargo run --release -p e2e --bin bench -- --out DIR    # results folder (default results/)

use std::path::PathBuf;

use e2e::bench::{self, Options};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut smoke = false;
    let mut out = PathBuf::from("results");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--out" => out = args.next().map(PathBuf::from).unwrap_or(out),
            other => anyhow::bail!("unknown argument {other}; see the README's Benchmark section"),
        }
    }
    let options = if smoke {
        Options::smoke(out)
    } else {
        Options::full(out)
    };
    bench::run(&options).await?;
    Ok(())
}
