//! The HTTP side every service shares: middleware, health, API docs, serving.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, MatchedPath, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, Request};
use axum::response::Response;
use serde::Serialize;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::ToSchema;
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::problem::{self, InternalCause};
use crate::{ApiError, Json};

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
// The W3C header, as the outbox carries it on to NATS.
const TRACEPARENT: HeaderName = HeaderName::from_static(jetstream_outbox::headers::TRACEPARENT);

/// How much work the HTTP server takes on.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request still running after this long is answered 503.
    pub timeout: Duration,
    /// Requests handled at once; further ones are answered 503 immediately.
    pub max_concurrency: usize,
}

impl From<&crate::config::Common> for Limits {
    fn from(common: &crate::config::Common) -> Self {
        Self {
            timeout: common.http_timeout,
            max_concurrency: common.http_max_concurrency,
        }
    }
}

/// Overload answers: shed or timed-out requests get a 503 problem, never a queue.
async fn overloaded(error: tower::BoxError) -> ApiError {
    if error.is::<tower::load_shed::error::Overloaded>() {
        ApiError::unavailable("the service is overloaded; retry shortly")
    } else if error.is::<tower::timeout::error::Elapsed>() {
        ApiError::unavailable("the request took too long; retry shortly")
    } else {
        ApiError::internal(anyhow::anyhow!(error))
    }
}

/// The OpenAPI document of `router`, with the answers every route can give.
pub fn openapi<S>(router: OpenApiRouter<S>) -> OpenApi
where
    S: Clone + Send + Sync + 'static,
{
    with_common_responses(router.into_openapi())
}

/// Documents, on every operation, the answers the middleware stack and the extractors give
/// whatever the handler: 400 for a path or query that cannot be parsed, 503 when overloaded
/// or a dependency is down, and 413/415 where a body is taken.
fn with_common_responses(mut api: OpenApi) -> OpenApi {
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                problem::CONTENT_TYPE,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    for item in api.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let mut common = vec![
                ("400", "The path, query or body cannot be parsed"),
                (
                    "503",
                    "Overloaded, or a dependency is unreachable; retry later",
                ),
            ];
            if operation.request_body.is_some() {
                common.push(("413", "The body is larger than 64 KiB"));
                common.push(("415", "The body is not application/json"));
            }
            for (status, description) in common {
                operation
                    .responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| problem(description).into());
            }
        }
    }
    api
}

/// Adds `/openapi.json`, `/asyncapi.json` (the events, published under `prefix`), `/docs`, the
/// problem+json fallbacks and the middleware stack.
pub fn finish(router: OpenApiRouter, limits: Limits, prefix: &str) -> Router {
    crate::metrics::handle();
    let (router, api) = router.split_for_parts();
    let events = crate::events::asyncapi(prefix);
    let api = with_common_responses(api);
    router
        .route(
            "/asyncapi.json",
            axum::routing::get(move || std::future::ready(axum::Json(events))),
        )
        .merge(SwaggerUi::new("/docs").url("/openapi.json", api))
        .fallback(problem::not_found)
        .method_not_allowed_fallback(problem::method_not_allowed)
        .layer(axum::middleware::map_response(log_failures))
        .layer(axum::middleware::from_fn(crate::metrics::track_http))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::error_handling::HandleErrorLayer::new(overloaded))
                .load_shed()
                // Router::layer wraps each route: the semaphore must be shared among them.
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
                    limits.max_concurrency,
                ))
                .timeout(limits.timeout),
        )
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(axum::middleware::from_fn(ensure_traceparent))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// Gives every request a W3C `traceparent`: the caller's when valid, else a new trace, so one
/// trace id follows an order from the request through the outbox and NATS into billing.
async fn ensure_traceparent(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let valid = request
        .headers()
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(jetstream_outbox::event::is_traceparent);
    if !valid {
        let trace = uuid::Uuid::new_v4().simple().to_string();
        let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
        if let Ok(value) = format!("00-{trace}-{span}-01").parse() {
            request.headers_mut().insert(TRACEPARENT, value);
        }
    }
    next.run(request).await
}

/// The trace id (32 hex digits) of a W3C traceparent.
pub fn trace_id(traceparent: &str) -> &str {
    traceparent.get(3..35).unwrap_or_default()
}

/// The span of one request, with OpenTelemetry-style field names.
fn request_span<B>(request: &Request<B>) -> tracing::Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str);
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let traceparent = request
        .headers()
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    let span = tracing::info_span!(
        "request",
        otel.name = format!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = route,
        url.path = request.uri().path(),
        request_id,
        trace_id = traceparent.map(trace_id),
    );
    crate::telemetry::continue_trace(&span, traceparent);
    span
}

/// Logs the cause of a 500 (or of a 503 for want of a database connection) inside the request
/// span; the body never carries it.
pub async fn log_failures(response: Response) -> Response {
    if let Some(InternalCause(cause)) = response.extensions().get::<InternalCause>() {
        tracing::error!(error = ?cause, "request failed");
    }
    response
}

/// The W3C `traceparent` to hand on: the request span's own when spans are exported (so the
/// next hop is its child), else the request's.
#[derive(Debug, Clone, Default)]
pub struct TraceParent(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for TraceParent {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = crate::telemetry::current_traceparent().or_else(|| {
            let header = parts.headers.get(TRACEPARENT).and_then(|v| v.to_str().ok());
            header.map(str::to_owned)
        });
        Ok(Self(value))
    }
}

/// What readiness depends on.
#[derive(Debug, Clone)]
pub struct Health {
    /// The service's database.
    pub pool: PgPool,
    /// The NATS connection.
    pub nats: async_nats::Client,
    /// What the broker refused: a missing permission fails readiness.
    pub refusals: crate::infra::Refusals,
}

/// The body of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Status {
    /// `ok` when healthy.
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// `/healthz` and `/readyz`, for any state that holds a [`Health`].
pub fn health_router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Health: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The process is alive", body = Status)))]
async fn healthz() -> Json<Status> {
    Json(Status { status: "ok" })
}

/// The database and NATS are reachable.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready to serve", body = Status),
    (status = 503, description = "A dependency is unreachable", body = problem::Problem,
        content_type = "application/problem+json"),
))]
async fn readyz(State(health): State<Health>) -> Result<Json<Status>, ApiError> {
    let ping = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar!("SELECT 1 AS \"one!\"").fetch_one(&health.pool),
    )
    .await;
    if !matches!(ping, Ok(Ok(_))) {
        return Err(ApiError::unavailable("the database is unreachable"));
    }
    if health.nats.connection_state() != async_nats::connection::State::Connected {
        return Err(ApiError::unavailable("NATS is unreachable"));
    }
    if let Some(refused) = health.refusals.recent() {
        return Err(ApiError::unavailable(format!(
            "NATS refused this service an operation it needs (its identity lacks a \
             permission): {refused}"
        )));
    }
    Ok(Json(Status { status: "ok" }))
}

/// `{service} healthcheck`: asks the service listening on `listen_addr` (an unspecified address
/// such as `0.0.0.0` read as loopback) for `/readyz` and fails unless it answers 200. Container
/// health checks run it: the runtime image has no curl.
pub fn healthcheck(listen_addr: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream, ToSocketAddrs as _};

    let mut addr = listen_addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("LISTEN_ADDR {listen_addr} names no address"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // One write: a request in pieces may be answered, and the connection closed, before its
    // last piece arrives, which resets the connection.
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut status_line = String::new();
    BufReader::new(stream).read_line(&mut status_line)?;
    anyhow::ensure!(
        status_line.starts_with("HTTP/1.1 200 "),
        "not ready: {}",
        status_line.trim_end()
    );
    Ok(())
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
}

/// A background loop (relay, consumer, cleanup) that runs until its token is cancelled.
pub struct BackgroundTask {
    name: &'static str,
    run: Box<dyn FnOnce(CancellationToken) -> futures::future::BoxFuture<'static, ()> + Send>,
}

impl BackgroundTask {
    /// The task `name`, started by calling `run` with the token that stops it.
    pub fn new<F, Fut>(name: &'static str, run: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self {
            name,
            run: Box::new(move |stop| Box::pin(run(stop))),
        }
    }
}

impl std::fmt::Debug for BackgroundTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundTask")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Runs `tasks` and serves `router` until `shutdown` resolves; then stops accepting, finishes
/// in-flight requests, cancels the tasks, waits for each to finish its unit of work, and closes
/// the pool.
///
/// A task that ends before it is told to (it returned, or panicked) stops the service the same
/// way, and the error names it: the process exits non-zero, so its supervisor (Docker,
/// Kubernetes, systemd) restarts it and counts the restart, rather than the service answering
/// `/readyz` while its relay or consumer is gone. A task restarted in the process would hide a
/// fault that recurs, and keep the connections that may have caused it.
pub async fn run_until_stopped(
    listener: TcpListener,
    router: Router,
    pool: PgPool,
    tasks: Vec<BackgroundTask>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let failed = CancellationToken::new();
    let mut running = tokio::task::JoinSet::new();
    let mut names = std::collections::HashMap::new();
    for task in tasks {
        let id = running.spawn((task.run)(stop.clone())).id();
        names.insert(id, task.name);
    }
    let watcher = tokio::spawn(watch_tasks(running, names, stop.clone(), failed.clone()));
    let served = serve(listener, router, async move {
        tokio::select! {
            () = shutdown => {}
            () = failed.cancelled() => {}
        }
    })
    .await;
    stop.cancel();
    let ended_early = watcher.await?;
    pool.close().await;
    served?;
    match ended_early {
        Some(task) => Err(anyhow::anyhow!("background task {task} ended on its own")),
        None => Ok(()),
    }
}

/// Waits for every task of `running`; the first that ends before `stop` (returned or
/// panicked) is logged, cancels `failed`, and is returned.
async fn watch_tasks(
    mut running: tokio::task::JoinSet<()>,
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
    stop: CancellationToken,
    failed: CancellationToken,
) -> Option<String> {
    let mut ended_early = None;
    while let Some(ended) = running.join_next_with_id().await {
        let (id, panic) = match ended {
            Ok((id, ())) => (id, None),
            Err(error) => (error.id(), Some(error.to_string())),
        };
        let task = names.get(&id).copied().unwrap_or("unnamed");
        if let Some(panic) = &panic {
            tracing::error!(task, error = %panic, "background task panicked");
        }
        if !stop.is_cancelled() && ended_early.is_none() {
            tracing::error!(task, "background task ended on its own; the service stops");
            failed.cancel();
            ended_early = Some(panic.map_or(task.to_owned(), |p| format!("{task} ({p})")));
        }
    }
    ended_early
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use tokio_util::sync::CancellationToken;

    use super::{BackgroundTask, healthcheck};

    /// A one-shot server on a free port that answers `status_line`; returns `0.0.0.0:{port}`.
    fn answering(status_line: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut chunk = [0; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut chunk).unwrap();
                assert!(n > 0, "the request ends with an empty line");
                request.extend_from_slice(&chunk[..n]);
            }
            assert!(request.starts_with(b"GET /readyz HTTP/1.1\r\n"));
            write!(conn, "{status_line}\r\ncontent-length: 0\r\n\r\n").unwrap();
        });
        format!("0.0.0.0:{port}")
    }

    /// A background task that ends by itself stops the service, which reports it; one that
    /// runs until told to lets the service stop cleanly.
    #[tokio::test]
    async fn a_task_ending_on_its_own_stops_the_service_with_an_error() {
        let serve = async |tasks: Vec<BackgroundTask>, shutdown: tokio::time::Duration| {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let pool = sqlx::PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/x").unwrap();
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                super::run_until_stopped(
                    listener,
                    axum::Router::new(),
                    pool,
                    tasks,
                    tokio::time::sleep(shutdown),
                ),
            )
            .await
            .expect("the service stops")
        };
        let forever = || {
            BackgroundTask::new("cleanup", |stop: CancellationToken| async move {
                stop.cancelled().await;
            })
        };
        let ended = serve(
            vec![forever(), BackgroundTask::new("relay", |_| async {})],
            tokio::time::Duration::from_secs(3600),
        )
        .await
        .unwrap_err();
        assert!(ended.to_string().contains("relay"), "{ended}");
        let panicked = serve(
            vec![BackgroundTask::new("consumer", |_| async {
                panic!("boom")
            })],
            tokio::time::Duration::from_secs(3600),
        )
        .await
        .unwrap_err();
        assert!(panicked.to_string().contains("consumer"), "{panicked}");
        serve(vec![forever()], tokio::time::Duration::from_millis(50))
            .await
            .expect("a clean stop");
    }

    #[test]
    fn healthcheck_passes_only_on_200() {
        assert!(healthcheck(&answering("HTTP/1.1 200 OK")).is_ok());
        let unready = healthcheck(&answering("HTTP/1.1 503 Service Unavailable")).unwrap_err();
        assert!(unready.to_string().contains("503"), "{unready}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert!(healthcheck(&format!("127.0.0.1:{port}")).is_err());
    }
}
