//! orders-service settings: from the environment (or the same-named flags), each defined once
//! with its default and meaning; `orders-service --help` lists them, and
//! `docs/configuration.md` is generated from them.

use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _};
use jetstream_outbox::{Backoff, RelayConfig};
use service_kit::config::{Common, ConfigError, StreamLimits, ensure, millis};

/// orders-service's command line: a subcommand, or none to serve.
#[derive(Debug, clap::Parser)]
#[command(
    name = "orders-service",
    version,
    about = "A REST API for orders whose events are published to NATS JetStream through a \
             transactional outbox.",
    long_about = "A REST API for orders whose events are published to NATS JetStream through a \
                  transactional outbox.\n\nConfigured by environment variables (or the flags of \
                  the same names); each is listed below with its default. Without a subcommand \
                  it serves until SIGTERM or Ctrl-C."
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

/// The command with orders-service's defaults.
pub fn command() -> clap::Command {
    service_kit::config::with_defaults(
        Cli::command(),
        "postgres://postgres@127.0.0.1:5432/orders",
        "127.0.0.1:8080",
    )
}

/// Every setting, as given.
#[derive(Debug, Clone, clap::Args)]
struct Settings {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    stream: StreamLimits,
    /// Run the relay in this process; false: commits are announced to other instances'
    /// relays with a NOTIFY after each commit (coalesced).
    #[arg(long, env = "RELAY_ENABLED", default_value_t = true, action = clap::ArgAction::Set,
          help_heading = "Relay")]
    relay_enabled: bool,
    /// Most rows claimed per relay pass (1 to 10000).
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(1..=10_000), help_heading = "Relay")]
    relay_batch_size: i64,
    /// Publishes the broker refused (over its max payload, rejected by the stream) before an
    /// event is dead and parks its order; an unreachable, slow or full broker never counts.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 10,
          value_parser = clap::value_parser!(i32).range(1..), help_heading = "Relay")]
    relay_max_attempts: i32,
    /// Fallback wait between passes when idle, in milliseconds (commits wake the relay at
    /// once).
    #[arg(long = "relay-poll-interval-ms", env = "RELAY_POLL_INTERVAL_MS", default_value = "500",
          value_parser = millis(), help_heading = "Relay")]
    relay_poll_interval: Duration,
    /// Retry delay after the broker's first refusal of an event, in milliseconds (doubling,
    /// with jitter).
    #[arg(long = "relay-backoff-base-ms", env = "RELAY_BACKOFF_BASE_MS", default_value = "100",
          value_parser = millis(), help_heading = "Relay")]
    relay_backoff_base: Duration,
    /// The longest retry delay after refusals, in milliseconds.
    #[arg(long = "relay-backoff-max-ms", env = "RELAY_BACKOFF_MAX_MS", default_value = "60000",
          value_parser = millis(), help_heading = "Relay")]
    relay_backoff_max: Duration,
    /// Longest a relay pass holds its claimed rows, in milliseconds: PostgreSQL ends the
    /// session of a relay silent for longer, so a relay cut off lets its rows go. More than
    /// four times NATS_PUBLISH_TIMEOUT_MS per 4096 rows of RELAY_BATCH_SIZE.
    #[arg(long = "relay-lease-ms", env = "RELAY_LEASE_MS", default_value = "30000",
          value_parser = millis(), help_heading = "Relay")]
    relay_lease: Duration,
    /// Longest wait for one PubAck, in milliseconds.
    #[arg(long = "nats-publish-timeout-ms", env = "NATS_PUBLISH_TIMEOUT_MS",
          default_value = "5000", value_parser = millis(), help_heading = "Relay")]
    nats_publish_timeout: Duration,
    /// Wake the relay from this logical replication slot at each commit that enqueued events,
    /// whichever process made it (a SQL `outbox_enqueue` in another application too); created
    /// when missing. Needs wal_level = logical, a role with REPLICATION, RELAY_ENABLED=true,
    /// and a DATABASE_URL naming its user (no Unix socket, no client certificate). Instances
    /// given one name share it: one streams and its relay is woken, the others poll and stand
    /// by to take over. 1-63 lower-case letters, digits or '_'. Unset: off.
    #[arg(long, env = "RELAY_WAL_SLOT", value_parser = wal_slot, help_heading = "Relay")]
    relay_wal_slot: Option<String>,
    /// Published events are kept this many milliseconds (at most 676800000, 188 hours): for
    /// operators, and to publish again what the broker lost; 0 deletes each event as it is
    /// published, keeping nothing to repair from.
    #[arg(long = "outbox-retention-ms", env = "OUTBOX_RETENTION_MS", default_value = "86400000",
          value_parser = millis(), help_heading = "Relay")]
    outbox_retention: Duration,
}

/// Everything orders-service reads at start-up, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Settings shared with billing-service.
    pub common: Common,
    /// The stream's replicas and limits, which orders-service makes it with.
    pub stream: StreamLimits,
    /// The relay's behaviour.
    pub relay: RelayConfig,
    /// `RELAY_ENABLED`: run the relay in this process (default true).
    pub relay_enabled: bool,
    /// `RELAY_WAL_SLOT`: the replication slot that wakes the relay, if any.
    pub relay_wal_slot: Option<String>,
    /// `NATS_PUBLISH_TIMEOUT_MS`: the longest wait for one PubAck.
    pub publish_timeout: Duration,
    /// `OUTBOX_RETENTION_MS`: published and skipped events are aged out after this long (at
    /// most 188 hours); with 0 the relay deletes events as it publishes them.
    pub outbox_retention: Duration,
}

impl Config {
    /// Reads the environment alone (no command line); the error names the offending variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        let matches = command()
            .try_get_matches_from(["orders-service"])
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
        let mut relay = RelayConfig::new(&self.common.subject_prefix, "/orders-service");
        relay.batch_size = self.relay_batch_size;
        relay.max_attempts = self.relay_max_attempts;
        relay.poll_interval = self.relay_poll_interval;
        relay.backoff = Backoff::new(self.relay_backoff_base, self.relay_backoff_max);
        relay.lease = self.relay_lease;
        relay.delete_published = self.outbox_retention.is_zero();
        let config = Config {
            common: self.common,
            stream: self.stream,
            relay,
            relay_enabled: self.relay_enabled,
            relay_wal_slot: self.relay_wal_slot,
            publish_timeout: self.nats_publish_timeout,
            outbox_retention: self.outbox_retention,
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
        self.stream.check(&self.common)?;
        ensure(
            "OUTBOX_RETENTION_MS",
            self.outbox_retention <= jetstream_outbox::outbox::MAX_RETENTION,
            "must be at most 676800000 (188 hours: the ring of published events' partitions)",
        )?;
        ensure(
            "NATS_PUBLISH_TIMEOUT_MS",
            !self.publish_timeout.is_zero(),
            "must be positive",
        )?;
        // A pass starts waves for half the lease, and one wave takes up to a send and its
        // acknowledgements (a timeout each) per publish window its batch fills: the lease must
        // hold the last wave with room to spare.
        let windows = self
            .relay
            .batch_size
            .unsigned_abs()
            .div_ceil(jetstream_outbox::JetStreamPublisher::DEFAULT_WINDOW as u64)
            .max(1) as u32;
        ensure(
            "RELAY_LEASE_MS",
            self.relay.lease > 4 * windows * self.publish_timeout,
            "must be more than four times NATS_PUBLISH_TIMEOUT_MS per 4096 rows of RELAY_BATCH_SIZE",
        )?;
        ensure(
            "RELAY_WAL_SLOT",
            self.relay_enabled || self.relay_wal_slot.is_none(),
            "wakes this process's relay: unset it where RELAY_ENABLED=false",
        )
    }
}

/// A replication slot's name, as `jetstream_outbox::wal` takes it.
fn wal_slot(value: &str) -> Result<String, String> {
    jetstream_outbox::wal::checked_name(value).map_err(|_| {
        "use 1-63 lower-case letters, digits or '_' (a PostgreSQL replication slot's name)"
            .to_owned()
    })
}
