//! The command line: where the service is, the token, and one command.

use secrecy::SecretString;

/// The admin API of orders-service or billing-service: their dead events or letters, the
/// actions on them, and the audit log of those actions.
///
/// Which service answers at --url is asked of it (its /openapi.json): orders-service's dead
/// events are retried (published again) or skipped; billing-service's dead letters are
/// replayed (applied again through the inbox) or skipped. `stats` needs no token; reading the
/// dead items and the audit log needs any of the service's tokens (READ_TOKEN, ADMIN_TOKEN, one
/// of OPS_TOKENS_FILE); acting needs one that acts (ADMIN_TOKEN, or an admin of
/// OPS_TOKENS_FILE), and each action is recorded in the service's audit log under the token's
/// name (`admin` for ADMIN_TOKEN).
#[derive(Debug, clap::Parser)]
#[command(name = "opsctl", version)]
pub(crate) struct Cli {
    /// The service's base URL, http:// only: opsctl speaks plain HTTP to the service itself,
    /// not to a TLS proxy in front of it.
    #[arg(
        long,
        env = "OPS_URL",
        default_value = "http://127.0.0.1:8080",
        value_name = "OPS_URL",
        global = true
    )]
    pub(crate) url: String,
    /// A token of the service: its ADMIN_TOKEN, its READ_TOKEN to read only, or one of its
    /// OPS_TOKENS_FILE.
    #[arg(long, env = "OPS_TOKEN", hide_env_values = true, value_name = "OPS_TOKEN",
          value_parser = secret(), global = true)]
    pub(crate) token: Option<SecretString>,
    /// Print the service's JSON answers as they are, one per line, instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// A secret: kept out of debug output and of `--help`.
fn secret() -> impl clap::builder::TypedValueParser<Value = SecretString> {
    clap::builder::TypedValueParser::map(
        clap::builder::StringValueParser::new(),
        SecretString::from,
    )
}

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// The service's counts: the outbox's or the inbox's, and how far behind it is.
    Stats,
    /// The dead events (orders) or open dead letters (billing), oldest first.
    List {
        #[command(flatten)]
        filters: Filters,
        /// At most this many (1-200).
        #[arg(long, default_value_t = 50,
              value_parser = clap::value_parser!(i64).range(1..=200))]
        limit: i64,
    },
    /// The dead items grouped by type and error, the largest group first.
    Groups,
    /// One dead event or letter, every field of it (its headers and body for a letter).
    Show {
        /// Its id (an event's UUID, a letter's number).
        id: String,
    },
    /// Publish a dead event again (orders), or apply a dead letter again (billing).
    Retry {
        /// Its id.
        id: String,
    },
    /// Give up on a dead event or letter: kept as skipped, never applied.
    Skip {
        /// Its id.
        id: String,
    },
    /// Retry or replay every dead item the filters match, after showing how many and which.
    RetryAll {
        #[command(flatten)]
        filters: Filters,
        /// Act without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Skip every dead item the filters match, after showing how many and which.
    SkipAll {
        #[command(flatten)]
        filters: Filters,
        /// Act without asking.
        #[arg(long)]
        yes: bool,
    },
    /// The latest operator actions, newest first.
    Audit {
        /// At most this many (1-200).
        #[arg(long, default_value_t = 20,
              value_parser = clap::value_parser!(i64).range(1..=200))]
        limit: i64,
    },
}

/// Which dead items: those matching every filter given.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct Filters {
    /// Only events of this aggregate type (orders-service only).
    #[arg(long)]
    pub(crate) aggregate_type: Option<String>,
    /// Only this event type.
    #[arg(long)]
    pub(crate) event_type: Option<String>,
    /// Only those whose error contains this text.
    #[arg(long)]
    pub(crate) error_contains: Option<String>,
    /// Only those whose error is of this class (as too-large or invalid-payload: `groups`
    /// names them).
    #[arg(long)]
    pub(crate) error_class: Option<String>,
    /// Only events of this aggregate (orders-service only).
    #[arg(long)]
    pub(crate) aggregate_id: Option<String>,
    /// Only those from this time on (RFC 3339, as 2026-12-06T09:00:00Z): an event's enqueue,
    /// a letter's dead-lettering.
    #[arg(long, value_name = "TIME")]
    pub(crate) since: Option<String>,
    /// Only those before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub(crate) until: Option<String>,
}

impl Filters {
    /// As query parameters.
    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        [
            ("aggregateType", &self.aggregate_type),
            ("eventType", &self.event_type),
            ("errorContains", &self.error_contains),
            ("errorClass", &self.error_class),
            ("aggregateId", &self.aggregate_id),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.clone().map(|value| (key, value)))
        .collect()
    }
}
