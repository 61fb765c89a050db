//! billing-service settings, from the environment only. See the README for the table.

use std::time::Duration;

use service_kit::config::{Common, ConfigError, ensure, millis, nats_name, parse};

/// Everything billing-service reads at start-up.
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
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// `NATS_CONSUMER`: the durable consumer's name, also the inbox's consumer key.
    pub name: String,
    /// `CONSUMER_ACK_WAIT_MS`: redelivery after this long without an ack.
    pub ack_wait: Duration,
    /// `CONSUMER_RETRY_DELAY_MS`: delay before a message that cannot be applied yet (or hit a
    /// transient error) is delivered again.
    pub retry_delay: Duration,
    /// `CONSUMER_MAX_RETRIES`: not-yet outcomes after which a message that still cannot be
    /// applied becomes a dead letter. Redeliveries for other reasons (a database outage, an
    /// expired ack wait) do not count, and transient database errors never dead-letter.
    pub max_retries: i64,
    /// `CONSUMER_BATCH`: messages pulled per request.
    pub batch: usize,
    /// `CONSUMER_CONCURRENCY`: most transactions at once; beyond the first, one starts only
    /// when a full batch waits (see `batcher`).
    pub concurrency: usize,
    /// `CONSUMER_APPLY_BATCH`: most messages applied in one transaction (1: each in its own).
    pub apply_batch: usize,
}

impl Config {
    /// Reads the environment; the error names the offending variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        let common = Common::from_env(
            "postgres://postgres@127.0.0.1:5432/billing",
            "127.0.0.1:8081",
        )?;
        let consumer = ConsumerConfig {
            name: nats_name("NATS_CONSUMER", "billing")?,
            ack_wait: millis("CONSUMER_ACK_WAIT_MS", Duration::from_secs(30))?,
            retry_delay: millis("CONSUMER_RETRY_DELAY_MS", Duration::from_secs(1))?,
            max_retries: parse("CONSUMER_MAX_RETRIES", 100)?,
            batch: parse("CONSUMER_BATCH", 256)?,
            concurrency: parse("CONSUMER_CONCURRENCY", 8)?,
            apply_batch: parse("CONSUMER_APPLY_BATCH", 64)?,
        };
        ensure(
            "CONSUMER_ACK_WAIT_MS",
            consumer.ack_wait >= Duration::from_secs(1),
            "must be at least 1000",
        )?;
        ensure(
            "CONSUMER_MAX_RETRIES",
            consumer.max_retries >= 1,
            "must be at least 1",
        )?;
        ensure(
            "CONSUMER_BATCH",
            (1..=10_000).contains(&consumer.batch),
            "must be 1 to 10000",
        )?;
        ensure(
            "CONSUMER_APPLY_BATCH",
            (1..=1000).contains(&consumer.apply_batch),
            "must be 1 to 1000",
        )?;
        ensure(
            "CONSUMER_CONCURRENCY",
            (1..=256).contains(&consumer.concurrency),
            "must be 1 to 256",
        )?;
        let inbox_retention = millis("INBOX_RETENTION_MS", Duration::from_secs(7 * 24 * 3600))?;
        let horizon = common.duplicate_window
            + consumer.ack_wait
            + consumer
                .retry_delay
                .saturating_mul(u32::try_from(consumer.max_retries).unwrap_or(u32::MAX));
        ensure(
            "INBOX_RETENTION_MS",
            inbox_retention > horizon,
            &format!(
                "must exceed NATS_DUPLICATE_WINDOW_MS + CONSUMER_ACK_WAIT_MS + \
                 CONSUMER_RETRY_DELAY_MS x CONSUMER_MAX_RETRIES ({} ms)",
                horizon.as_millis()
            ),
        )?;
        Ok(Self {
            common,
            consumer,
            inbox_retention,
        })
    }
}
