use billing_service::App;
use billing_service::config::{Cli, Subcommand};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = cli.command;
    let config = cli.config()?;
    match command {
        Some(Subcommand::Healthcheck) => {
            return service_kit::http::healthcheck(&config.common.listen_addr);
        }
        Some(Subcommand::Migrate) => {
            let pool = service_kit::infra::connect_db(config.common.database_url(), 1).await?;
            return billing_service::startup::migrate(&pool).await;
        }
        None => {}
    }
    let _telemetry = service_kit::telemetry::init(
        config.common.log_format,
        config.common.otlp()?.as_ref(),
        "billing-service",
    )?;
    App::build(config)
        .await?
        .run_until_stopped(service_kit::http::shutdown_signal())
        .await
}
