//! Settings from the environment. A bad value stops start-up with the variable's name.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

/// A variable that is set but unusable.
#[derive(Debug, thiserror::Error)]
#[error("invalid value for {name}: {reason}")]
pub struct ConfigError {
    /// The environment variable.
    pub name: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// The variable's value, or `default` when it is unset or empty.
pub fn string(name: &'static str, default: &str) -> String {
    optional(name).unwrap_or_else(|| default.to_owned())
}

/// The variable's value, `None` when unset or empty.
pub fn optional(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The variable parsed as `T`, or `default` when unset.
pub fn parse<T>(name: &'static str, default: T) -> Result<T, ConfigError>
where
    T: FromStr,
    T::Err: Display,
{
    parse_value(name, optional(name), default)
}

/// `raw` (the value of variable `name`) parsed as `T`, or `default` when absent.
fn parse_value<T>(name: &'static str, raw: Option<String>, default: T) -> Result<T, ConfigError>
where
    T: FromStr,
    T::Err: Display,
{
    match raw {
        None => Ok(default),
        Some(raw) => raw.parse().map_err(|e: T::Err| ConfigError {
            name,
            reason: format!("{raw:?}: {e}"),
        }),
    }
}

/// The variable as a whole number of milliseconds, or `default`.
pub fn millis(name: &'static str, default: Duration) -> Result<Duration, ConfigError> {
    let default_ms = u64::try_from(default.as_millis()).unwrap_or(u64::MAX);
    parse(name, default_ms).map(Duration::from_millis)
}

/// A NATS subject token or stream name: no `.`, `*`, `>` or whitespace.
pub fn nats_name(name: &'static str, default: &str) -> Result<String, ConfigError> {
    let value = string(name, default);
    if jetstream_outbox::event::is_valid_token(&value) {
        Ok(value)
    } else {
        Err(ConfigError {
            name,
            reason: format!("{value:?}: use 1-128 ASCII letters, digits, '-', '_', ':' or '@'"),
        })
    }
}

/// Fails with the variable's name unless `check` holds.
pub fn ensure(name: &'static str, check: bool, reason: &str) -> Result<(), ConfigError> {
    if check {
        Ok(())
    } else {
        Err(ConfigError {
            name,
            reason: reason.to_owned(),
        })
    }
}

/// The settings both services read, with the service's own defaults.
#[derive(Clone)]
pub struct Common {
    /// `DATABASE_URL`: the service's database; created at start-up if missing.
    pub database_url: String,
    /// `DATABASE_MAX_CONNECTIONS`: pool size, shared by request handlers and the background
    /// tasks beside them (orders' relay has a pool of its own besides).
    pub database_max_connections: u32,
    /// `DATABASE_MIGRATE`: apply migrations at start-up (`true`), or only check they were
    /// applied (`false`, for a role that may not change the schema).
    pub database_migrate: bool,
    /// `NATS_URL`.
    pub nats_url: String,
    /// `NATS_CREDS_FILE`: a credentials file (JWT + NKey seed) to authenticate with.
    pub nats_creds_file: Option<String>,
    /// `NATS_TLS_CA_FILE`: PEM certificates to trust for the server's TLS certificate, besides
    /// the system's; setting it requires TLS.
    pub nats_tls_ca_file: Option<String>,
    /// `LISTEN_ADDR`: where the HTTP API listens (`127.0.0.1:0` picks a free port).
    pub listen_addr: String,
    /// `NATS_STREAM`: the JetStream stream of order events.
    pub stream: String,
    /// `NATS_SUBJECT_PREFIX`: the stream captures `{prefix}.>`.
    pub subject_prefix: String,
    /// `NATS_DUPLICATE_WINDOW_MS`: the stream's deduplication window.
    pub duplicate_window: Duration,
    /// `NATS_STREAM_REPLICAS`: stream replicas in a cluster.
    pub stream_replicas: usize,
    /// `NATS_STREAM_MAX_AGE_MS`: the stream removes messages stored longer ago (0: never);
    /// defaults to billing's inbox retention, seven days.
    pub stream_max_age: Duration,
    /// `NATS_STREAM_MAX_BYTES`: the stream removes its oldest messages beyond this size
    /// (unset: no limit).
    pub stream_max_bytes: Option<u64>,
    /// `ADMIN_TOKEN`: bearer token of the admin endpoints; unset disables them.
    pub admin_token: Option<String>,
    /// `LOG_FORMAT`: `json` or `pretty`.
    pub log_format: String,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and friends: where spans are exported; unset exports none.
    pub otlp: Option<Otlp>,
    /// `HTTP_TIMEOUT_MS`: a request still running after this long is answered 503.
    pub http_timeout: Duration,
    /// `HTTP_MAX_CONCURRENCY`: requests handled at once; more are shed with 503 at once.
    pub http_max_concurrency: usize,
}

/// Secrets stay out of debug output: URL passwords and the admin token are redacted.
impl std::fmt::Debug for Common {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Common")
            .field("database_url", &redact_url(&self.database_url))
            .field("database_max_connections", &self.database_max_connections)
            .field("database_migrate", &self.database_migrate)
            .field("nats_url", &redact_url(&self.nats_url))
            .field("nats_creds_file", &self.nats_creds_file)
            .field("nats_tls_ca_file", &self.nats_tls_ca_file)
            .field("listen_addr", &self.listen_addr)
            .field("stream", &self.stream)
            .field("subject_prefix", &self.subject_prefix)
            .field("duplicate_window", &self.duplicate_window)
            .field("stream_replicas", &self.stream_replicas)
            .field("stream_max_age", &self.stream_max_age)
            .field("stream_max_bytes", &self.stream_max_bytes)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("log_format", &self.log_format)
            .field("otlp", &self.otlp)
            .field("http_timeout", &self.http_timeout)
            .field("http_max_concurrency", &self.http_max_concurrency)
            .finish()
    }
}

/// `url` with the password (or a lone token) of its user-info replaced by `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let user = rest[..at].split_once(':').map_or("", |(user, _)| user);
    format!("{scheme}://{user}:<redacted>@{}", &rest[at + 1..])
}

impl Common {
    /// Reads the shared settings; `database` and `listen_addr` are the service's defaults.
    pub fn from_env(database: &str, listen_addr: &str) -> Result<Self, ConfigError> {
        let common = Self {
            database_url: string("DATABASE_URL", database),
            database_max_connections: parse("DATABASE_MAX_CONNECTIONS", 20)?,
            database_migrate: parse("DATABASE_MIGRATE", true)?,
            nats_url: string("NATS_URL", "nats://127.0.0.1:4222"),
            nats_creds_file: optional("NATS_CREDS_FILE"),
            nats_tls_ca_file: optional("NATS_TLS_CA_FILE"),
            listen_addr: string("LISTEN_ADDR", listen_addr),
            stream: nats_name("NATS_STREAM", "ORDERS")?,
            subject_prefix: nats_name("NATS_SUBJECT_PREFIX", "orders")?,
            duplicate_window: millis("NATS_DUPLICATE_WINDOW_MS", Duration::from_secs(120))?,
            stream_replicas: parse("NATS_STREAM_REPLICAS", 1)?,
            stream_max_age: millis("NATS_STREAM_MAX_AGE_MS", Duration::from_secs(7 * 24 * 3600))?,
            stream_max_bytes: optional("NATS_STREAM_MAX_BYTES")
                .map(|raw| {
                    raw.parse()
                        .map_err(|e: std::num::ParseIntError| ConfigError {
                            name: "NATS_STREAM_MAX_BYTES",
                            reason: format!("{raw:?}: {e}"),
                        })
                })
                .transpose()?,
            admin_token: optional("ADMIN_TOKEN"),
            log_format: string("LOG_FORMAT", "pretty"),
            otlp: Otlp::from_env()?,
            http_timeout: millis("HTTP_TIMEOUT_MS", Duration::from_secs(10))?,
            http_max_concurrency: parse("HTTP_MAX_CONCURRENCY", 1024)?,
        };
        ensure(
            "HTTP_TIMEOUT_MS",
            !common.http_timeout.is_zero(),
            "must be positive",
        )?;
        ensure(
            "HTTP_MAX_CONCURRENCY",
            common.http_max_concurrency > 0,
            "must be at least 1",
        )?;
        ensure(
            "DATABASE_MAX_CONNECTIONS",
            common.database_max_connections > 0,
            "must be at least 1",
        )?;
        ensure(
            "NATS_STREAM_REPLICAS",
            (1..=5).contains(&common.stream_replicas),
            "must be 1 to 5",
        )?;
        ensure(
            "NATS_DUPLICATE_WINDOW_MS",
            !common.duplicate_window.is_zero(),
            "must be positive",
        )?;
        ensure(
            "NATS_STREAM_MAX_AGE_MS",
            common.stream_max_age.is_zero() || common.stream_max_age >= common.duplicate_window,
            "must be 0 (no limit) or at least NATS_DUPLICATE_WINDOW_MS (JetStream's rule)",
        )?;
        Ok(common)
    }
}

/// OTLP/HTTP span export, configured by the standard OpenTelemetry variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Otlp {
    /// The traces URL: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended.
    pub endpoint: String,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (default) or `http/json`.
    pub json: bool,
    /// `OTEL_SERVICE_NAME`, if set; otherwise the service's own name.
    pub service_name: Option<String>,
}

impl Otlp {
    /// Reads the exporter's variables; `None` when no endpoint is set.
    fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::from_values(
            optional("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            optional("OTEL_EXPORTER_OTLP_ENDPOINT"),
            optional("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref(),
            optional("OTEL_SERVICE_NAME"),
        )
    }

    /// The settings from the variables' values, checked.
    fn from_values(
        traces_endpoint: Option<String>,
        endpoint: Option<String>,
        protocol: Option<&str>,
        service_name: Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        let (name, endpoint) = match (traces_endpoint, endpoint) {
            (Some(url), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url),
            (None, Some(base)) => (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("{}/v1/traces", base.trim_end_matches('/')),
            ),
            (None, None) => return Ok(None),
        };
        let host = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| ConfigError {
                name,
                reason: format!(
                    "{endpoint:?}: must be an http:// URL of an OTLP/HTTP receiver (port 4318); \
                     for TLS, export to a local OpenTelemetry Collector that forwards over TLS"
                ),
            })?;
        ensure(
            name,
            !host.is_empty() && !host.starts_with('/'),
            "has no host",
        )?;
        let json = match protocol {
            None | Some("http/protobuf") => false,
            Some("http/json") => true,
            Some(other) => {
                return Err(ConfigError {
                    name: "OTEL_EXPORTER_OTLP_PROTOCOL",
                    reason: format!(
                        "{other:?}: must be http/protobuf or http/json (gRPC is not built in)"
                    ),
                });
            }
        };
        Ok(Some(Self {
            endpoint,
            json,
            service_name,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:hunter2@db:5432/orders"),
            "postgres://app:<redacted>@db:5432/orders"
        );
        assert_eq!(
            redact_url("nats://s3cret@nats:4222"),
            "nats://:<redacted>@nats:4222"
        );
        assert_eq!(
            redact_url("postgres://db/x?user=a"),
            "postgres://db/x?user=a"
        );
        let mut common = Common::from_env("postgres://u:hunter2@h/db", "127.0.0.1:0").unwrap();
        common.admin_token = Some("t0ken".into());
        common.database_url = "postgres://u:hunter2@h/db".into();
        let debug = format!("{common:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("t0ken"),
            "{debug}"
        );
    }

    #[test]
    fn parse_error_names_the_variable() {
        let err = parse_value::<u32>("RELAY_BATCH_SIZE", Some("twelve".into()), 1).unwrap_err();
        assert_eq!(err.name, "RELAY_BATCH_SIZE");
        assert!(
            err.to_string()
                .starts_with("invalid value for RELAY_BATCH_SIZE"),
            "{err}"
        );
    }

    #[test]
    fn absent_means_default_and_present_is_parsed() {
        assert_eq!(parse_value("X", None, 7_u32).unwrap(), 7);
        assert_eq!(parse_value("X", Some("42".into()), 7_u32).unwrap(), 42);
        assert_eq!(
            millis("SERVICE_KIT_TEST_UNSET", Duration::from_secs(2))
                .unwrap()
                .as_secs(),
            2
        );
    }

    #[test]
    fn otlp_is_off_without_an_endpoint_and_checked_with_one() {
        let otlp = |traces: Option<&str>, base: Option<&str>, protocol: Option<&str>| {
            Otlp::from_values(
                traces.map(str::to_owned),
                base.map(str::to_owned),
                protocol,
                None,
            )
        };
        assert_eq!(otlp(None, None, Some("grpc")).unwrap(), None);
        let base = otlp(None, Some("http://collector:4318/"), None)
            .unwrap()
            .unwrap();
        assert_eq!(base.endpoint, "http://collector:4318/v1/traces");
        assert!(!base.json);
        let traces = otlp(
            Some("http://c:4318/x"),
            Some("http://ignored"),
            Some("http/json"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint, "http://c:4318/x");
        assert!(traces.json);

        let tls = otlp(None, Some("https://collector:4318"), None).unwrap_err();
        assert_eq!(tls.name, "OTEL_EXPORTER_OTLP_ENDPOINT");
        let no_host = otlp(Some("http:///v1/traces"), None, None).unwrap_err();
        assert_eq!(no_host.name, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let grpc = otlp(None, Some("http://c:4317"), Some("grpc")).unwrap_err();
        assert_eq!(grpc.name, "OTEL_EXPORTER_OTLP_PROTOCOL");
    }
}
