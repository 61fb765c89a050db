//! What every service's start-up shares: the connections and the listener made before its own
//! parts, and serving with its background tasks until stopped.

use std::future::Future;

use anyhow::Context as _;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use tokio::net::TcpListener;

use crate::config::{Common, StreamLimits};
use crate::http::{self, BackgroundTask, Health};
use crate::infra;

/// A service's database (migrated), NATS connection (stream in place) and bound listener.
#[derive(Debug)]
pub struct Base {
    /// The service's database.
    pub pool: PgPool,
    /// The NATS connection, named after the service.
    pub nats: async_nats::Client,
    /// What the broker refused this service.
    pub refusals: infra::Refusals,
    listener: TcpListener,
}

/// What a service does with its stream at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream<'a> {
    /// Creates it with these limits, or updates it to them (the publisher's identity manages
    /// it).
    Manage(&'a StreamLimits),
    /// Waits for it to exist (a consumer's identity may only read it).
    Await,
}

impl Base {
    /// Connects to `DATABASE_URL` (creating the database if missing) and applies or checks
    /// `migrations`, connects to NATS as `service`, creates or updates the stream (or waits for
    /// it, as `stream` says), and binds `LISTEN_ADDR`.
    pub async fn build(
        common: &Common,
        service: &str,
        migrations: Vec<(&'static str, Migrator)>,
        stream: Stream<'_>,
    ) -> anyhow::Result<Self> {
        let pool =
            infra::connect_db(common.database_url(), common.database_max_connections).await?;
        infra::prepare_schema(&pool, common.database_migrate, migrations).await?;
        let (nats, refusals) = infra::connect_nats_watched(
            common.nats_url(),
            service,
            &infra::NatsSecurity::from(common),
        )
        .await?;
        let jetstream = async_nats::jetstream::new(nats.clone());
        let ready = match stream {
            Stream::Manage(limits) => {
                let spec = infra::stream_spec(common, limits);
                infra::ensure_stream(&jetstream, &spec, &refusals).await
            }
            Stream::Await => infra::await_stream(&jetstream, common, &refusals).await,
        };
        if let Err(error) = ready {
            return Err(match refusals.recent() {
                Some(refused) => error.context(format!("NATS refused this service: {refused}")),
                None => error,
            });
        }
        let listener = TcpListener::bind(&common.listen_addr)
            .await
            .with_context(|| format!("cannot listen on LISTEN_ADDR={}", common.listen_addr))?;
        Ok(Self {
            pool,
            nats,
            refusals,
            listener,
        })
    }

    /// What readiness checks: the database and NATS.
    pub fn health(&self) -> Health {
        Health {
            pool: self.pool.clone(),
            nats: self.nats.clone(),
            refusals: self.refusals.clone(),
        }
    }

    /// The port the API listens on.
    pub fn port(&self) -> u16 {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
    }

    /// Serves `router` and runs `tasks` until `shutdown` resolves, as
    /// [`http::run_until_stopped`] does.
    pub async fn run_until_stopped(
        self,
        router: axum::Router,
        tasks: Vec<BackgroundTask>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        http::run_until_stopped(self.listener, router, self.pool, tasks, shutdown).await
    }
}
