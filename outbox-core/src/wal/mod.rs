//! Waking relays from the write-ahead log: a logical replication slot tells them at once when
//! a transaction that enqueued events commits, whichever process committed it.
//!
//! [`WalWakeup`] streams the outbox's inserts (a publication on `outbox`, inserts only,
//! decoded by the built-in `pgoutput` plugin, read through `pgwire-replication`) and calls
//! [`Wakeup::committed`] at each commit that holds one, unless the relays it wakes claimed
//! that commit's events already (a commit of their process, told to them at once); a commit
//! read while one of them claims waits for the claim to end. Unlike the `NOTIFY` of
//! [`Wakeup::across_processes`], the writer has nothing to send after its commit, and no
//! commit is missed while a relay is reconnecting: the slot keeps the position it confirmed.
//!
//! The table stays the source of truth: the relay claims and publishes from it as it does
//! when polling. So the slot is confirmed as soon as a commit is read, its retained WAL never
//! grows while the broker or the relay is down, and a slot dropped, lost
//! (`max_slot_wal_keep_size`, a failover to a standby without it), or older than its
//! publication (which PostgreSQL 15 cannot decode past) loses no event: it is made again, and
//! everything committed meanwhile is in the table, which the relay reads at once.
//!
//! Several instances may run one: a session advisory lock picks the one that streams, the
//! others try to take it every [`WalWakeup::retry`]. Only the streaming instance's relays are
//! woken this way; the others' poll. The streaming instance pings its lock's session while it
//! streams and stops when it does not answer. An instance that takes the lock while the slot
//! is still streamed (the lock's session of its holder ended, the stream did not) ends that
//! stream. A killed instance's sessions close with it, so another takes over within the
//! retry; a host cut off loses its lock once the server's keepalive probes fail.
//!
//! What the server needs:
//! - `wal_level = logical` (Amazon RDS: `rds.logical_replication = 1`; Cloud SQL:
//!   `cloudsql.logical_decoding = on`), and a free slot and WAL sender (`max_replication_slots`,
//!   `max_wal_senders`) per slot name;
//! - the pool's role and the URL's with `REPLICATION` (RDS: granted `rds_replication`), the
//!   pool's allowed to end the URL role's stream (the same role, or a member of it), and to
//!   create the publication once, or the owner creates it beforehand:
//!   `CREATE PUBLICATION outbox_inserts FOR TABLE outbox WITH (publish = 'insert')`.
//!
//! A failover to a standby that has no copy of the slot (PostgreSQL copies none before its
//! failover slots) leaves it behind: the wake-up makes it again on the new primary, as after
//! a drop.
//!
//! The feature compiles rustls's `aws-lc-rs` backend (through `pgwire-replication`'s TLS)
//! beside the `ring` one of `async-nats` and sqlx; rustls then picks no process-wide provider
//! by itself, and a client built on it, such as async-nats over TLS, panics. A program with
//! the feature installs one first: `rustls::crypto::ring::default_provider().install_default()`.

mod connect;
mod insert;
mod lag;
mod lead;
mod pending;
mod storage;

use std::time::Duration;

use pgwire_replication::ReplicationConfig;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::Wakeup;
pub use lag::{Lag, SlotLag};
use lead::{LeadError, Turn};

/// The publication [`WalWakeup`] streams unless told otherwise.
pub const PUBLICATION: &str = "outbox_inserts";

/// How often every instance reads the slot's lag.
const LAG_INTERVAL: Duration = Duration::from_secs(5);

/// The longest pause between two attempts after failures in a row.
const MOST_BACKOFF: Duration = Duration::from_secs(30);

/// The shortest [`WalWakeup::retry`]: a zero would make a standby's loop spin.
const LEAST_RETRY: Duration = Duration::from_millis(10);

/// What stops [`WalWakeup::run`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// The database URL cannot be used for a replication connection.
    #[error("the database URL cannot be used for replication: {0}")]
    Url(String),
    /// A slot or publication name other than lower-case letters, digits and `_`.
    #[error("{0:?} is not a slot or publication name: use a-z, 0-9 and _, at most 63")]
    Name(String),
    /// The server does not decode its WAL logically.
    #[error("wal_level is {0}; streaming the outbox needs wal_level = logical")]
    WalLevel(String),
    /// A replication slot of this name exists that is not a `pgoutput` slot of this
    /// database: another database's or another program's, left alone.
    #[error("the replication slot {0:?} belongs to another database or program: name another")]
    SlotTaken(String),
    /// A statement on the database failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// Streams a slot and wakes relays at each commit that enqueued events (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct WalWakeup {
    replication: ReplicationConfig,
    slot: String,
    publication: String,
    wakeup: Wakeup,
    retry: Duration,
    lag: SlotLag,
}

impl WalWakeup {
    /// Streams the slot `slot` of the database at `database_url` (a `postgres://` URL, TLS as
    /// its `sslmode` says, with `sslrootcert`), waking the relays `wakeup` wakes.
    pub fn new(database_url: &str, slot: &str, wakeup: &Wakeup) -> Result<Self, WalError> {
        let slot = checked_name(slot)?;
        // Its relays note what they claim from here on.
        wakeup.claims().watch();
        Ok(Self {
            replication: connect::replication_config(database_url, &slot, PUBLICATION)?,
            slot,
            publication: PUBLICATION.to_owned(),
            wakeup: wakeup.clone(),
            retry: Duration::from_secs(1),
            lag: SlotLag::default(),
        })
    }

    /// Streams the publication `name` instead of [`PUBLICATION`].
    pub fn with_publication(mut self, name: &str) -> Result<Self, WalError> {
        self.publication = checked_name(name)?;
        self.replication.publication = self.publication.as_str().into();
        Ok(self)
    }

    /// How often a standby instance tries to take over, and the streaming one pings its
    /// lock's session; a failed stream is started again after it, doubled for each failure in
    /// a row up to half a minute.
    #[must_use]
    pub fn retry(mut self, every: Duration) -> Self {
        self.retry = every.max(LEAST_RETRY);
        self
    }

    /// The slot's lag as [`Self::run`] last read it (it reads it regularly, on every instance).
    pub fn lag(&self) -> SlotLag {
        self.lag.clone()
    }

    /// Checks, for a service to refuse to start without them: the server's `wal_level`, the
    /// publication (created when missing), and that a slot of this name, if any, is a
    /// `pgoutput` slot of this database.
    pub async fn check(&self, pool: &PgPool) -> Result<(), WalError> {
        let level = storage::wal_level(pool).await?;
        if level != "logical" {
            return Err(WalError::WalLevel(level));
        }
        let mut conn = pool.acquire().await?;
        storage::ensure_publication(&mut conn, &self.publication).await?;
        if storage::slot(&mut conn, &self.slot)
            .await?
            .is_some_and(|slot| !slot.ours)
        {
            return Err(WalError::SlotTaken(self.slot.clone()));
        }
        Ok(())
    }

    /// Streams until `shutdown` (see the module documentation); `pool` is the outbox's
    /// database. Returns an error only for what retrying cannot mend ([`WalError::WalLevel`],
    /// [`WalError::SlotTaken`]); it retries the rest: the database unreachable or restarted,
    /// the slot dropped, lost or older than its publication, another instance streaming.
    pub async fn run(self, pool: PgPool, shutdown: CancellationToken) -> Result<(), WalError> {
        // From its start, at zero, for `increase()` to see the first one.
        metrics::counter!("outbox_wal_slot_recreated_total").increment(0);
        metrics::gauge!("outbox_wal_streaming").set(0.0);
        let mut failures = 0;
        loop {
            let checked = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                checked = self.check(&pool) => checked,
            };
            match checked {
                Ok(()) => break,
                Err(WalError::Database(error)) => {
                    tracing::warn!(slot = %self.slot, error = %error, "cannot check the slot; retrying");
                    failures += 1;
                    if !self.pause(failures, &shutdown).await {
                        return Ok(());
                    }
                }
                Err(error) => return Err(error),
            }
        }
        // Ends the lag's watch too when streaming meets what retrying cannot mend.
        let stop = shutdown.child_token();
        let (streamed, ()) = tokio::join!(
            self.stream_or_stand_by(&pool, &stop),
            self.watch_lag(&pool, &stop)
        );
        streamed
    }

    async fn stream_or_stand_by(
        &self,
        pool: &PgPool,
        shutdown: &CancellationToken,
    ) -> Result<(), WalError> {
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            let error = match self.lead(pool, shutdown).await {
                Ok(Turn::StoodBy) => continue,
                Err(LeadError::Fatal(error)) => {
                    shutdown.cancel();
                    return Err(error);
                }
                Ok(Turn::Failed { error, started }) => {
                    // A stream that started ends a run of failures.
                    if started {
                        failures = 0;
                    }
                    error
                }
                Err(error) => error,
            };
            failures += 1;
            tracing::warn!(slot = %self.slot, error = %error, "streaming the outbox stopped; retrying");
            if !self.pause(failures, shutdown).await {
                break;
            }
        }
        Ok(())
    }

    /// Waits before the attempt after `failures` failures in a row; false at `shutdown`.
    async fn pause(&self, failures: u32, shutdown: &CancellationToken) -> bool {
        let pause = self
            .retry
            .saturating_mul(2_u32.saturating_pow(failures.saturating_sub(1)))
            .min(MOST_BACKOFF.max(self.retry));
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(pause) => true,
        }
    }

    /// Reads the slot's lag every [`LAG_INTERVAL`], on every instance, into [`Self::lag`] and
    /// the gauges `outbox_wal_lag_bytes` and `outbox_wal_lag_seconds`: a slot nobody streams
    /// keeps its WAL, which is what they are watched for.
    async fn watch_lag(&self, pool: &PgPool, shutdown: &CancellationToken) {
        let mut every = tokio::time::interval(LAG_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut readings = lag::Readings::default();
        loop {
            let positions = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = every.tick() => {
                    lead::answered("the slot's lag", storage::positions(pool, &self.slot)).await
                }
            };
            match positions {
                Ok(Ok(positions)) => {
                    let lag = readings.read(tokio::time::Instant::now(), positions);
                    metrics::gauge!("outbox_wal_lag_bytes").set(lag.bytes as f64);
                    metrics::gauge!("outbox_wal_lag_seconds").set(lag.waited.as_secs_f64());
                    self.lag.set(lag);
                }
                Ok(Err(error)) => tracing::debug!(error = %error, "cannot read the slot's lag"),
                Err(error) => tracing::debug!(error = %error, "cannot read the slot's lag"),
            }
        }
    }
}

/// How many bytes of WAL the slot `slot` keeps that its streamer has not confirmed; `None`
/// when there is no such slot.
pub async fn lag_bytes(pool: &PgPool, slot: &str) -> sqlx::Result<Option<i64>> {
    let positions = storage::positions(pool, slot).await?;
    Ok(positions.map(|(current, confirmed)| current - confirmed))
}

/// Takes the session lock that picks the instance streaming `slot`, if free, for a test to
/// keep every instance standing by.
#[cfg(feature = "testing")]
pub(crate) async fn try_lock(conn: &mut sqlx::PgConnection, slot: &str) -> sqlx::Result<bool> {
    storage::try_lock(conn, slot).await
}

/// `name` when it can name a slot or publication here: `a-z`, `0-9` and `_`, at most 63.
pub fn checked_name(name: &str) -> Result<String, WalError> {
    let safe = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    if safe {
        Ok(name.to_owned())
    } else {
        Err(WalError::Name(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused() {
        let wakeup = Wakeup::in_process();
        let url = "postgres://u@h/db";
        for name in [
            "",
            "Slot",
            "a-b",
            "x\"; DROP TABLE outbox; --",
            &"s".repeat(64),
        ] {
            assert!(
                matches!(WalWakeup::new(url, name, &wakeup), Err(WalError::Name(_))),
                "{name:?}"
            );
        }
    }
}
