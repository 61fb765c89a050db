//! The instance that streams: it holds the session lock of its slot, makes the slot when
//! missing, lost or older than its publication, ends a stream another instance left, and wakes
//! the relays at each commit that inserted into the outbox.

use std::time::Duration;

use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use super::insert::Inserted;
use super::pending::Pending;
use super::{WalError, WalWakeup, storage};

/// Longest wait for a connection, the stream's start, an answer to the lock session's ping,
/// and the stream's end after it is asked to stop.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The server probes the lock session's peer after this much silence, this often, this many
/// times, and gives up on data it sent unacknowledged for this many milliseconds: a host cut
/// off loses the lock within about half a minute rather than the kernel's default hours.
const KEEPALIVE: [(&str, &str); 4] = [
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "25000"),
];

/// The least time between two pings of the lock's session, and between two looks at whether
/// a stream ended.
const LEAST_PING: Duration = Duration::from_secs(1);
const LEAST_LOOK: Duration = Duration::from_millis(50);

/// Why one turn as the streaming instance ended; [`WalWakeup::run`] starts another.
#[derive(Debug, thiserror::Error)]
pub(super) enum LeadError {
    /// What retrying cannot mend: `run` returns it.
    #[error(transparent)]
    Fatal(WalError),
    /// A statement on the lock session failed, or the session did not answer in time.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
    /// The lock session stopped answering: another instance may hold the lock by now.
    #[error("the lock's session does not answer")]
    LockLost,
    /// The replication connection failed or ended.
    #[error("the replication stream: {0}")]
    Replication(pgwire_replication::PgWireError),
    /// The server ended the stream.
    #[error("the server ended the stream")]
    Ended,
    /// Something did not answer within its time.
    #[error("no answer in time: {0}")]
    TimedOut(&'static str),
}

/// `outbox_wal_streaming` at 1 while it lives: which instance streams the slot, for an
/// operator (and a test) to tell without reading the server's backends.
struct StreamingGauge;

impl StreamingGauge {
    fn on() -> Self {
        metrics::gauge!("outbox_wal_streaming").set(1.0);
        Self
    }
}

impl Drop for StreamingGauge {
    fn drop(&mut self) {
        metrics::gauge!("outbox_wal_streaming").set(0.0);
    }
}

/// How a turn ended, for the caller's backoff.
pub(super) enum Turn {
    /// Another instance holds the lock, or `shutdown` came.
    StoodBy,
    /// It failed before streaming, or streamed until this error: `started` says which.
    Failed { error: LeadError, started: bool },
}

impl WalWakeup {
    /// One turn: waits for the lock (`Ok(Turn::StoodBy)` at `shutdown`), then streams until
    /// an error or `shutdown`.
    pub(super) async fn lead(
        &self,
        pool: &PgPool,
        shutdown: &CancellationToken,
    ) -> Result<Turn, LeadError> {
        // The lock lives as long as this session, which no pool shares.
        let options: PgConnectOptions = pool
            .connect_options()
            .as_ref()
            .clone()
            .options(KEEPALIVE)
            .application_name(&format!("outbox-wal-lock/{}", self.slot));
        let mut conn = answered("connecting", PgConnection::connect_with(&options)).await??;
        loop {
            let locked = answered("locking", storage::try_lock(&mut conn, &self.slot)).await??;
            if locked {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(Turn::StoodBy),
                () = tokio::time::sleep(self.retry) => {}
            }
        }
        let mut started = false;
        let streamed = self.lead_locked(&mut conn, shutdown, &mut started).await;
        let _ = timeout(ANSWER_WITHIN, conn.close()).await;
        match streamed {
            Ok(()) => Ok(Turn::StoodBy),
            Err(LeadError::Fatal(error)) => Err(LeadError::Fatal(error)),
            Err(error) => Ok(Turn::Failed { error, started }),
        }
    }

    async fn lead_locked(
        &self,
        conn: &mut PgConnection,
        shutdown: &CancellationToken,
        started: &mut bool,
    ) -> Result<(), LeadError> {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            prepared = self.prepare_slot(conn) => prepared?,
        }
        // What committed while nobody streamed is in the table: the relays look at once.
        self.wakeup.committed();
        let mut client =
            ReplicationClient::connect(self.replication.clone().with_start_lsn(Lsn(0)))
                .await
                .map_err(LeadError::Replication)?;
        let streamed = tokio::select! {
            () = shutdown.cancelled() => Ok(()),
            begun = timeout(ANSWER_WITHIN, client.wait_started()) => match begun {
                Err(_) => Err(LeadError::TimedOut("starting the stream")),
                Ok(Err(error)) => Err(LeadError::Replication(error)),
                Ok(Ok(())) => {
                    *started = true;
                    tracing::info!(slot = %self.slot, "streaming the outbox's commits");
                    let _streaming = StreamingGauge::on();
                    self.stream(&mut client, conn, shutdown).await
                }
            },
        };
        // Ended here, so that the next holder of the lock finds the slot free.
        client.stop();
        if timeout(ANSWER_WITHIN, client.shutdown()).await.is_err() {
            client.abort();
        }
        match streamed {
            Err(LeadError::Replication(error)) if self.publication_missing(&error) => {
                // Failing at its first change, the stream does not end a run of failures.
                *started = false;
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    made = self.make_again_if_older_than_publication(conn) => made?,
                }
                Err(LeadError::Replication(error))
            }
            other => other,
        }
    }

    /// Whether the server could not decode because this publication did not exist (SQLSTATE
    /// 42704, which `pgwire-replication` gives only in the message's text, naming it).
    fn publication_missing(&self, error: &pgwire_replication::PgWireError) -> bool {
        matches!(error, pgwire_replication::PgWireError::Server(message)
            if message.ends_with("(SQLSTATE 42704)")
                && message.contains(&format!("\"{}\"", self.publication)))
    }

    /// Decoding fails at every attempt on a change written while the publication did not
    /// exist: makes the publication if missing, and the slot again after it.
    async fn make_again_if_older_than_publication(
        &self,
        conn: &mut PgConnection,
    ) -> Result<(), LeadError> {
        // A slot missing is made at the next turn.
        if storage::slot(conn, &self.slot)
            .await?
            .is_none_or(|slot| !slot.ours)
        {
            return Ok(());
        }
        tracing::warn!(
            slot = %self.slot,
            publication = %self.publication,
            "the replication slot is older than its publication; making it again (every event is in the outbox table)"
        );
        storage::ensure_publication(conn, &self.publication).await?;
        self.end_stream(conn).await?;
        storage::drop_slot(conn, &self.slot).await?;
        storage::create_slot(conn, &self.slot).await?;
        metrics::counter!("outbox_wal_slot_recreated_total").increment(1);
        Ok(())
    }

    /// Makes the slot when missing or lost, and ends a stream an instance that lost its lock
    /// left running. A slot of that name that is not ours (another database's, or another
    /// kind) is left alone, and fatal.
    async fn prepare_slot(&self, conn: &mut PgConnection) -> Result<(), LeadError> {
        match storage::slot(conn, &self.slot).await? {
            None => {
                tracing::info!(slot = %self.slot, "creating the replication slot");
                storage::create_slot(conn, &self.slot).await?;
            }
            Some(slot) if !slot.ours => {
                return Err(LeadError::Fatal(WalError::SlotTaken(self.slot.clone())));
            }
            Some(slot) if slot.wal_status.as_deref() == Some("lost") => {
                tracing::warn!(
                    slot = %self.slot,
                    "the replication slot lost WAL it needed; making it again (every event is in the outbox table)"
                );
                metrics::counter!("outbox_wal_slot_recreated_total").increment(1);
                self.end_stream(conn).await?;
                storage::drop_slot(conn, &self.slot).await?;
                storage::create_slot(conn, &self.slot).await?;
            }
            Some(slot) if slot.active_pid.is_some() => {
                tracing::warn!(slot = %self.slot, "ending the stream of an instance that lost its lock");
                self.end_stream(conn).await?;
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Ends the slot's stream, if one runs, and waits until the server freed the slot.
    async fn end_stream(&self, conn: &mut PgConnection) -> Result<(), LeadError> {
        storage::end_stream(conn, &self.slot).await?;
        let deadline = Instant::now() + ANSWER_WITHIN;
        while storage::slot(conn, &self.slot)
            .await?
            .is_some_and(|slot| slot.active_pid.is_some())
        {
            if Instant::now() > deadline {
                return Err(LeadError::TimedOut("the previous stream to end"));
            }
            tokio::time::sleep((self.retry / 10).max(LEAST_LOOK)).await;
        }
        Ok(())
    }

    /// Wakes the relays at each commit holding an insert that they did not claim (see
    /// [`Pending`]), confirming as it reads, and stops when the lock's session stops answering.
    async fn stream(
        &self,
        client: &mut ReplicationClient,
        conn: &mut PgConnection,
        shutdown: &CancellationToken,
    ) -> Result<(), LeadError> {
        let mut pending = Pending::default();
        let streamed = self.stream_into(client, conn, shutdown, &mut pending).await;
        // Confirmed already, those commits will not be read again: the relays look now.
        if pending.any() {
            self.wakeup.committed();
        }
        streamed
    }

    /// [`Self::stream`]'s loop, leaving in `pending` what it has yet to wake the relays for.
    async fn stream_into(
        &self,
        client: &mut ReplicationClient,
        conn: &mut PgConnection,
        shutdown: &CancellationToken,
        pending: &mut Pending,
    ) -> Result<(), LeadError> {
        let mut inserted = Inserted::default();
        let mut ended = self.wakeup.claims().ended();
        let mut ping = tokio::time::interval(self.retry.max(LEAST_PING));
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = sleep_until(pending.next_look()) => {
                    pending.look_again(&self.wakeup, Instant::now());
                    continue;
                }
                _ = ended.changed(), if pending.waiting() => {
                    pending.claim_ended(&self.wakeup);
                    continue;
                }
                _ = ping.tick() => {
                    match timeout(ANSWER_WITHIN, conn.ping()).await {
                        Ok(Ok(())) => continue,
                        _ => return Err(LeadError::LockLost),
                    }
                }
                event = client.recv() => event.map_err(LeadError::Replication)?,
            };
            match event {
                None => return Err(LeadError::Ended),
                Some(ReplicationEvent::XLogData { data, .. }) => inserted.read(&data),
                Some(ReplicationEvent::Commit { end_lsn, .. }) => {
                    if let Some(seqs) = inserted.take() {
                        pending.committed(&self.wakeup, seqs, Instant::now());
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

/// Waits until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `future`'s output, or [`LeadError::TimedOut`] naming `what` after [`ANSWER_WITHIN`].
pub(super) async fn answered<T>(
    what: &'static str,
    future: impl Future<Output = T>,
) -> Result<T, LeadError> {
    timeout(ANSWER_WITHIN, future)
        .await
        .map_err(|_| LeadError::TimedOut(what))
}
