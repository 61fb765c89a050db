//! orders-service settings, from the environment only. See the README for the table.

use std::time::Duration;

use jetstream_outbox::{Backoff, RelayConfig};
use service_kit::config::{Common, ConfigError, ensure, millis, parse};

/// Everything orders-service reads at start-up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Settings shared with billing-service.
    pub common: Common,
    /// The relay's behaviour.
    pub relay: RelayConfig,
    /// `RELAY_ENABLED`: run the relay in this process (default true).
    pub relay_enabled: bool,
    /// `NATS_PUBLISH_TIMEOUT_MS`: the longest wait for one PubAck.
    pub publish_timeout: Duration,
    /// `OUTBOX_RETENTION_MS`: published and skipped events are aged out after this long (at
    /// most 188 hours); with 0 the relay deletes events as it publishes them.
    pub outbox_retention: Duration,
}

impl Config {
    /// Reads the environment; the error names the offending variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        let common = Common::from_env(
            "postgres://postgres@127.0.0.1:5432/orders",
            "127.0.0.1:8080",
        )?;
        let mut relay = RelayConfig::new(&common.subject_prefix, "/orders-service");
        relay.batch_size = parse("RELAY_BATCH_SIZE", relay.batch_size)?;
        relay.max_attempts = parse("RELAY_MAX_ATTEMPTS", relay.max_attempts)?;
        relay.poll_interval = millis("RELAY_POLL_INTERVAL_MS", relay.poll_interval)?;
        relay.backoff = Backoff::new(
            millis("RELAY_BACKOFF_BASE_MS", relay.backoff.base)?,
            millis("RELAY_BACKOFF_MAX_MS", relay.backoff.max)?,
        );
        relay.lease = millis("RELAY_LEASE_MS", relay.lease)?;
        let outbox_retention = millis("OUTBOX_RETENTION_MS", Duration::from_secs(24 * 3600))?;
        relay.delete_published = outbox_retention.is_zero();
        ensure(
            "RELAY_BATCH_SIZE",
            (1..=10_000).contains(&relay.batch_size),
            "must be 1 to 10000",
        )?;
        ensure(
            "OUTBOX_RETENTION_MS",
            outbox_retention <= jetstream_outbox::outbox::MAX_RETENTION,
            "must be at most 676800000 (188 hours: the ring of published events' partitions)",
        )?;
        ensure(
            "RELAY_MAX_ATTEMPTS",
            relay.max_attempts >= 1,
            "must be at least 1",
        )?;
        let config = Self {
            relay,
            relay_enabled: parse("RELAY_ENABLED", true)?,
            publish_timeout: millis("NATS_PUBLISH_TIMEOUT_MS", Duration::from_secs(5))?,
            outbox_retention,
            common,
        };
        ensure(
            "NATS_PUBLISH_TIMEOUT_MS",
            !config.publish_timeout.is_zero(),
            "must be positive",
        )?;
        // A pass starts waves for half the lease, and one wave takes up to a send and its
        // acknowledgements (a timeout each) per publish window its batch fills: the lease must
        // hold the last wave with room to spare.
        let windows = config
            .relay
            .batch_size
            .unsigned_abs()
            .div_ceil(jetstream_outbox::JetStreamPublisher::DEFAULT_WINDOW as u64)
            .max(1) as u32;
        ensure(
            "RELAY_LEASE_MS",
            config.relay.lease > 4 * windows * config.publish_timeout,
            "must be more than four times NATS_PUBLISH_TIMEOUT_MS per 4096 rows of RELAY_BATCH_SIZE",
        )?;
        Ok(config)
    }
}
