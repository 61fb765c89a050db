//! billing-service settings: from the environment (or the same-named flags), each defined once
//! with its default and meaning; `billing-service --help` lists them, and
//! `docs/configuration.md` is generated from them.

use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::{CommandFactory as _, FromArgMatches as _};
use service_kit::config::{Common, ConfigError, ensure, millis, nats_name};

/// billing-service's command line: a subcommand, or none to serve.
#[derive(Debug, clap::Parser)]
#[command(
    name = "billing-service",
    version,
    about = "A REST API for invoices, made from order events consumed from NATS JetStream \
             through an inbox: exactly one invoice per order.",
    long_about = "A REST API for invoices, made from order events consumed from NATS JetStream \
                  through an inbox: exactly one invoice per order.\n\nConfigured by environment \
                  variables (or the flags of the same names); each is listed below with its \
                  default. Without a subcommand it serves until SIGTERM or Ctrl-C."
)]
pub struct Cli {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Subcommand>,
    #[command(flatten)]
    settings: Settings,
}

/// What the binary can do besides serving.
#[derive(Debug, Clone, Copy, clap::Subcommand)]
pub enum Subcommand {
    /// Asks the running service's /readyz and fails unless it answers 200 (container health
    /// checks; the image has no curl).
    Healthcheck,
    /// Applies the migrations to DATABASE_URL and exits (as the database's owner, before
    /// running the service as a role that may not change the schema).
    Migrate,
}

impl Cli {
    /// Parses the command line and the environment; exits with clap's message on a bad value
    /// (naming it) or after `--help` and `--version`.
    pub fn parse() -> Self {
        let matches = command().get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
    }

    /// The settings, checked together.
    pub fn config(self) -> Result<Config, ConfigError> {
        self.settings.into_config()
    }
}

/// The command with billing-service's defaults.
pub fn command() -> clap::Command {
    service_kit::config::with_defaults(
        Cli::command(),
        "postgres://postgres@127.0.0.1:5432/billing",
        "127.0.0.1:8081",
    )
}

/// Every setting, as given.
#[derive(Debug, Clone, clap::Args)]
struct Settings {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    consumer: ConsumerConfig,
    /// Inbox records are kept this many milliseconds (a day's partition at a time): a copy of
    /// a message older than that is dead-lettered, never applied. Must exceed
    /// NATS_DUPLICATE_WINDOW_MS + CONSUMER_ACK_WAIT_MS + CONSUMER_RETRY_DELAY_MS x
    /// CONSUMER_MAX_RETRIES, the longest the broker redelivers a message (checked at start-up).
    #[arg(long = "inbox-retention-ms", env = "INBOX_RETENTION_MS", default_value = "604800000",
          value_parser = millis(), help_heading = "Consumer")]
    inbox_retention: Duration,
}

/// Everything billing-service reads at start-up, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Settings shared with orders-service.
    pub common: Common,
    /// How the consumer treats messages.
    pub consumer: ConsumerConfig,
    /// `INBOX_RETENTION_MS`: inbox records are deleted after this long. It must exceed the
    /// stream's duplicate window plus the redelivery horizon, or a late copy of a message would
    /// be applied again.
    pub inbox_retention: Duration,
}

/// The JetStream consumer's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Consumer")]
pub struct ConsumerConfig {
    /// The durable consumer's name, also the inbox's consumer key.
    #[arg(long = "nats-consumer", env = "NATS_CONSUMER", default_value = "billing",
          value_parser = nats_name)]
    pub name: String,
    /// Redelivery after this many milliseconds without an ack.
    #[arg(long = "consumer-ack-wait-ms", env = "CONSUMER_ACK_WAIT_MS", default_value = "30000",
          value_parser = millis())]
    pub ack_wait: Duration,
    /// Delay before a message that cannot be applied yet (or met a transient error) is
    /// delivered again, in milliseconds.
    #[arg(long = "consumer-retry-delay-ms", env = "CONSUMER_RETRY_DELAY_MS",
          default_value = "1000", value_parser = millis())]
    pub retry_delay: Duration,
    /// "Not applicable yet" outcomes after which a message is dead-lettered; redeliveries for
    /// other reasons do not count, and database errors never dead-letter.
    #[arg(long = "consumer-max-retries", env = "CONSUMER_MAX_RETRIES", default_value_t = 100,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub max_retries: i64,
    /// Messages pulled per request (1 to 10000).
    #[arg(long = "consumer-batch", env = "CONSUMER_BATCH", default_value_t = 256,
          value_parser = clap::value_parser!(u16).range(1..=10_000).map(usize::from))]
    pub batch: usize,
    /// Most transactions at once (1 to 256): one runs whenever messages wait and takes all of
    /// them, another starts only when a full batch of other orders' messages waits.
    #[arg(long = "consumer-concurrency", env = "CONSUMER_CONCURRENCY", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=256).map(usize::from))]
    pub concurrency: usize,
    /// Most messages applied in one transaction (1 to 1000; 1: a transaction per message).
    #[arg(long = "consumer-apply-batch", env = "CONSUMER_APPLY_BATCH", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=1000).map(usize::from))]
    pub apply_batch: usize,
}

impl Config {
    /// Reads the environment alone (no command line); the error names the offending variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        let matches = command()
            .try_get_matches_from(["billing-service"])
            .map_err(|error| ConfigError {
                name: "environment",
                reason: error.to_string(),
            })?;
        let cli = Cli::from_arg_matches(&matches).map_err(|error| ConfigError {
            name: "environment",
            reason: error.to_string(),
        })?;
        cli.config()
    }
}

impl Settings {
    fn into_config(mut self) -> Result<Config, ConfigError> {
        self.common = self.common.without_empty();
        let config = Config {
            common: self.common,
            consumer: self.consumer,
            inbox_retention: self.inbox_retention,
        };
        config.check()?;
        Ok(config)
    }
}

impl Config {
    /// The rules between settings, which reading them applies: also for a configuration
    /// changed after it was read (a test's, a program's): `App::build` checks it.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.common.check()?;
        let consumer = &self.consumer;
        ensure(
            "CONSUMER_ACK_WAIT_MS",
            consumer.ack_wait >= Duration::from_secs(1),
            "must be at least 1000",
        )?;
        let horizon = self.common.duplicate_window
            + consumer.ack_wait
            + consumer
                .retry_delay
                .saturating_mul(u32::try_from(consumer.max_retries).unwrap_or(u32::MAX));
        ensure(
            "INBOX_RETENTION_MS",
            self.inbox_retention > horizon,
            &format!(
                "must exceed NATS_DUPLICATE_WINDOW_MS + CONSUMER_ACK_WAIT_MS + \
                 CONSUMER_RETRY_DELAY_MS x CONSUMER_MAX_RETRIES ({} ms)",
                horizon.as_millis()
            ),
        )
    }
}
