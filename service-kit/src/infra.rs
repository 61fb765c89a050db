//! Connections made at start-up: PostgreSQL (creating the database if missing) and NATS.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions as _, PgPool};

/// Idle time after which a pooled connection is pinged before it is handed out.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Connects to `url`, creating its database first if it does not exist: a pool that opens
/// connections as they are asked for, up to `max_connections`.
pub async fn connect_db(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    connect(url, pool_options().max_connections(max_connections)).await
}

/// [`connect_db`] for background work that should not wait for a connection to be made: all
/// `connections` are opened now and kept (no idle timeout, no maximum lifetime, which would
/// retire them all at once); only one that breaks is made again. Making one takes sqlx a long
/// while over TLS, even to a local server (docs/performance.md), time a relay would otherwise
/// spend not publishing.
pub async fn connect_db_open(url: &str, connections: u32) -> anyhow::Result<PgPool> {
    let options = pool_options()
        .max_connections(connections)
        .min_connections(connections)
        .idle_timeout(None)
        .max_lifetime(None);
    connect(url, options).await
}

/// How long a request waits for a pooled connection before its 503 (stated in
/// `DATABASE_MAX_CONNECTIONS`' help and in operations.md).
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The pool settings every pool of the services shares.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // sqlx pings every connection it hands out, a round trip per transaction (a fifth of
        // an order's). A connection used moments ago is alive; one idle for longer may have
        // been cut (a database restart, a firewall), and is pinged and replaced if so.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Connects `pool` to `url`, creating its database first if it does not exist.
async fn connect(url: &str, pool: PgPoolOptions) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url
        .parse()
        .context("DATABASE_URL is not a valid PostgreSQL URL")?;
    // Connect first: a least-privileged role may not look at other databases, and only a
    // database that does not exist needs the server's `postgres` database.
    match pool.clone().connect_with(options.clone()).await {
        Err(e) if sql_state(&e).as_deref() == Some("3D000") => {
            create_database(&options).await?;
            pool.connect_with(options).await
        }
        connected => connected,
    }
    .context("cannot connect to DATABASE_URL")
}

/// The SQLSTATE of a database error.
fn sql_state(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .map(std::borrow::Cow::into_owned)
}

/// Applies `migrations` when `apply`, else checks they were applied (by an owner role): a
/// service running as a role that may not change the schema stops at start-up, saying so.
pub async fn prepare_schema(
    pool: &PgPool,
    apply: bool,
    migrations: Vec<(&'static str, Migrator)>,
) -> anyhow::Result<()> {
    for (name, migrator) in migrations {
        if apply {
            jetstream_outbox::migrate::run(migrator, pool)
                .await
                .with_context(|| format!("{name} migrations failed"))?;
        } else {
            jetstream_outbox::migrate::verify(&migrator, pool)
                .await
                .with_context(|| {
                    format!(
                        "DATABASE_MIGRATE=false but the {name} migrations are not all applied; \
                         apply them as the database owner (DATABASE_MIGRATE=true)"
                    )
                })?;
        }
    }
    Ok(())
}

/// Creates the database named in `options` through the server's `postgres` database.
async fn create_database(options: &PgConnectOptions) -> anyhow::Result<()> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let mut admin = options
        .clone()
        .database("postgres")
        .connect()
        .await
        .context("cannot connect to the PostgreSQL server of DATABASE_URL")?;
    let sql = format!(r#"CREATE DATABASE "{}""#, name.replace('"', "\"\""));
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut admin)
        .await
    {
        Ok(_) => tracing::info!(database = %name, "created database"),
        // Another instance created it at the same moment.
        Err(e) if sql_state(&e).as_deref() == Some("42P04") => {}
        Err(e) => return Err(e).context(format!("cannot create database {name}")),
    }
    Ok(())
}

/// How to authenticate to NATS and which TLS certificates to trust, beyond the URL.
#[derive(Debug, Clone, Default)]
pub struct NatsSecurity {
    /// A user and password.
    pub user: Option<(String, secrecy::SecretString)>,
    /// A credentials file (JWT + NKey seed).
    pub creds_file: Option<String>,
    /// PEM certificates to trust for the server's TLS certificate; setting it requires TLS.
    pub tls_ca_file: Option<String>,
}

impl From<&crate::config::Common> for NatsSecurity {
    fn from(common: &crate::config::Common) -> Self {
        Self {
            user: common.nats_user.clone().zip(common.nats_password.clone()),
            creds_file: common.nats_creds_file.clone(),
            tls_ca_file: common.nats_tls_ca_file.clone(),
        }
    }
}

/// Connects to NATS with nothing but what `urls` says; see [`connect_nats_with`].
pub async fn connect_nats(urls: &str, name: &str) -> anyhow::Result<async_nats::Client> {
    connect_nats_with(urls, name, &NatsSecurity::default()).await
}

/// What the broker refused this process, most recent first: a missing permission names the
/// subject, which start-up errors and `/readyz` repeat.
#[derive(Debug, Clone, Default)]
pub struct Refusals(std::sync::Arc<std::sync::Mutex<Option<(std::time::Instant, String)>>>);

impl Refusals {
    /// How long a refusal keeps `/readyz` failing after the last one.
    const FRESH: Duration = Duration::from_secs(60);

    fn note(&self, what: String) {
        tracing::error!(refusal = %what, "the broker refused an operation of this service");
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((std::time::Instant::now(), what));
    }

    /// The latest refusal, when it is recent.
    pub fn recent(&self) -> Option<String> {
        let last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref()
            .filter(|(at, _)| at.elapsed() < Self::FRESH)
            .map(|(_, what)| what.clone())
    }
}

/// [`connect_nats_with`], also watching what the broker refuses (see [`Refusals`]).
pub async fn connect_nats_watched(
    urls: &str,
    name: &str,
    security: &NatsSecurity,
) -> anyhow::Result<(async_nats::Client, Refusals)> {
    let refusals = Refusals::default();
    let client = connect_nats_as(urls, name, security, Some(refusals.clone())).await?;
    Ok((client, refusals))
}

/// Connects to NATS, failing start-up when no server is reachable. `urls` may list several
/// servers of a cluster, separated by commas; `user:password@` or `token@` in a URL
/// authenticates (async-nats itself ignores credentials in URLs); a `tls://` URL requires TLS.
/// Replies come to inboxes under `_INBOX.{name}`, which a least-privileged identity may be
/// allowed alone (deploy/nats/accounts.conf).
pub async fn connect_nats_with(
    urls: &str,
    name: &str,
    security: &NatsSecurity,
) -> anyhow::Result<async_nats::Client> {
    connect_nats_as(urls, name, security, None).await
}

async fn connect_nats_as(
    urls: &str,
    name: &str,
    security: &NatsSecurity,
    refusals: Option<Refusals>,
) -> anyhow::Result<async_nats::Client> {
    // async-nats builds its TLS on rustls's process-wide provider, which rustls cannot pick
    // itself once both of its backends are compiled in (jetstream-outbox's `wal` feature
    // brings the second): ring, as the rest of the workspace uses. Installed once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let servers: Vec<async_nats::ServerAddr> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse()
                .map_err(|_| anyhow::anyhow!("NATS_URL holds an invalid URL"))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .custom_inbox_prefix(format!("_INBOX.{name}"));
    if let Some(refusals) = refusals {
        options = options.event_callback(move |event| {
            let refusals = refusals.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let text = error.to_string();
                    if text.to_lowercase().contains("permission") {
                        refusals.note(text);
                    }
                }
            }
        });
    }
    if let Some((user, password)) = &security.user {
        options = options.user_and_password(
            user.clone(),
            secrecy::ExposeSecret::expose_secret(password).to_owned(),
        );
    } else if let Some(server) = servers.iter().find(|s| s.username().is_some()) {
        let user = server.username().unwrap_or_default().to_owned();
        options = match server.password() {
            Some(password) => options.user_and_password(user, password.to_owned()),
            None => options.token(user),
        };
    }
    if let Some(path) = &security.creds_file {
        options = options
            .credentials_file(path)
            .await
            .context("cannot read NATS_CREDS_FILE")?;
    }
    if let Some(path) = &security.tls_ca_file {
        anyhow::ensure!(
            std::path::Path::new(path).is_file(),
            "NATS_TLS_CA_FILE: no file at {path}"
        );
        options = options.add_root_certificates(path.into()).require_tls(true);
    }
    options
        .connect(servers)
        .await
        .context("cannot connect to NATS_URL")
}

/// The stream of `common` (`{prefix}.>`, its duplicate window) with `limits`.
pub fn stream_spec(
    common: &crate::config::Common,
    limits: &crate::config::StreamLimits,
) -> jetstream_outbox::publisher::StreamSpec {
    let mut spec = jetstream_outbox::publisher::StreamSpec::new(
        &common.stream,
        vec![format!("{}.>", common.subject_prefix)],
    );
    spec.duplicate_window = common.duplicate_window;
    spec.replicas = limits.replicas;
    spec.max_age = limits.max_age;
    spec.max_bytes = limits.max_bytes;
    spec
}

/// Waits (see [`at_start_up`]) for the stream of `common` to exist: for a service that
/// consumes it and may not create it.
pub async fn await_stream(
    jetstream: &async_nats::jetstream::Context,
    common: &crate::config::Common,
    refusals: &Refusals,
) -> anyhow::Result<()> {
    let found = || jetstream.get_stream(&common.stream);
    at_start_up_unless_refused("the stream found", found, refusals).await?;
    Ok(())
}

/// Creates or updates the stream of `spec` (see [`stream_spec`]), retrying while JetStream
/// does not answer yet (see [`at_start_up`]).
pub async fn ensure_stream(
    jetstream: &async_nats::jetstream::Context,
    spec: &jetstream_outbox::publisher::StreamSpec,
    refusals: &Refusals,
) -> anyhow::Result<()> {
    let set_up = || jetstream_outbox::publisher::ensure_stream(jetstream, spec);
    at_start_up_unless_refused("the stream set up", set_up, refusals).await?;
    Ok(())
}

/// How long start-up waits for JetStream to answer: a broker (or a cluster) restarting, its
/// stream between leaders, answers within it.
pub const START_UP_WAIT: Duration = Duration::from_secs(60);

/// Runs `attempt` until it succeeds, for up to [`START_UP_WAIT`], pausing between failures (up
/// to 2 s) and logging each; then fails with the last error. For the broker requests of
/// start-up: a service started beside a broker that is still recovering waits for it rather
/// than exit.
pub async fn at_start_up<T, E, F, Fut>(what: &str, attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    at_start_up_unless_refused(what, attempt, &Refusals::default()).await
}

/// [`at_start_up`], giving up at once when the broker refused this service an operation
/// (a permission its identity lacks): no retry grants it.
pub async fn at_start_up_unless_refused<T, E, F, Fut>(
    what: &str,
    mut attempt: F,
    refusals: &Refusals,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + START_UP_WAIT;
    let mut pause = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(error)
                if tokio::time::Instant::now() + pause < deadline
                    && refusals.recent().is_none() =>
            {
                tracing::warn!(error = %error, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(error) => return Err(error),
        }
    }
}
