//! Repairing what the broker forgot: the stream is checked against the published events the
//! outbox keeps, and every event it acknowledged but no longer holds is published again.
//!
//! JetStream acknowledges a message before it is on disk (its `sync_interval`, two minutes by
//! default), so a crash or a power loss can lose acknowledged messages; a store restored from a
//! copy, or lost, loses more; an operator can delete the stream. The relay records, with each
//! event it moves to `outbox_published`, the stream sequence its acknowledgement named, and
//! [`StreamRepair`] compares:
//! - a **light check** (every [`StreamRepair::every`], a few requests): the stream is the one
//!   checked before (its creation time), and the newest message this relay had acknowledged is
//!   still at its sequence; it then records that position in `outbox_stream_checks`;
//! - a **full check** (at start, after every reconnect, when a light check fails, when an
//!   acknowledgement names a sequence at or below one already acknowledged, when no stream
//!   answers for a subject): it finds the newest recorded position that still holds (a stream
//!   loses its newest messages, so every one before it is there), reads the ids of every
//!   message after it (on to the stream's new end when an event recorded since lies above
//!   them: another relay's pass may have been acknowledged after the stream's state was
//!   read; one recorded after that is the next check's), and moves each event published
//!   since that is not among them back into the outbox, with its original seq (so that, per
//!   aggregate, it goes out before the events that followed it) and id (so that consumers'
//!   inboxes drop the copies that did survive). A deleted stream is created again first.
//!
//! The relay publishes nothing after a reconnect until the full check has run. What is covered:
//! events published within the outbox's retention (`outbox_published`; a relay that deletes
//! what it publishes keeps nothing to repair from). What is not: messages the stream removed by
//! its own limits (older than its `max_age`, or below its first sequence), which are not lost
//! but aged out.
//!
//! Modules: `scan` (reading the ids of a stream's messages), `remake` (finding the stream,
//! creating it when gone, deleting and making again a damaged one), `damage` (judging a stream
//! that returns none of its messages) and `storage` (the SQL).

mod damage;
mod remake;
mod scan;
mod storage;

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::BoxError;
use crate::publisher::StreamSpec;
use crate::relay::RelayHealth;
use remake::{Deleted, Made};

/// Checks a stream against the outbox's published events and publishes again what it lost.
/// Give it to the relay with [`crate::Relay::with_repair`].
#[derive(Debug, Clone)]
pub struct StreamRepair {
    context: jetstream::Context,
    spec: StreamSpec,
    interval: Duration,
    /// How long before a recorded position an event acknowledged after it may have been
    /// claimed: the relay's lease, twice.
    margin: Duration,
    suspicion: damage::Suspicion,
    deleted: Deleted,
    /// Where `outbox_stream_damaged` is set: the relay's, once given to one.
    health: RelayHealth,
}

/// What a check found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairReport {
    /// Events moved back into the outbox to be published again.
    pub republished: u64,
    /// Messages whose ids were read from the stream.
    pub scanned: u64,
    /// The stream did not exist, or was damaged, and was created.
    pub created: bool,
    /// The stream returned none of the messages it counted (its files were gone from under
    /// the broker) and was deleted and created again.
    pub damaged: bool,
    /// The stream's last sequence when checked.
    pub last_seq: u64,
}

/// Why a check could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    /// The broker did not answer, or refused a request of the check.
    #[error("the broker could not be asked")]
    Broker(#[source] BoxError),
    /// The stream returns none of the messages it counts (its files are gone from under the
    /// broker): it is deleted and made again once that has lasted a light check's interval, and
    /// at least 10 s (twice as long for each deletion this repair made in the last hour, up to
    /// five minutes).
    #[error("the stream returns none of the messages it counts; nothing is published to it")]
    Damaged,
    /// A database statement of the check failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// A position of the stream found holding a message.
#[derive(Debug, Clone)]
pub(crate) struct Position {
    /// When the stream was created.
    pub(crate) created: DateTime<Utc>,
    pub(crate) seq: u64,
    /// The `Nats-Msg-Id` there (`None` at 0).
    pub(crate) message_id: Option<String>,
}

/// The stream as a check sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamState {
    /// When the stream was created, to the microsecond: another value is another stream.
    pub(crate) created: DateTime<Utc>,
    pub(crate) first_seq: u64,
    pub(crate) last_seq: u64,
    /// Messages the stream counts.
    pub(crate) messages: u64,
    /// The stream removes messages older than this (zero: never).
    pub(crate) max_age: Duration,
}

impl StreamRepair {
    /// Checks the stream of `spec` (created with it when missing) through `context`, lightly
    /// every ten seconds.
    pub fn new(context: jetstream::Context, spec: StreamSpec) -> Self {
        Self {
            context,
            spec,
            interval: Duration::from_secs(10),
            margin: Duration::from_secs(60),
            suspicion: damage::Suspicion::default(),
            deleted: Deleted::default(),
            health: RelayHealth::default(),
        }
    }

    /// Sets how long a pass may hold its claim (see [`crate::RelayConfig::lease`]).
    pub(crate) fn with_lease(mut self, lease: Duration) -> Self {
        self.margin = lease.saturating_mul(2);
        self
    }

    /// Sets `outbox_stream_damaged` through the relay's `health`.
    pub(crate) fn with_health(mut self, health: RelayHealth) -> Self {
        self.health = health;
        self
    }

    /// Sets how often the relay checks lightly.
    #[must_use]
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How often the relay checks lightly.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How many times the client has connected: a change is a reconnect.
    pub(crate) fn connects(&self) -> u64 {
        self.context
            .client()
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The full check (see the module documentation), one caller per stream at a time across
    /// processes: another waits. `pool` is the outbox's database.
    pub async fn check(&self, pool: &PgPool) -> Result<RepairReport, RepairError> {
        self.check_at(pool).await.map(|(report, _)| report)
    }

    /// [`StreamRepair::check`], with the position it found holding at the end.
    pub(crate) async fn check_at(
        &self,
        pool: &PgPool,
    ) -> Result<(RepairReport, Position), RepairError> {
        let mut conn = pool.acquire().await?;
        storage::lock(&mut conn, &self.spec.name).await?;
        let checked = self.check_locked(&mut conn).await;
        if storage::unlock(&mut conn, &self.spec.name).await.is_err() {
            // A connection that may still hold the lock is not handed to anyone else.
            conn.detach();
        }
        checked
    }

    async fn check_locked(
        &self,
        conn: &mut sqlx::PgConnection,
    ) -> Result<(RepairReport, Position), RepairError> {
        let (stream, state, made) = self.stream_or_create().await?;
        let mut report = RepairReport {
            created: made != Made::No,
            damaged: made == Made::InPlaceOfDamaged,
            last_seq: state.last_seq,
            ..RepairReport::default()
        };
        let started = storage::now(conn).await?;
        let checks = storage::checks(conn, &self.spec.name).await?;
        if checks.is_empty() && made == Made::No {
            // The first check of this stream: nothing was recorded to compare with. A stream
            // just made again is read whole, as below: what was published is not in it.
            let newest = scan::message_id_at(&stream, state.last_seq).await?;
            storage::record_check(
                conn,
                &self.spec.name,
                state.created,
                state.last_seq,
                newest.clone(),
            )
            .await?;
            let position = Position {
                created: state.created,
                seq: state.last_seq,
                message_id: newest,
            };
            return Ok((report, position));
        }
        let same_stream: Vec<&storage::Check> = checks
            .iter()
            .filter(|check| check.created == state.created)
            .collect();
        let holding = scan::newest_holding(&stream, &state, &same_stream).await?;
        // Every event at or below `from_seq` is in the stream, or was removed by its limits.
        let (from_seq, since) = match holding {
            Some(check) => (
                check.seq.max(state.first_seq.saturating_sub(1)),
                // Events acknowledged after the position was recorded began their pass at most
                // a lease before (published_at); older ones are at or below it.
                chrono::Duration::from_std(self.margin)
                    .ok()
                    .and_then(|margin| check.checked_at.checked_sub_signed(margin)),
            ),
            // A stream made again holds none of what was recorded; one that lost more than any
            // position recorded is read whole.
            None if same_stream.is_empty() => (0, None),
            None => (state.first_seq.saturating_sub(1), None),
        };
        let mut tx = storage::begin_scan(conn).await?;
        let mut newest = scan::read_ids(&stream, from_seq, state.last_seq, &mut tx).await?;
        let max_age = (!state.max_age.is_zero()).then_some(state.max_age);
        let read_to = from_seq.max(state.last_seq);
        let lost = storage::Lost {
            from_seq,
            through: read_to,
            since,
            before: started,
            max_age,
        };
        // Another relay's pass acknowledged after the state was read can be recorded by now,
        // above it: the stream is read on to its end before such an event is judged. Only
        // those noted here are: one recorded later is the next check's.
        let through = if storage::note_above(&mut tx, &lost).await? {
            let (more, end) = self.read_past(&stream, &state, read_to, &mut tx).await?;
            newest.scanned += more.scanned;
            newest.last = more.last.or(newest.last);
            end
        } else {
            read_to
        };
        report.scanned = newest.scanned;
        let moved = storage::move_back_lost(&mut tx, &storage::Lost { through, ..lost }).await?;
        let at = newest.last.map_or_else(
            || {
                holding.map_or((state.last_seq, None), |check| {
                    (check.seq, check.message_id.clone())
                })
            },
            |(seq, id)| (seq, Some(id)),
        );
        storage::record_check(&mut tx, &self.spec.name, state.created, at.0, at.1.clone()).await?;
        tx.commit().await?;
        report.republished = moved.len() as u64;
        if !moved.is_empty() {
            tracing::warn!(
                stream = %self.spec.name, events = moved.len(), first_seq = moved.first(),
                "the broker lost events it had acknowledged: they are published again"
            );
            metrics::counter!("outbox_republished_total").increment(report.republished);
        }
        storage::forget_old_checks(conn, &self.spec.name).await?;
        let position = Position {
            created: state.created,
            seq: at.0,
            message_id: at.1,
        };
        Ok((report, position))
    }

    /// Reads the ids of the messages the stream stored after `read_to` since its `state` was
    /// read, and says up to which sequence it read. Nothing when the stream is gone or was
    /// made again meanwhile: the events noted above the read are then judged lost (those the
    /// new stream stored are published again, copies its consumers drop), and the relay's
    /// next acknowledgement, at or below one it had, sets off a full check of the new one.
    async fn read_past(
        &self,
        stream: &stream::Stream,
        state: &StreamState,
        read_to: u64,
        conn: &mut sqlx::PgConnection,
    ) -> Result<(scan::Scanned, u64), RepairError> {
        match self.stream().await? {
            Some((_, now)) if now.created == state.created && now.last_seq > read_to => {
                let scanned = scan::read_ids(stream, read_to, now.last_seq, conn).await?;
                Ok((scanned, now.last_seq))
            }
            _ => Ok((scan::Scanned::default(), read_to)),
        }
    }

    /// The light check: the stream is `created`, and holds `message_id` at `seq`. Returns the
    /// stream's state when it does; `None` when a full check is needed.
    pub(crate) async fn holds(
        &self,
        created: DateTime<Utc>,
        seq: u64,
        message_id: Option<&str>,
    ) -> Result<Option<StreamState>, RepairError> {
        let Some((stream, state)) = self.stream().await? else {
            return Ok(None);
        };
        if state.created != created || state.last_seq < seq {
            return Ok(None);
        }
        let found = scan::message_id_at(&stream, seq).await?;
        Ok((seq == 0 || found.as_deref() == message_id).then_some(state))
    }

    /// Records a position the relay found holding.
    pub(crate) async fn record(
        &self,
        pool: &PgPool,
        created: DateTime<Utc>,
        seq: u64,
        message_id: String,
    ) -> Result<(), RepairError> {
        let mut conn = pool.acquire().await?;
        storage::record_check(&mut conn, &self.spec.name, created, seq, Some(message_id)).await?;
        Ok(())
    }
}

/// A stream of its own for a unit test, on `NATS_URL`: the context, the stream, its name.
#[cfg(test)]
async fn stream_for_test() -> (jetstream::Context, stream::Stream, String) {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let context = jetstream::new(async_nats::connect(url).await.expect("NATS"));
    let name = format!("SCAN_{}", uuid::Uuid::new_v4().simple());
    let stream = context
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    (context, stream, name)
}
