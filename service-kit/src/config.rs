//! The settings both services read, from the environment (or the same-named flags): one
//! definition each, with its default and its meaning, which `--help` prints and
//! `docs/configuration.md` is generated from. A bad value stops start-up with the variable's
//! name. The stream's limits are the settings of the service that makes it ([`StreamLimits`]).

mod stream;

use std::time::Duration;

use clap::builder::TypedValueParser as _;
use secrecy::{ExposeSecret, SecretString};

use crate::ops_tokens::OpsTokens;

pub use stream::StreamLimits;

/// A variable that is set but unusable, or settings that do not fit together.
#[derive(Debug, thiserror::Error)]
#[error("invalid value for {name}: {reason}")]
pub struct ConfigError {
    /// The environment variable.
    pub name: &'static str,
    /// What is wrong with it.
    pub reason: String,
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

/// A whole number of milliseconds, as the `*_MS` variables are given.
pub fn millis() -> impl clap::builder::TypedValueParser<Value = Duration> {
    clap::value_parser!(u64).map(Duration::from_millis)
}

/// A NATS subject token or stream name: 1-128 of `[A-Za-z0-9_:@-]`, so no `.`, `*`, `>` or
/// whitespace.
pub fn nats_name(value: &str) -> Result<String, String> {
    if jetstream_outbox::event::is_valid_token(value) {
        Ok(value.to_owned())
    } else {
        Err("use 1-128 ASCII letters, digits, '-', '_', ':' or '@'".to_owned())
    }
}

/// A secret: kept out of debug output and of `--help`.
fn secret() -> impl clap::builder::TypedValueParser<Value = SecretString> {
    clap::builder::StringValueParser::new().map(SecretString::from)
}

/// `OPS_TOKENS_FILE`: its path, and the tokens read from it at start-up.
#[derive(Debug, Clone)]
pub struct OpsTokensFile {
    /// Where it was read from.
    pub path: String,
    /// What it holds.
    pub tokens: OpsTokens,
}

fn ops_tokens_file() -> impl clap::builder::TypedValueParser<Value = OpsTokensFile> {
    clap::builder::StringValueParser::new().try_map(|path| {
        // Empty, it is unset ([`Common::without_empty`]).
        let tokens = if path.is_empty() {
            OpsTokens::default()
        } else {
            OpsTokens::read(&path)?
        };
        Ok::<_, String>(OpsTokensFile { path, tokens })
    })
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for a terminal.
    Pretty,
    /// One JSON object per line, for a log collector.
    Json,
}

/// The settings both services read; each service sets its own defaults of `DATABASE_URL` and
/// `LISTEN_ADDR` (see [`with_defaults`]).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Database")]
pub struct Common {
    /// The service's database; created if missing and migrated at start-up, unless
    /// DATABASE_MIGRATE=false.
    #[arg(long, env = "DATABASE_URL", value_parser = secret(), hide_env_values = true)]
    pub database_url: SecretString,
    /// Pool size, shared by request handlers and the work beside them (orders-service's relay
    /// has four connections of its own besides). A request that finds none free within 5 s is
    /// answered 503. Keep it above billing-service's CONSUMER_CONCURRENCY, and mind
    /// PostgreSQL's max_connections across instances.
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub database_max_connections: u32,
    /// Apply the migrations at start-up; false only checks they were applied, and stops
    /// start-up if not (for a role that may not change the schema).
    #[arg(long, env = "DATABASE_MIGRATE", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub database_migrate: bool,

    /// NATS server(s), comma-separated for a cluster; nats://user:password@host or
    /// nats://token@host authenticates, tls:// requires TLS.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222",
          value_parser = secret(), hide_env_values = true, help_heading = "NATS")]
    pub nats_url: SecretString,
    /// The user to authenticate to NATS as (with NATS_PASSWORD): each service an identity of
    /// its own, allowed only its part (deploy/nats/accounts.conf).
    #[arg(long, env = "NATS_USER", help_heading = "NATS")]
    pub nats_user: Option<String>,
    /// NATS_USER's password.
    #[arg(long, env = "NATS_PASSWORD", value_parser = secret(), hide_env_values = true,
          help_heading = "NATS")]
    pub nats_password: Option<SecretString>,
    /// A NATS credentials file (JWT and NKey seed) to authenticate with.
    #[arg(long, env = "NATS_CREDS_FILE", help_heading = "NATS")]
    pub nats_creds_file: Option<String>,
    /// PEM certificates to trust for the server's TLS certificate (a private CA), besides the
    /// system's; setting it requires TLS.
    #[arg(long, env = "NATS_TLS_CA_FILE", help_heading = "NATS")]
    pub nats_tls_ca_file: Option<String>,
    /// The JetStream stream of order events; created or updated by orders-service at start-up.
    #[arg(long = "nats-stream", env = "NATS_STREAM", default_value = "ORDERS",
          value_parser = nats_name, help_heading = "NATS")]
    pub stream: String,
    /// The stream captures {prefix}.>, and events go to {prefix}.{eventType}.{aggregateId}.
    #[arg(long = "nats-subject-prefix", env = "NATS_SUBJECT_PREFIX", default_value = "orders",
          value_parser = nats_name, help_heading = "NATS")]
    pub subject_prefix: String,
    /// The stream's deduplication window, in milliseconds: a copy of a message inside it is
    /// dropped by the broker. orders-service sets it on the stream; give billing-service the
    /// same value, which its INBOX_RETENTION_MS is checked against.
    #[arg(long = "nats-duplicate-window-ms", env = "NATS_DUPLICATE_WINDOW_MS",
          default_value = "120000", value_parser = millis(), help_heading = "NATS")]
    pub duplicate_window: Duration,

    /// Where the HTTP API listens (port 0 picks a free port).
    #[arg(long, env = "LISTEN_ADDR", help_heading = "HTTP")]
    pub listen_addr: String,
    /// Bearer token of the admin endpoints and the console's actions (unset: they answer 403).
    #[arg(long, env = "ADMIN_TOKEN", value_parser = secret(), hide_env_values = true,
          help_heading = "HTTP")]
    pub admin_token: Option<SecretString>,
    /// Bearer token that reads what the admin token reads (the dead events or letters, the
    /// audit log) and may take no action (unset: only the admin token reads them).
    #[arg(long, env = "READ_TOKEN", value_parser = secret(), hide_env_values = true,
          help_heading = "HTTP")]
    pub read_token: Option<SecretString>,
    /// A file of named tokens, one per person or script, so that the audit log says who acted:
    /// a line `<name> <admin|read> <token>` each (tokens of 16 characters or more), `#` for
    /// comments. Read at start-up; besides ADMIN_TOKEN and READ_TOKEN, which may stay unset.
    #[arg(long, env = "OPS_TOKENS_FILE", value_parser = ops_tokens_file(),
          help_heading = "HTTP")]
    pub ops_tokens_file: Option<OpsTokensFile>,
    /// A request still running after this many milliseconds is answered 503.
    #[arg(long = "http-timeout-ms", env = "HTTP_TIMEOUT_MS", default_value = "10000",
          value_parser = millis(), help_heading = "HTTP")]
    pub http_timeout: Duration,
    /// Requests handled at once; further ones are answered 503 at once instead of queueing.
    #[arg(long, env = "HTTP_MAX_CONCURRENCY", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize),
          help_heading = "HTTP")]
    pub http_max_concurrency: usize,

    /// How often the console's charts (`/ops`) sample the service's metrics, in milliseconds;
    /// they keep the last hour (500 to 60000).
    #[arg(long = "ops-history-interval-ms", env = "OPS_HISTORY_INTERVAL_MS",
          default_value = "5000", value_parser = millis(), help_heading = "HTTP")]
    pub ops_history_interval: Duration,

    /// Log lines as human-readable text or JSON; RUST_LOG filters them (default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty,
          help_heading = "Telemetry")]
    pub log_format: LogFormat,
    /// Base http:// URL of an OTLP/HTTP receiver (e.g. http://collector:4318); spans go to
    /// {url}/v1/traces. Unset: no export (the traceparent still travels).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", help_heading = "Telemetry")]
    pub otel_exporter_otlp_endpoint: Option<String>,
    /// The traces URL itself, used as given; wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        help_heading = "Telemetry"
    )]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,
    /// http/protobuf or http/json (gRPC is not built in; for TLS, export to a local
    /// OpenTelemetry Collector that forwards).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", default_value = "http/protobuf",
          value_parser = ["http/protobuf", "http/json"], help_heading = "Telemetry")]
    pub otel_exporter_otlp_protocol: String,
    /// service.name of the exported spans (default: the service's own name).
    #[arg(long, env = "OTEL_SERVICE_NAME", help_heading = "Telemetry")]
    pub otel_service_name: Option<String>,
}

/// `command` with the service's own defaults of `DATABASE_URL` and `LISTEN_ADDR`, and each
/// setting's value shown by its variable's name (`--nats-stream <NATS_STREAM>`), so that a
/// refused value names the variable a reader set.
pub fn with_defaults(
    command: clap::Command,
    database_url: &'static str,
    listen_addr: &'static str,
) -> clap::Command {
    command
        .mut_args(|arg| match arg.get_env().and_then(|env| env.to_str()) {
            Some(env) => {
                let env = env.to_owned();
                arg.value_name(env)
            }
            None => arg,
        })
        .mut_arg("database_url", |arg| {
            arg.default_value(database_url).required(false)
        })
        .mut_arg("listen_addr", |arg| {
            arg.default_value(listen_addr).required(false)
        })
}

impl Common {
    /// The named tokens of `OPS_TOKENS_FILE`; none when it is unset.
    pub fn ops_tokens(&self) -> &OpsTokens {
        static NONE: OpsTokens = OpsTokens(Vec::new());
        self.ops_tokens_file
            .as_ref()
            .map_or(&NONE, |file| &file.tokens)
    }

    /// The settings with every optional one set to an empty value taken as unset, as a
    /// compose file's `VAR: ${VAR:-}` sets it (clap takes an empty variable as a value).
    #[must_use]
    pub fn without_empty(mut self) -> Self {
        let empty = |value: &Option<String>| value.as_deref().is_some_and(str::is_empty);
        for value in [
            &mut self.nats_user,
            &mut self.nats_creds_file,
            &mut self.nats_tls_ca_file,
            &mut self.otel_exporter_otlp_endpoint,
            &mut self.otel_exporter_otlp_traces_endpoint,
            &mut self.otel_service_name,
        ] {
            if empty(value) {
                *value = None;
            }
        }
        if self
            .ops_tokens_file
            .as_ref()
            .is_some_and(|file| file.path.is_empty())
        {
            self.ops_tokens_file = None;
        }
        for secret in [
            &mut self.admin_token,
            &mut self.read_token,
            &mut self.nats_password,
        ] {
            if secret
                .as_ref()
                .is_some_and(|value| value.expose_secret().is_empty())
            {
                *secret = None;
            }
        }
        self
    }

    /// Checks what one variable's parser cannot: the settings together.
    pub fn check(&self) -> Result<(), ConfigError> {
        ensure(
            "NATS_PASSWORD",
            self.nats_user.is_some() == self.nats_password.is_some(),
            "NATS_USER and NATS_PASSWORD go together",
        )?;
        ensure(
            "READ_TOKEN",
            !(self.read_token.is_some()
                && self.read_token.as_ref().map(ExposeSecret::expose_secret)
                    == self.admin_token.as_ref().map(ExposeSecret::expose_secret)),
            "must differ from ADMIN_TOKEN, or a reader could act",
        )?;
        if let Some(file) = &self.ops_tokens_file {
            let shared = [&self.admin_token, &self.read_token]
                .into_iter()
                .flatten()
                .any(|token| file.tokens.holds(token.expose_secret()));
            ensure(
                "OPS_TOKENS_FILE",
                !shared,
                "a token of the file is ADMIN_TOKEN's or READ_TOKEN's: the audit log could not \
                 tell who acted",
            )?;
        }
        ensure(
            "HTTP_TIMEOUT_MS",
            !self.http_timeout.is_zero(),
            "must be positive",
        )?;
        ensure(
            "OPS_HISTORY_INTERVAL_MS",
            (Duration::from_millis(500)..=Duration::from_secs(60))
                .contains(&self.ops_history_interval),
            "must be between 500 and 60000",
        )?;
        ensure(
            "NATS_DUPLICATE_WINDOW_MS",
            !self.duplicate_window.is_zero(),
            "must be positive",
        )?;
        self.otlp().map(drop)
    }

    /// The database URL (a secret: for connecting, not for logs).
    pub fn database_url(&self) -> &str {
        self.database_url.expose_secret()
    }

    /// The NATS URL(s) (a secret: they may hold a password).
    pub fn nats_url(&self) -> &str {
        self.nats_url.expose_secret()
    }

    /// Span export, when an endpoint is set.
    pub fn otlp(&self) -> Result<Option<Otlp>, ConfigError> {
        Otlp::from_values(
            self.otel_exporter_otlp_traces_endpoint.clone(),
            self.otel_exporter_otlp_endpoint.clone(),
            Some(self.otel_exporter_otlp_protocol.as_str()),
            self.otel_service_name.clone(),
        )
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
    use clap::{CommandFactory as _, FromArgMatches as _};

    use super::*;

    /// The shared settings alone, as a service's command holds them.
    #[derive(Debug, clap::Parser)]
    struct Only {
        #[command(flatten)]
        common: Common,
    }

    /// The settings from `args` alone: the variables the test runner sets are not read.
    fn parse(args: &[&str]) -> Result<Common, clap::Error> {
        let command = with_defaults(Only::command(), "postgres://db/x", "127.0.0.1:0")
            .mut_args(|arg| arg.env(None));
        let matches =
            command.try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))?;
        Only::from_arg_matches(&matches).map(|only| only.common)
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let common = parse(&[
            "--database-url",
            "postgres://u:hunter2@h/db",
            "--admin-token",
            "t0ken",
        ])
        .unwrap();
        let debug = format!("{common:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("t0ken"),
            "{debug}"
        );
        assert_eq!(common.database_url(), "postgres://u:hunter2@h/db");
    }

    #[test]
    fn urls_are_redacted_for_logs() {
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
    }

    #[test]
    fn an_empty_optional_setting_is_unset() {
        let common = parse(&["--admin-token", "", "--otel-exporter-otlp-endpoint", ""])
            .unwrap()
            .without_empty();
        assert!(common.admin_token.is_none());
        assert_eq!(common.otlp().unwrap(), None);
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_variable() {
        let error = parse(&["--http-max-concurrency", "0"]).unwrap_err();
        assert!(
            error.to_string().contains("HTTP_MAX_CONCURRENCY"),
            "{error}"
        );
        let error = parse(&["--nats-stream", "a.b"]).unwrap_err();
        assert!(error.to_string().contains("NATS_STREAM"), "{error}");
    }

    #[test]
    fn a_tokens_file_is_read_at_start_up_naming_its_variable() {
        let path = std::env::temp_dir().join(format!("ops-tokens-{}", std::process::id()));
        let path_text = path.to_str().unwrap();
        std::fs::write(&path, "ada admin ada-0123456789abcdef\n").unwrap();
        let common = parse(&["--ops-tokens-file", path_text]).unwrap();
        assert_eq!(common.ops_tokens().0[0].name, "ada");
        common.check().unwrap();
        // Ada's token given as ADMIN_TOKEN too: the audit log could not tell who acted.
        let shared = parse(&[
            "--ops-tokens-file",
            path_text,
            "--admin-token",
            "ada-0123456789abcdef",
        ])
        .unwrap();
        assert_eq!(shared.check().unwrap_err().name, "OPS_TOKENS_FILE");

        std::fs::write(&path, "ada owner ada-0123456789abcdef\n").unwrap();
        let error = parse(&["--ops-tokens-file", path_text])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("OPS_TOKENS_FILE") && error.contains("line 1: the role"),
            "{error}"
        );
        assert!(!error.contains("0123456789abcdef"), "{error}");
        std::fs::remove_file(&path).unwrap();
        let error = parse(&["--ops-tokens-file", path_text])
            .unwrap_err()
            .to_string();
        assert!(error.contains("OPS_TOKENS_FILE"), "{error}");
        let unset = parse(&["--ops-tokens-file", ""]).unwrap().without_empty();
        assert!(unset.ops_tokens_file.is_none());
    }

    #[test]
    fn the_defaults_are_the_services_own() {
        let common = parse(&[]).unwrap();
        assert_eq!(common.database_url(), "postgres://db/x");
        assert_eq!(common.listen_addr, "127.0.0.1:0");
        assert_eq!(common.duplicate_window, Duration::from_secs(120));
        assert_eq!(common.log_format, LogFormat::Pretty);
        common.check().unwrap();
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
    }
}
