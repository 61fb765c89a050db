//! Waking relays from the write-ahead log: a logical replication slot tells them at once when
//! a transaction that enqueued events commits, whichever process committed it.
//!
//! [`WalWakeup`] streams the outbox's inserts (a publication on `outbox`, inserts only,
//! decoded by the built-in `pgoutput` plugin, read through `pgwire-replication`) and calls
//! [`Wakeup::committed`] at each commit that holds one. Unlike the `NOTIFY` of
//! [`Wakeup::across_processes`], the writer has nothing to send after its commit, and no
//! commit is missed while a relay is reconnecting: the slot keeps the position it confirmed.
//!
//! The table stays the source of truth: the relay claims and publishes from it as it does
//! when polling. So the slot is confirmed as soon as a commit is read, its retained WAL never
//! grows while the broker or the relay is down, and a slot dropped or lost
//! (`max_slot_wal_keep_size`, a failover to a standby without it) loses no event: it is made
//! again, and everything committed meanwhile is in the table, which the relay reads at once.
//!
//! Several instances may run one: a session advisory lock picks the one that streams, the
//! others retry every [`WalWakeup::retry`]. An instance that takes the lock while the slot is
//! still streamed (its holder's connection died but the server has not noticed yet) ends that
//! stream, so a killed instance is replaced within the retry rather than `wal_sender_timeout`.
//!
//! What the server needs:
//! - `wal_level = logical` (Amazon RDS: `rds.logical_replication = 1`; Cloud SQL:
//!   `cloudsql.logical_decoding = on`), and a free slot and WAL sender (`max_replication_slots`,
//!   `max_wal_senders`) per streaming instance;
//! - the pool's role and the URL's with `REPLICATION` (RDS: granted `rds_replication`), the
//!   pool's also allowed to create the publication once, or the owner creates it beforehand:
//!   `CREATE PUBLICATION outbox_inserts FOR TABLE outbox WITH (publish = 'insert')`.
//!
//! A failover to a standby leaves the slot behind (PostgreSQL 15 does not copy slots to
//! standbys): the wake-up makes it again on the new primary, as after a drop.

mod storage;

use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::Wakeup;

/// The publication [`WalWakeup`] streams unless told otherwise.
pub const PUBLICATION: &str = "outbox_inserts";

/// How long after its commit is read a transaction is taken to be visible to every session:
/// the relays are woken a second time then.
const VISIBLE_WITHIN: Duration = Duration::from_millis(200);

/// How often every instance reads the slot's lag.
const LAG_INTERVAL: Duration = Duration::from_secs(5);

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
    /// A statement on the database failed.
    #[error(transparent)]
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
}

impl WalWakeup {
    /// Streams the slot `slot` of the database at `database_url` (a `postgres://` URL; its
    /// `sslmode` of `require`, `verify-ca` or `verify-full` is honoured, with `sslrootcert`),
    /// waking the relays `wakeup` wakes.
    pub fn new(database_url: &str, slot: &str, wakeup: &Wakeup) -> Result<Self, WalError> {
        let url =
            url::Url::parse(database_url).map_err(|error| WalError::Url(error.to_string()))?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(WalError::Url(format!("the scheme is {:?}", url.scheme())));
        }
        let decode = |text: &str| {
            percent_decode(text).map_err(|()| WalError::Url("a part is not UTF-8".into()))
        };
        let host = url.host_str().unwrap_or("localhost");
        let user = decode(url.username())?;
        let password = decode(url.password().unwrap_or(""))?;
        let database = decode(url.path().trim_start_matches('/'))?;
        let query = |name: &str| {
            url.query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
        };
        let root = query("sslrootcert").map(std::path::PathBuf::from);
        let tls = match query("sslmode").as_deref() {
            None | Some("disable" | "allow" | "prefer") => TlsConfig::disabled(),
            Some("require") => TlsConfig::require(),
            Some("verify-ca") => TlsConfig::verify_ca(root),
            Some("verify-full") => TlsConfig::verify_full(root),
            Some(other) => return Err(WalError::Url(format!("unknown sslmode {other:?}"))),
        };
        let database = if database.is_empty() {
            user.clone()
        } else {
            database
        };
        let slot = checked_name(slot)?;
        let replication =
            ReplicationConfig::new(host, user, password, database, slot.clone(), PUBLICATION)
                .with_port(url.port().unwrap_or(5432))
                .with_tls(tls)
                .with_status_interval(Duration::from_secs(1))
                .with_application_name(format!("outbox-wal/{slot}"));
        Ok(Self {
            replication,
            slot,
            publication: PUBLICATION.to_owned(),
            wakeup: wakeup.clone(),
            retry: Duration::from_secs(1),
        })
    }

    /// Streams the publication `name` instead of [`PUBLICATION`].
    pub fn with_publication(mut self, name: &str) -> Result<Self, WalError> {
        self.publication = checked_name(name)?;
        self.replication.publication = self.publication.as_str().into();
        Ok(self)
    }

    /// How often a standby instance tries to take over, and a failed stream is started again.
    #[must_use]
    pub fn retry(mut self, every: Duration) -> Self {
        self.retry = every;
        self
    }

    /// Checks what retrying cannot mend, for a service to refuse to start without it: the
    /// server's `wal_level`, and the publication (created when missing).
    pub async fn check(&self, pool: &PgPool) -> Result<(), WalError> {
        let level = storage::wal_level(pool).await?;
        if level != "logical" {
            return Err(WalError::WalLevel(level));
        }
        storage::ensure_publication(pool, &self.publication).await?;
        Ok(())
    }

    /// Streams until `shutdown` (see the module documentation); `pool` is the outbox's
    /// database. Returns an error only for what [`WalWakeup::check`] finds; it retries the
    /// rest (the database unreachable or restarted, the slot dropped or lost, another instance
    /// streaming).
    pub async fn run(self, pool: PgPool, shutdown: CancellationToken) -> Result<(), WalError> {
        self.check(&pool).await?;
        tokio::join!(
            self.stream_or_stand_by(&pool, &shutdown),
            self.watch_lag(&pool, &shutdown)
        );
        Ok(())
    }

    async fn stream_or_stand_by(&self, pool: &PgPool, shutdown: &CancellationToken) {
        while !shutdown.is_cancelled() {
            if let Err(error) = self.lead(pool, shutdown).await {
                tracing::warn!(slot = %self.slot, error = %error, "streaming the outbox stopped; retrying");
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(self.retry) => {}
            }
        }
    }

    /// Sets `outbox_wal_lag_bytes` every [`LAG_INTERVAL`], on every instance: a slot nobody
    /// streams keeps its WAL, which is what the gauge is watched for.
    async fn watch_lag(&self, pool: &PgPool, shutdown: &CancellationToken) {
        let mut every = tokio::time::interval(LAG_INTERVAL);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            match lag_bytes(pool, &self.slot).await {
                // No slot retains nothing.
                Ok(lag) => metrics::gauge!("outbox_wal_lag_bytes").set(lag.unwrap_or(0) as f64),
                Err(error) => tracing::debug!(error = %error, "cannot read the slot's lag"),
            }
        }
    }

    /// Waits to be the instance that streams, then streams until an error or `shutdown`.
    async fn lead(&self, pool: &PgPool, shutdown: &CancellationToken) -> Result<(), StreamError> {
        // The lock lives as long as this connection, which no pool shares.
        let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
        while !storage::try_lock(&mut conn, &self.slot).await? {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.retry) => {}
            }
        }
        self.prepare_slot(&mut conn).await?;
        // What committed while nobody streamed is in the table: the relays look at once.
        self.wakeup.committed();
        let mut client =
            ReplicationClient::connect(self.replication.clone().with_start_lsn(Lsn(0)))
                .await
                .map_err(StreamError::Replication)?;
        tracing::info!(slot = %self.slot, "streaming the outbox's commits");
        let streamed = self.stream(&mut client, shutdown).await;
        client.stop();
        let _ = client.shutdown().await;
        let _ = conn.close().await;
        streamed
    }

    /// Makes the slot when missing or lost, and ends a stream a previous holder left behind.
    async fn prepare_slot(&self, conn: &mut PgConnection) -> Result<(), StreamError> {
        match storage::slot(conn, &self.slot).await? {
            None => {
                tracing::info!(slot = %self.slot, "creating the replication slot");
                storage::create_slot(conn, &self.slot).await?;
            }
            Some(slot) if slot.wal_status.as_deref() == Some("lost") => {
                tracing::warn!(
                    slot = %self.slot,
                    "the replication slot lost WAL it needed; making it again (every event is in the outbox table)"
                );
                metrics::counter!("outbox_wal_slot_recreated_total").increment(1);
                storage::drop_slot(conn, &self.slot).await?;
                storage::create_slot(conn, &self.slot).await?;
            }
            Some(slot) => {
                if let Some(pid) = slot.active_pid {
                    tracing::warn!(slot = %self.slot, pid, "ending the stream of an instance that lost its lock");
                    storage::terminate(conn, pid).await?;
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while storage::slot(conn, &self.slot)
                        .await?
                        .is_some_and(|slot| slot.active_pid.is_some())
                    {
                        if tokio::time::Instant::now() > deadline {
                            return Err(StreamError::StillStreamed);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        Ok(())
    }

    /// Wakes the relays at each commit holding an insert, confirming as it reads.
    async fn stream(
        &self,
        client: &mut ReplicationClient,
        shutdown: &CancellationToken,
    ) -> Result<(), StreamError> {
        let mut inserted = false;
        // PostgreSQL sends a commit once its record is flushed, which can be a moment before
        // the transaction is visible to other sessions: a relay woken then may find nothing.
        // So the relays are woken again once the commits read have surely become visible.
        let mut again: Option<tokio::time::Instant> = None;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = sleep_until(again) => {
                    again = None;
                    self.wakeup.committed();
                    continue;
                }
                event = client.recv() => event.map_err(StreamError::Replication)?,
            };
            match event {
                None => return Err(StreamError::Ended),
                Some(ReplicationEvent::XLogData { data, .. }) => {
                    inserted |= data.first() == Some(&b'I');
                }
                Some(ReplicationEvent::Commit { end_lsn, .. }) => {
                    if std::mem::take(&mut inserted) {
                        self.wakeup.committed();
                        again.get_or_insert_with(|| tokio::time::Instant::now() + VISIBLE_WITHIN);
                    }
                    client.update_applied_lsn(end_lsn);
                }
                Some(ReplicationEvent::KeepAlive { wal_end, .. }) => {
                    client.update_applied_lsn(wal_end);
                }
                Some(_) => {}
            }
        }
    }
}

/// How many bytes of WAL the slot `slot` keeps that its streamer has not confirmed; `None`
/// when there is no such slot.
pub async fn lag_bytes(pool: &PgPool, slot: &str) -> sqlx::Result<Option<i64>> {
    storage::lag_bytes(pool, slot).await
}

/// Waits until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why one stream ended; [`WalWakeup::run`] starts another.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Replication(pgwire_replication::PgWireError),
    #[error("the server ended the stream")]
    Ended,
    #[error("the slot is still streamed after its holder was ended")]
    StillStreamed,
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

/// A URL part with its `%XX` escapes decoded.
fn percent_decode(text: &str) -> Result<String, ()> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_the_replication_connection() {
        let wakeup = Wakeup::in_process();
        let wal = WalWakeup::new(
            "postgres://relay:p%40ss@db.example:6543/orders?sslmode=require",
            "orders_relay",
            &wakeup,
        )
        .expect("a good URL");
        let shown = wal.replication.display_connection();
        assert!(shown.contains("db.example"), "{shown}");
        assert!(shown.contains("6543"), "{shown}");
        assert_eq!(wal.replication.password, "p@ss");
        assert_eq!(wal.replication.database, "orders");
        assert!(wal.replication.tls.mode.requires_tls());
    }

    #[test]
    fn bad_urls_and_names_are_refused() {
        let wakeup = Wakeup::in_process();
        let url = "postgres://u@h/db";
        assert!(matches!(
            WalWakeup::new("mysql://u@h/db", "s", &wakeup),
            Err(WalError::Url(_))
        ));
        assert!(matches!(
            WalWakeup::new(&format!("{url}?sslmode=sometimes"), "s", &wakeup),
            Err(WalError::Url(_))
        ));
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
