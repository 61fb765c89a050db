//! Building and running the service: the zero-to-production shape, so tests start the real
//! app on port 0 with their own database and stream.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;

use async_nats::jetstream::context::ContextBuilder;
use axum::Router;
use axum::extract::FromRef;
use jetstream_outbox::{
    Cleanup, JetStreamPublisher, RELAY_CONNECTIONS, Relay, StreamRepair, Wakeup,
    relay::RelayHealth,
    wal::{SlotLag, WalWakeup},
};
use service_kit::admin::{AdminSecurity, AdminToken};
use service_kit::history::{History, Refresh};
use service_kit::http::{self, BackgroundTask, Health};
use service_kit::infra;
use service_kit::metrics::Cached;
use service_kit::reuse::Connections;
use service_kit::startup::{Base, Stream};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::{Config, console, orders, outbox_api};

/// What handlers share.
#[derive(Debug, Clone, FromRef)]
pub struct AppState {
    /// The orders database (orders and outbox).
    pub pool: PgPool,
    /// The `/orders` requests' connections, of `pool`, handed from one request to the next.
    pub connections: Connections,
    /// Told after every commit that enqueued events.
    pub wakeup: Wakeup,
    /// What readiness checks.
    pub health: Health,
    /// The admin endpoints' token.
    pub admin: AdminToken,
    /// The outbox gauges of `/metrics`, computed at most once per second.
    pub gauges: Arc<Cached<jetstream_outbox::OutboxStats>>,
    /// The last hour of the console's charts.
    pub history: History,
    /// With `RELAY_WAL_SLOT`, the slot's lag as last read, which the stats show.
    pub wal_lag: Option<SlotLag>,
    /// With a relay in this process, its gauges of the broker's state, which the stats show.
    pub relay_health: Option<RelayHealth>,
}

#[derive(OpenApi)]
#[openapi(modifiers(&AdminSecurity), info(
    title = "orders-service",
    description = "Orders whose events are published through a transactional outbox. The events \
                   on NATS: [/asyncapi.json](/asyncapi.json) (AsyncAPI 3)."
))]
struct ApiDoc;

/// Every route, with its OpenAPI description.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(orders::router())
        .merge(outbox_api::router())
        .merge(http::health_router())
}

/// The generated OpenAPI document, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    http::openapi(api())
}

/// The whole HTTP API, for events published under `prefix`.
pub fn router(state: AppState, limits: http::Limits, prefix: &str) -> Router {
    http::finish(api().with_state(state), limits, prefix)
}

/// The migrations of this service's database: the `jetstream-outbox` outbox tables, the audit
/// log of operator actions, and its own.
pub fn migrations() -> Vec<(&'static str, Migrator)> {
    vec![
        ("outbox", jetstream_outbox::migrate::outbox_migrations()),
        ("ops", service_kit::audit::migrations()),
        ("orders", sqlx::migrate!("../migrations/orders")),
    ]
}

/// Applies [`migrations`].
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    infra::prepare_schema(pool, true, migrations()).await
}

/// A built service, listening but not yet serving.
#[derive(Debug)]
pub struct App {
    base: Base,
    router: Router,
    relay: Option<Relay<JetStreamPublisher>>,
    /// Wakes the relay from a replication slot (`RELAY_WAL_SLOT`).
    wal_wakeup: Option<WalWakeup>,
    cleanup: Cleanup,
    /// The console's charts and how their gauges are brought up to date.
    history: (History, Refresh),
}

impl App {
    /// Checks the configuration ([`Config::check`]), connects (creating the database if
    /// missing), migrates, sets up the stream and binds.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        config.check()?;
        service_kit::metrics::handle();
        outbox_api::describe_metrics();
        let base = Base::build(
            &config.common,
            "orders-service",
            migrations(),
            Stream::Manage(&config.stream),
        )
        .await?;
        let pool = base.pool.clone();
        let jetstream = ContextBuilder::new()
            .timeout(config.publish_timeout)
            .build(base.nats.clone());
        // The relay of this process is woken through memory; without one, the relays of other
        // instances are told with a NOTIFY sent after each commit (see jetstream_outbox::wakeup).
        let wakeup = if config.relay_enabled {
            Wakeup::in_process()
        } else {
            Wakeup::across_processes(pool.clone())
        };
        // The relay's connections are its own, all open: it does not wait for requests to give
        // one back, nor for one to be made (only after losing one).
        let relay = if config.relay_enabled {
            let relay_pool =
                infra::connect_db_open(config.common.database_url(), RELAY_CONNECTIONS).await?;
            // The stream is checked for what the broker forgot, and made again if deleted.
            let repair = StreamRepair::new(
                jetstream.clone(),
                infra::stream_spec(&config.common, &config.stream),
            );
            Some(
                Relay::new(
                    relay_pool,
                    JetStreamPublisher::new(jetstream).with_timeout(config.publish_timeout),
                    config.relay.clone(),
                )
                .with_wakeup(&wakeup)
                .with_repair(repair),
            )
        } else {
            None
        };
        let wal_wakeup = match (&config.relay_wal_slot, &relay) {
            (Some(slot), Some(_)) => {
                let wal = WalWakeup::new(config.common.database_url(), slot, &wakeup)
                    .context("RELAY_WAL_SLOT: DATABASE_URL cannot stream a slot")?;
                wal.check(&pool).await.context("RELAY_WAL_SLOT")?;
                Some(wal)
            }
            _ => None,
        };
        let history = History::new(console::OPS.charts, config.common.ops_history_interval);
        let state = AppState {
            connections: Connections::for_requests(pool.clone()),
            pool: pool.clone(),
            wakeup,
            health: base.health(),
            admin: AdminToken::new(config.common.admin_token.as_ref())
                .with_read(config.common.read_token.as_ref())
                .with_named(config.common.ops_tokens()),
            gauges: Arc::new(Cached::new(service_kit::metrics::GAUGE_INTERVAL)),
            history: history.clone(),
            wal_lag: wal_wakeup.as_ref().map(WalWakeup::lag),
            relay_health: relay.as_ref().map(Relay::health),
        };
        let refresh = console::refresh(state.clone());
        let router = router(
            state,
            http::Limits::from(&config.common),
            &config.common.subject_prefix,
        );
        Ok(Self {
            base,
            router,
            relay,
            wal_wakeup,
            cleanup: Cleanup::outbox(pool, config.outbox_retention),
            history: (history, refresh),
        })
    }

    /// The port the API listens on.
    pub fn port(&self) -> u16 {
        self.base.port()
    }

    /// The database pool, for tests that check rows.
    pub fn pool(&self) -> &PgPool {
        &self.base.pool
    }

    /// Serves until `shutdown` resolves: stops accepting, finishes in-flight requests, lets the
    /// relay finish its batch, then returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        // In the service's own log target: scripts find the port in this line.
        tracing::info!(port = self.port(), "orders-service listening");
        let cleanup = self.cleanup;
        let (history, refresh) = self.history;
        let mut tasks = vec![
            BackgroundTask::new("cleanup", |stop| cleanup.run(stop)),
            BackgroundTask::new("console history", |stop| history.run(refresh, stop)),
        ];
        if let Some(relay) = self.relay {
            tasks.push(BackgroundTask::new("relay", |stop| relay.run(stop)));
        }
        if let Some(wal) = self.wal_wakeup {
            let pool = self.base.pool.clone();
            tasks.push(BackgroundTask::new("WAL wake-up", |stop| async move {
                // Only what the start-up checked can end it: the task's end stops the service.
                if let Err(error) = wal.run(pool, stop).await {
                    tracing::error!(error = %error, "the WAL wake-up stopped");
                }
            }));
        }
        self.base
            .run_until_stopped(self.router, tasks, shutdown)
            .await
    }
}
