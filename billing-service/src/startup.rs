//! Building and running the service: the zero-to-production shape, so tests start the real
//! app on port 0 with their own database and stream.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::FromRef;
use jetstream_outbox::{Cleanup, Inbox};
use service_kit::admin::{AdminSecurity, AdminToken};
use service_kit::history::{History, Refresh};
use service_kit::http::{self, BackgroundTask, Health};
use service_kit::infra;
use service_kit::metrics::Cached;
use service_kit::startup::{Base, Stream};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::consumer::{Consumer, Rules};
use crate::durable::Durable;
use crate::lag::ConsumerLag;
use crate::quarantine::Sweep;
use crate::{Config, console, inbox_api, invoices};

/// What handlers share.
#[derive(Debug, Clone, FromRef)]
pub struct AppState {
    /// The billing database (invoices and inbox).
    pub pool: PgPool,
    /// How messages are applied (also used to replay dead letters).
    pub rules: Rules,
    /// What readiness checks.
    pub health: Health,
    /// The admin endpoints' token.
    pub admin: AdminToken,
    /// The inbox gauge of `/metrics`, computed at most once per second.
    pub gauges: Arc<Cached<jetstream_outbox::inbox::InboxStats>>,
    /// The durable consumer's lag.
    pub lag: ConsumerLag,
    /// The last hour of the console's charts.
    pub history: History,
}

#[derive(OpenApi)]
#[openapi(modifiers(&AdminSecurity), info(
    title = "billing-service",
    description = "Invoices made from order events, exactly one per order. The events it \
                   consumes: [/asyncapi.json](/asyncapi.json) (AsyncAPI 3)."
))]
struct ApiDoc;

/// Every route, with its OpenAPI description.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(invoices::router())
        .merge(inbox_api::router())
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

/// The migrations of this service's database: the `jetstream-outbox` inbox tables, the audit
/// log of operator actions, and its own.
pub fn migrations() -> Vec<(&'static str, Migrator)> {
    vec![
        ("inbox", jetstream_outbox::migrate::inbox_migrations()),
        ("ops", service_kit::audit::migrations()),
        ("billing", sqlx::migrate!("../migrations/billing")),
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
    consumer: Consumer,
    cleanup: Cleanup,
    /// The console's charts and how their gauges are brought up to date.
    history: (History, Refresh),
}

impl App {
    /// Checks the configuration ([`Config::check`]), connects (creating the database if
    /// missing), migrates, sets up the stream, binds, and creates or updates the durable
    /// consumer.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        config.check()?;
        service_kit::metrics::handle();
        inbox_api::describe_metrics();
        crate::failpoints::warn_if_armed();
        let common = &config.common;
        let base = Base::build(common, "billing-service", migrations(), Stream::Await).await?;
        let pool = base.pool.clone();
        let jetstream = async_nats::jetstream::new(base.nats.clone());
        let durable = infra::at_start_up("the durable consumer created", || {
            Durable::create(
                jetstream.clone(),
                &common.stream,
                format!("{}.>", common.subject_prefix),
                &config.consumer,
            )
        })
        .await
        .context("cannot create the durable consumer")?;
        let lag = ConsumerLag::new(
            jetstream.clone(),
            &common.stream,
            &config.consumer.name,
            format!("{}.>", common.subject_prefix),
        );
        let inbox = Inbox::new(pool.clone(), &config.consumer.name);
        let cleanup = Cleanup::inbox(inbox.clone(), config.inbox_retention);
        let sweep = Sweep::new(
            jetstream,
            &common.stream,
            &config.consumer.name,
            inbox.clone(),
        );
        let rules = Rules::new(inbox, config.consumer.max_retries);
        let consumer = Consumer::new(
            durable,
            rules.clone(),
            config.consumer.clone(),
            config.inbox_retention,
            common.duplicate_window,
            sweep,
        );
        let history = History::new(console::OPS.charts, common.ops_history_interval);
        let state = AppState {
            pool,
            rules,
            health: base.health(),
            admin: AdminToken::new(common.admin_token.as_ref())
                .with_read(common.read_token.as_ref())
                .with_named(common.ops_tokens()),
            gauges: Arc::new(Cached::new(service_kit::metrics::GAUGE_INTERVAL)),
            lag,
            history: history.clone(),
        };
        let refresh = console::refresh(state.clone());
        let router = router(state, http::Limits::from(common), &common.subject_prefix);
        Ok(Self {
            base,
            router,
            consumer,
            cleanup,
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
    /// consumer finish and acknowledge the message in hand, then returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        // In the service's own log target: scripts find the port in this line.
        tracing::info!(port = self.port(), "billing-service listening");
        let (consumer, cleanup) = (self.consumer, self.cleanup);
        let (history, refresh) = self.history;
        let tasks = vec![
            BackgroundTask::new("consumer", |stop| consumer.run(stop)),
            BackgroundTask::new("cleanup", |stop| cleanup.run(stop)),
            BackgroundTask::new("console history", |stop| history.run(refresh, stop)),
        ];
        self.base
            .run_until_stopped(self.router, tasks, shutdown)
            .await
    }
}
