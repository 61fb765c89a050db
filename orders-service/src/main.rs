use orders_service::{App, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    // The container health check: `{service} healthcheck` asks the running service's /readyz.
    if std::env::args().nth(1).as_deref() == Some("healthcheck") {
        return service_kit::http::healthcheck(&config.common.listen_addr);
    }
    let _telemetry = service_kit::telemetry::init(
        &config.common.log_format,
        config.common.otlp.as_ref(),
        "orders-service",
    )?;
    App::build(config)
        .await?
        .run_until_stopped(service_kit::http::shutdown_signal())
        .await
}
