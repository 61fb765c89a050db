//! The relay: claims pending outbox rows, publishes them, and records the outcome.
//!
//! One pass ([`Relay::run_once`]) works in one database transaction:
//! 1. claim up to `batch_size` due rows with `FOR UPDATE SKIP LOCKED`, keeping only rows whose
//!    earlier unpublished events are in the same claim (another relay may hold the rest);
//! 2. publish in waves: the first event of every aggregate, then the second, and so on, each
//!    wave pipelined; a failed event drops its aggregate's later events from the pass;
//! 3. mark the acknowledged rows published (or delete them, see
//!    [`RelayConfig::delete_published`]) and the failed ones retried later (or dead), commit.
//!
//! [`Relay::run`] overlaps passes: one is recorded while the next is claimed and published;
//! under a backlog one pass is claimed while the one before it is published and the one
//! before that is recorded.
//!
//! A crash between publish and commit publishes the row again; the broker drops the copy inside
//! its duplicate window (`Nats-Msg-Id`) and the consumer's inbox drops it after that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use chrono::SecondsFormat;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::outbox::storage::{self, Claimed};
use crate::{Backoff, Message, Publisher, Wakeup, headers};

/// How the relay runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// First subject token; a message goes to `{prefix}.{event_type}.{aggregate_id}`.
    pub subject_prefix: String,
    /// The CloudEvents `source` attribute, e.g. `/orders-service`.
    pub source: String,
    /// Most rows claimed per pass.
    pub batch_size: i64,
    /// Attempts after which an event is dead and parks its aggregate.
    pub max_attempts: i32,
    /// Wait between passes when there was nothing (more) to do.
    pub poll_interval: Duration,
    /// Delay between attempts of an event the broker refused; each refusal counts toward
    /// `max_attempts`.
    pub backoff: Backoff,
    /// Delay before publishing again while the broker is unreachable or does not acknowledge,
    /// by the number of passes in a row that reached nothing. These failures never count
    /// toward `max_attempts`: an outage, however long, makes no event dead.
    pub unreachable_backoff: Backoff,
    /// Delete rows as they are published instead of marking them `published` (and leaving
    /// them to [`crate::Cleanup`]). Cheaper for the database: a delete writes no new row
    /// version and no index entries.
    pub delete_published: bool,
    /// Longest a pass holds its claimed rows. PostgreSQL ends the session of a relay that stays
    /// silent inside its transaction for longer (`idle_in_transaction_session_timeout`, set
    /// for the claim's transaction only), so a relay cut off from the database after a claim
    /// lets its rows go to the other relays within this time; a pass starts no new wave of
    /// publishes once half of it has gone (the rest stay pending for the next pass). Keep it
    /// above four times the longest a wave can take (the publisher's timeout, times the
    /// number of its windows a batch fills).
    pub lease: Duration,
}

impl RelayConfig {
    /// Defaults for everything but the subject prefix and the CloudEvents source.
    pub fn new(subject_prefix: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            subject_prefix: subject_prefix.into(),
            source: source.into(),
            batch_size: 1000,
            max_attempts: 10,
            poll_interval: Duration::from_millis(500),
            backoff: Backoff::default(),
            unreachable_backoff: Backoff {
                base: Duration::from_millis(100),
                max: Duration::from_secs(5),
            },
            delete_published: false,
            lease: Duration::from_secs(30),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Rows claimed and eligible (heads of their aggregate within the claim).
    pub claimed: usize,
    /// Rows acknowledged by the broker and marked published.
    pub published: usize,
    /// Rows whose publish failed this pass (including those that became dead).
    pub failed: usize,
    /// Rows that became dead this pass.
    pub dead: usize,
}

/// Publishes committed outbox rows.
#[derive(Debug)]
pub struct Relay<P> {
    pool: PgPool,
    publisher: P,
    config: RelayConfig,
    /// Passes in a row whose publishes all failed transiently (0: the broker is reachable).
    outage: AtomicU32,
    /// Changes when code of this process committed events ([`Relay::with_wakeup`]).
    woken: Option<watch::Receiver<u64>>,
}

impl<P: Publisher> Relay<P> {
    /// A relay over the outbox in `pool`.
    pub fn new(pool: PgPool, publisher: P, config: RelayConfig) -> Self {
        Self {
            pool,
            publisher,
            config,
            outage: AtomicU32::new(0),
            woken: None,
        }
    }

    /// Wakes this relay when code of this process commits through `wakeup` (see
    /// [`crate::wakeup`]), as soon as the commit is made.
    #[must_use]
    pub fn with_wakeup(mut self, wakeup: &Wakeup) -> Self {
        self.woken = Some(wakeup.subscribe());
        self
    }

    /// Runs passes until `shutdown` is cancelled; published passes are recorded first, a
    /// claimed one not yet published is let go.
    ///
    /// Commits wake the relay at once when they are told through its [`Wakeup`] (in this
    /// process) or a `NOTIFY` on [`crate::outbox::CHANNEL`] (from others; the relay listens
    /// before its first pass, and a dropped listener connection is re-established by the next
    /// wait); `poll_interval` is the fallback for commits nobody told about.
    ///
    /// Passes overlap, each on its own transaction: while one pass's outcome is recorded the
    /// next is claimed and published, and while claims come back full (a backlog) a full claim
    /// is published in the following round, alongside the next claim. `SKIP LOCKED` keeps each
    /// pass's rows out of the others' claims, and the per-aggregate barrier holds back any
    /// later event of theirs, exactly as between two relays; rows held back are claimed again
    /// as soon as the passes ahead of them are recorded.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(prefix = %self.config.subject_prefix, "relay started");
        let mut listener = None;
        let mut woken = self.woken.clone();
        let mut claimed: Option<Claim> = None;
        let mut unrecorded: Vec<Pass> = Vec::new();
        while !shutdown.is_cancelled() {
            if listener.is_none() {
                listener = self.listen().await;
            }
            // While the broker is unreachable, one claim at a time, each after a pause: the
            // backlog is not cycled through (and rewritten) as fast as the database allows.
            let outage = self.outage.load(Ordering::Relaxed);
            let in_flight = claimed.is_some() || !unrecorded.is_empty();
            if outage > 0 && !in_flight {
                let pause = self
                    .config
                    .unreachable_backoff
                    .delay(outage, &mut rand::rng());
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
            let claiming = outage == 0 || !in_flight;
            let (recorded, published, next) = tokio::join!(
                self.record_all(std::mem::take(&mut unrecorded)),
                self.publish_if_any(claimed.take()),
                async {
                    if claiming {
                        self.claim_next().await
                    } else {
                        Ok(Next::Nothing { held_back: false })
                    }
                },
            );
            unrecorded.extend(published);
            let mut failed = recorded.is_err();
            let mut held_back = false;
            match next {
                Ok(Next::Backlog(claim)) => claimed = Some(claim),
                Ok(Next::Published {
                    pass,
                    held_back: held,
                }) => {
                    unrecorded.push(pass);
                    held_back = held;
                }
                Ok(Next::Nothing { held_back: held }) => held_back = held,
                Err(error) => {
                    tracing::error!(error = ?error, "relay pass failed");
                    failed = true;
                }
            }
            if claimed.is_some() || !unrecorded.is_empty() {
                continue;
            }
            // Nothing to publish and no pass holding rows: during an outage, only asking
            // tells whether the broker is back.
            if self.outage.load(Ordering::Relaxed) > 0
                && self.publisher.reachable().await == Some(true)
            {
                self.note_reachability(true, false);
            }
            let wait = if failed {
                self.config.poll_interval.max(Duration::from_secs(1))
            } else if held_back {
                HELD_BACK_WAIT.min(self.config.poll_interval)
            } else {
                self.config.poll_interval
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(wait) => {}
                () = notified(&mut listener) => {}
                () = committed(&mut woken) => {}
            }
            // One pass serves every commit notified so far.
            if let Some(listener) = &mut listener {
                while listener.next_buffered().is_some() {}
            }
        }
        let _ = self.record_all(unrecorded).await;
        tracing::info!("relay stopped");
    }

    /// Claims the next rows: a full claim (a backlog) is returned to be published in the next
    /// round, a partial one is published at once.
    async fn claim_next(&self) -> sqlx::Result<Next> {
        let claim = self.claim().await?;
        let held_back = claim.locked > claim.rows.len();
        Ok(if claim.rows.is_empty() {
            // Let go of the held-back rows now: a dropped transaction is rolled back only
            // when its connection is next used, and until then a claim after the wait would
            // skip the still-locked rows, find nothing and wait for the poll.
            claim.tx.rollback().await?;
            Next::Nothing { held_back }
        } else if claim.locked as i64 >= self.config.batch_size {
            Next::Backlog(claim)
        } else {
            Next::Published {
                pass: self.publish(claim).await,
                held_back,
            }
        })
    }

    /// [`Relay::record`]s passes side by side; an error is logged, and reported once.
    async fn record_all(&self, passes: Vec<Pass>) -> Result<(), ()> {
        let results = futures::future::join_all(passes.into_iter().map(|p| self.record(p))).await;
        let mut outcome = Ok(());
        for error in results.into_iter().filter_map(Result::err) {
            tracing::error!(error = ?error, "relay pass failed");
            outcome = Err(());
        }
        outcome
    }

    async fn listen(&self) -> Option<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await.ok()?;
        match listener.listen(crate::outbox::CHANNEL).await {
            Ok(()) => Some(listener),
            Err(error) => {
                tracing::warn!(error = ?error, "cannot listen for commits; polling only");
                None
            }
        }
    }

    /// One pass: claim, publish, record. See the module documentation.
    pub async fn run_once(&self) -> sqlx::Result<BatchReport> {
        let claim = self.claim().await?;
        let pass = self.publish(claim).await;
        self.record(pass).await
    }

    /// Claims due rows in a new transaction, which stays open, holding them, until
    /// [`Relay::record`].
    async fn claim(&self) -> sqlx::Result<Claim> {
        let mut tx = storage::begin_claim(&self.pool, self.config.lease).await?;
        let rows = storage::claim(&mut tx, self.config.batch_size).await?;
        let locked = rows.len();
        let rows = rows.into_iter().filter(|row| !row.held_back).collect();
        Ok(Claim {
            tx,
            locked,
            rows,
            since: tokio::time::Instant::now(),
        })
    }

    /// Starts the lease's idle time again when a quarter of it has gone since `since` (the
    /// transaction's last statement), so that at least three quarters are always left for what
    /// comes next; returns when the last statement now was, or the error of the renewal.
    async fn renew_lease(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        since: tokio::time::Instant,
    ) -> Result<tokio::time::Instant, sqlx::Error> {
        if since.elapsed() <= self.config.lease / 4 {
            return Ok(since);
        }
        storage::lease(tx, self.config.lease).await?;
        Ok(tokio::time::Instant::now())
    }

    /// [`Relay::publish`] for a claim, if there is one.
    async fn publish_if_any(&self, claim: Option<Claim>) -> Option<Pass> {
        match claim {
            Some(claim) => Some(self.publish(claim).await),
            None => None,
        }
    }

    /// Publishes a claim's rows in waves, one event per aggregate each (see the module
    /// documentation).
    async fn publish(&self, claim: Claim) -> Pass {
        let Claim {
            tx, rows, since, ..
        } = claim;
        let mut pass = Pass {
            report: BatchReport {
                claimed: rows.len(),
                ..BatchReport::default()
            },
            tx,
            published: Vec::new(),
            failed: Failures::default(),
        };
        // The lease runs from each statement: renewed now if a full claim waited a round, and
        // after the last wave if the waves took long, since the record may wait for another
        // pass. A pass that publishes at once and quickly needs neither.
        let Ok(since) = self.renew_lease(&mut pass.tx, since).await else {
            // The connection is gone: nothing is published, and the record says why.
            return pass;
        };
        // Counted from the transaction's last statement, not from now: the idle time the
        // server measures began then.
        let until = since + self.config.lease / 2;
        let (waves, aggregates) = into_waves(rows);
        let mut failed_aggregates = vec![false; aggregates];
        let (mut reached, mut unreached) = (false, false);
        for wave in waves {
            if tokio::time::Instant::now() >= until {
                // Its session may soon be ended (see `RelayConfig::lease`): what is left stays
                // pending, untouched, for the next pass.
                tracing::warn!("pass out of time; the rest of its rows wait for the next pass");
                break;
            }
            // Later events of a failed aggregate must not overtake the failed one.
            let mut wave: Vec<(usize, Claimed)> = wave
                .into_iter()
                .filter(|(aggregate, _)| !failed_aggregates[*aggregate])
                .collect();
            if wave.is_empty() {
                // A later wave holds only aggregates of this one, all failed.
                break;
            }
            let messages = wave.iter_mut().map(|(_, row)| self.message(row)).collect();
            let results = self.publisher.publish(messages).await;
            for ((aggregate, row), result) in wave.into_iter().zip(results) {
                match result {
                    Ok(()) => {
                        reached = true;
                        pass.published.push((row.seq, row.created_at));
                    }
                    Err(error) if error.is_transient() => {
                        unreached = true;
                        let passes = self.outage.load(Ordering::Relaxed) + 1;
                        let delay = self
                            .config
                            .unreachable_backoff
                            .delay(passes, &mut rand::rng());
                        tracing::debug!(
                            event.id = %row.id, aggregate.id = %row.aggregate_id,
                            error = %error.chain(), "publish failed; retried, not counted"
                        );
                        pass.failed.push(row.seq, error.chain(), delay, false);
                        failed_aggregates[aggregate] = true;
                    }
                    Err(error) => {
                        reached = true;
                        let attempts = row.attempts.unsigned_abs() + 1;
                        let delay = self.config.backoff.delay(attempts, &mut rand::rng());
                        tracing::warn!(
                            event.id = %row.id, aggregate.id = %row.aggregate_id, attempts,
                            error = %error.chain(), "publish refused by the broker"
                        );
                        pass.failed.push(row.seq, error.chain(), delay, true);
                        failed_aggregates[aggregate] = true;
                    }
                }
            }
        }
        self.note_reachability(reached, unreached);
        // An error here is the record's to report.
        let _ = self.renew_lease(&mut pass.tx, since).await;
        pass
    }

    /// Tracks whether the broker is reachable from what a pass saw, logging each change and
    /// keeping `outbox_broker_unreachable` (1 while unreachable) up to date.
    fn note_reachability(&self, reached: bool, unreached: bool) {
        if reached {
            let passes = self.outage.swap(0, Ordering::Relaxed);
            if passes > 0 {
                tracing::info!(passes, "broker reachable again; publishing resumes");
                metrics::gauge!("outbox_broker_unreachable").set(0.0);
            }
        } else if unreached && self.outage.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "broker unreachable: events stay pending and are retried until it is back \
                 (an outage never makes an event dead)"
            );
            metrics::gauge!("outbox_broker_unreachable").set(1.0);
        }
    }

    /// Marks a pass's acknowledged rows published and its failed ones retried later (or dead),
    /// commits, and counts the outcome.
    async fn record(&self, pass: Pass) -> sqlx::Result<BatchReport> {
        let Pass {
            mut report,
            mut tx,
            published,
            failed,
        } = pass;
        if !published.is_empty() {
            let seqs: Vec<i64> = published.iter().map(|(seq, _)| *seq).collect();
            if self.config.delete_published {
                storage::delete_published(&mut tx, &seqs).await?;
            } else {
                storage::mark_published(&mut tx, &seqs).await?;
            }
        }
        let dead = if failed.seqs.is_empty() {
            Vec::new()
        } else {
            storage::mark_failed(
                &mut tx,
                &failed.seqs,
                &failed.errors,
                &failed.delays,
                &failed.counted,
                self.config.max_attempts,
            )
            .await?
        };
        tx.commit().await?;
        if report.claimed == 0 {
            return Ok(report);
        }

        let now = chrono::Utc::now();
        for (_, created_at) in &published {
            let latency = (now - *created_at).to_std().unwrap_or_default();
            metrics::histogram!("outbox_commit_to_ack_seconds").record(latency.as_secs_f64());
        }
        metrics::counter!("outbox_published_total").increment(published.len() as u64);
        metrics::counter!("outbox_publish_failures_total").increment(failed.seqs.len() as u64);
        metrics::counter!("outbox_dead_total").increment(dead.len() as u64);
        metrics::histogram!("outbox_relay_batch_size").record(report.claimed as f64);
        for seq in &dead {
            tracing::error!(outbox.seq = seq, "event is dead; its aggregate is parked");
        }
        report.published = published.len();
        report.failed = failed.seqs.len();
        report.dead = dead.len();
        Ok(report)
    }

    /// The broker message for a row: CloudEvents binary mode over NATS headers. Takes the
    /// row's payload, which is not needed after publishing.
    fn message(&self, row: &mut Claimed) -> Message {
        // Header names are built once, at compile time; values are moved in where they are
        // already owned strings: this runs for every event, and allocating and copying were
        // about a quarter of the relay's CPU time.
        const SPECVERSION: HeaderName = HeaderName::from_static(headers::SPECVERSION);
        const ID: HeaderName = HeaderName::from_static(headers::ID);
        const TYPE: HeaderName = HeaderName::from_static(headers::TYPE);
        const SOURCE: HeaderName = HeaderName::from_static(headers::SOURCE);
        const SUBJECT: HeaderName = HeaderName::from_static(headers::SUBJECT);
        const TIME: HeaderName = HeaderName::from_static(headers::TIME);
        const CONTENT_TYPE: HeaderName = HeaderName::from_static(headers::CONTENT_TYPE);
        const TRACEPARENT: HeaderName = HeaderName::from_static(headers::TRACEPARENT);
        let mut headers = HeaderMap::new();
        headers.insert(SPECVERSION, "1.0");
        headers.insert(ID, HeaderValue::from(row.id.to_string()));
        headers.insert(TYPE, row.event_type.as_str());
        headers.insert(SOURCE, self.config.source.as_str());
        headers.insert(SUBJECT, row.aggregate_id.as_str());
        headers.insert(
            TIME,
            HeaderValue::from(row.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        );
        headers.insert(CONTENT_TYPE, "application/json");
        if let Some(traceparent) = row.traceparent.take() {
            headers.insert(TRACEPARENT, HeaderValue::from(traceparent));
        }
        Message {
            id: row.id,
            subject: format!(
                "{}.{}.{}",
                self.config.subject_prefix, row.event_type, row.aggregate_id
            ),
            headers,
            payload: Bytes::from(std::mem::take(&mut row.payload)),
        }
    }
}

/// Resolves when a commit was notified, or when notifications may have been missed (the
/// connection was re-established, or failed and is dropped so the next loop listens anew);
/// never without a listener.
async fn notified(listener: &mut Option<PgListener>) {
    let Some(active) = listener else {
        return std::future::pending().await;
    };
    if let Err(error) = active.try_recv().await {
        tracing::warn!(error = ?error, "commit listener failed; listening again shortly");
        *listener = None;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Resolves when code of this process committed events since the last call; never without a
/// [`Wakeup`], or once every handle of it is gone.
async fn committed(woken: &mut Option<watch::Receiver<u64>>) {
    let Some(receiver) = woken else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *woken = None;
        std::future::pending::<()>().await;
    }
}

/// Splits claimed rows (in seq order) into waves: the first event of every aggregate, then
/// the second, and so on, each row with its aggregate's number; also returns how many
/// aggregates there are.
fn into_waves(rows: Vec<Claimed>) -> (Vec<Vec<(usize, Claimed)>>, usize) {
    let mut aggregates: HashMap<(&str, &str), (usize, usize)> = HashMap::new();
    let places: Vec<(usize, usize)> = rows
        .iter()
        .map(|row| {
            let next = aggregates.len();
            let key = (row.aggregate_type.as_str(), row.aggregate_id.as_str());
            let (aggregate, events) = aggregates.entry(key).or_insert((next, 0));
            *events += 1;
            (*aggregate, *events - 1)
        })
        .collect();
    let count = aggregates.len();
    let mut waves: Vec<Vec<(usize, Claimed)>> = Vec::new();
    for (row, (aggregate, wave)) in rows.into_iter().zip(places) {
        if wave == waves.len() {
            waves.push(Vec::new());
        }
        waves[wave].push((aggregate, row));
    }
    (waves, count)
}

/// Wait before claiming again when rows were held back behind another relay's pass.
const HELD_BACK_WAIT: Duration = Duration::from_millis(10);

/// What a claim led to.
enum Next {
    /// A full claim, to publish in the next round.
    Backlog(Claim),
    /// A partial claim, published; and whether rows were held back.
    Published { pass: Pass, held_back: bool },
    /// Nothing to publish; whether rows were held back.
    Nothing { held_back: bool },
}

/// Rows claimed by a transaction that holds them until they are recorded.
struct Claim {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// Rows locked, held-back ones included.
    locked: usize,
    /// Rows to publish, in seq order.
    rows: Vec<Claimed>,
    /// When the claim's statement ended: the lease's idle time runs from then.
    since: tokio::time::Instant,
}

/// A pass whose rows were published (or failed) but not yet recorded: its transaction still
/// holds them.
struct Pass {
    report: BatchReport,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    published: Vec<(i64, chrono::DateTime<chrono::Utc>)>,
    failed: Failures,
}

/// Failed rows, as the column arrays `mark_failed` takes.
#[derive(Default)]
struct Failures {
    seqs: Vec<i64>,
    errors: Vec<String>,
    delays: Vec<f64>,
    /// Whether the failure counts toward `max_attempts` (the broker refused the message).
    counted: Vec<bool>,
}

impl Failures {
    fn push(&mut self, seq: i64, error: String, delay: Duration, counted: bool) {
        self.seqs.push(seq);
        self.errors.push(error);
        self.delays.push(delay.as_secs_f64());
        self.counted.push(counted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, aggregate_id: &str) -> Claimed {
        Claimed {
            seq,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: "OrderPlaced".into(),
            payload: "{}".into(),
            traceparent: None,
            attempts: 0,
            created_at: chrono::Utc::now(),
            held_back: false,
        }
    }

    #[test]
    fn waves_hold_one_event_per_aggregate_in_seq_order() {
        let rows = vec![
            row(1, "a"),
            row(2, "b"),
            row(3, "a"),
            row(4, "c"),
            row(5, "a"),
        ];
        let (waves, aggregates) = into_waves(rows);
        let seqs: Vec<Vec<(usize, i64)>> = waves
            .iter()
            .map(|wave| wave.iter().map(|(a, row)| (*a, row.seq)).collect())
            .collect();
        assert_eq!(aggregates, 3);
        assert_eq!(
            seqs,
            [vec![(0, 1), (1, 2), (2, 4)], vec![(0, 3)], vec![(0, 5)]]
        );
    }
}
