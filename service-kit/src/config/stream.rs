//! The stream's limits: settings of the service that makes the stream (orders-service) alone,
//! so that a service that only reads it does not list what it would ignore.

use std::time::Duration;

use clap::builder::TypedValueParser as _;

use super::{Common, ConfigError, ensure, millis};

/// How many replicas the stream has and what it keeps.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct StreamLimits {
    /// Stream replicas in a cluster (1 to 5).
    #[arg(long = "nats-stream-replicas", env = "NATS_STREAM_REPLICAS", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=5).map(usize::from),
          help_heading = "NATS")]
    pub replicas: usize,
    /// The stream removes messages stored longer ago than this many milliseconds (0: never;
    /// else at least NATS_DUPLICATE_WINDOW_MS). Best equal to billing's INBOX_RETENTION_MS (see
    /// "Sizing and retentions" in docs/operations.md).
    #[arg(long = "nats-stream-max-age-ms", env = "NATS_STREAM_MAX_AGE_MS",
          default_value = "604800000", value_parser = millis(), help_heading = "NATS")]
    pub max_age: Duration,
    /// The stream removes its oldest messages beyond this many bytes (unset: no limit).
    #[arg(
        long = "nats-stream-max-bytes",
        env = "NATS_STREAM_MAX_BYTES",
        help_heading = "NATS"
    )]
    pub max_bytes: Option<u64>,
}

impl Default for StreamLimits {
    /// The settings' defaults: one replica, seven days, no limit of bytes.
    fn default() -> Self {
        Self {
            replicas: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: None,
        }
    }
}

impl StreamLimits {
    /// Checks what one variable's parser cannot: the limits with the shared settings.
    pub fn check(&self, common: &Common) -> Result<(), ConfigError> {
        ensure(
            "NATS_STREAM_MAX_AGE_MS",
            self.max_age.is_zero() || self.max_age >= common.duplicate_window,
            "must be 0 (no limit) or at least NATS_DUPLICATE_WINDOW_MS (JetStream's rule)",
        )
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, FromArgMatches as _};

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Only {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        limits: StreamLimits,
    }

    /// The settings from `args` alone: the variables the test runner sets are not read.
    fn parse(args: &[&str]) -> Result<(Common, StreamLimits), clap::Error> {
        let command = super::super::with_defaults(Only::command(), "postgres://db/x", "[::1]:0")
            .mut_args(|arg| arg.env(None));
        let matches =
            command.try_get_matches_from(std::iter::once("test").chain(args.iter().copied()))?;
        Only::from_arg_matches(&matches).map(|only| (only.common, only.limits))
    }

    #[test]
    fn the_default_is_the_settings_default() {
        let (common, limits) = parse(&[]).unwrap();
        assert_eq!(limits, StreamLimits::default());
        limits.check(&common).unwrap();
    }

    #[test]
    fn bad_limits_are_refused_naming_their_variable() {
        let (common, limits) = parse(&["--nats-stream-max-age-ms", "60000"]).unwrap();
        let error = limits.check(&common).unwrap_err();
        assert_eq!(error.name, "NATS_STREAM_MAX_AGE_MS", "{error}");
        let (common, limits) = parse(&["--nats-stream-max-age-ms", "0"]).unwrap();
        limits.check(&common).unwrap();
        let error = parse(&["--nats-stream-replicas", "6"]).unwrap_err();
        assert!(
            error.to_string().contains("NATS_STREAM_REPLICAS"),
            "{error}"
        );
    }
}
