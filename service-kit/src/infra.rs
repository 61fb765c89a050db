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

/// The pool settings every pool of the services shares.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
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
    /// A credentials file (JWT + NKey seed).
    pub creds_file: Option<String>,
    /// PEM certificates to trust for the server's TLS certificate; setting it requires TLS.
    pub tls_ca_file: Option<String>,
}

impl From<&crate::config::Common> for NatsSecurity {
    fn from(common: &crate::config::Common) -> Self {
        Self {
            creds_file: common.nats_creds_file.clone(),
            tls_ca_file: common.nats_tls_ca_file.clone(),
        }
    }
}

/// Connects to NATS with nothing but what `urls` says; see [`connect_nats_with`].
pub async fn connect_nats(urls: &str, name: &str) -> anyhow::Result<async_nats::Client> {
    connect_nats_with(urls, name, &NatsSecurity::default()).await
}

/// Connects to NATS, failing start-up when no server is reachable. `urls` may list several
/// servers of a cluster, separated by commas; `user:password@` or `token@` in a URL
/// authenticates (async-nats itself ignores credentials in URLs); a `tls://` URL requires TLS.
pub async fn connect_nats_with(
    urls: &str,
    name: &str,
    security: &NatsSecurity,
) -> anyhow::Result<async_nats::Client> {
    let servers: Vec<async_nats::ServerAddr> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse()
                .map_err(|_| anyhow::anyhow!("NATS_URL holds an invalid URL"))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut options = async_nats::ConnectOptions::new().name(name);
    if let Some(server) = servers.iter().find(|s| s.username().is_some()) {
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

/// The stream of `common`: `{prefix}.>`, its duplicate window, replicas and limits.
pub fn stream_spec(common: &crate::config::Common) -> jetstream_outbox::publisher::StreamSpec {
    let mut spec = jetstream_outbox::publisher::StreamSpec::new(
        &common.stream,
        vec![format!("{}.>", common.subject_prefix)],
    );
    spec.duplicate_window = common.duplicate_window;
    spec.replicas = common.stream_replicas;
    spec.max_age = common.stream_max_age;
    spec.max_bytes = common.stream_max_bytes;
    spec
}

/// Creates or updates the stream of `common` (file storage, `{prefix}.>`), retrying while
/// JetStream does not answer yet (see [`at_start_up`]).
pub async fn ensure_stream(
    jetstream: &async_nats::jetstream::Context,
    common: &crate::config::Common,
) -> anyhow::Result<()> {
    let spec = stream_spec(common);
    at_start_up("the stream set up", || {
        jetstream_outbox::publisher::ensure_stream(jetstream, &spec)
    })
    .await?;
    Ok(())
}

/// How long start-up waits for JetStream to answer: a broker (or a cluster) restarting, its
/// stream between leaders, answers within it.
pub const START_UP_WAIT: Duration = Duration::from_secs(60);

/// Runs `attempt` until it succeeds, for up to [`START_UP_WAIT`], pausing between failures (up
/// to 2 s) and logging each; then fails with the last error. For the broker requests of
/// start-up: a service started beside a broker that is still recovering waits for it rather
/// than exit.
pub async fn at_start_up<T, E, F, Fut>(what: &str, mut attempt: F) -> Result<T, E>
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
            Err(error) if tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(error = %error, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(error) => return Err(error),
        }
    }
}
