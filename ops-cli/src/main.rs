//! opsctl: the admin API of orders-service and billing-service from a terminal, for scripts and
//! for incidents without a browser. See `opsctl --help`.

use clap::Parser as _;

mod cli;
mod client;
mod commands;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("opsctl: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
