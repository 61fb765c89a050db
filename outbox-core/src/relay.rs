//! The relay: claims pending outbox rows, publishes them, and records the outcome.
//!
//! One pass ([`Relay::run_once`]) works in one database transaction:
//! 1. claim up to `batch_size` due rows with `FOR UPDATE SKIP LOCKED`, keeping only rows whose
//!    earlier unpublished events are in the same claim (another relay may hold the rest);
//! 2. publish in waves: the first event of every aggregate, then the second, and so on, each
//!    wave pipelined; a failed event drops its aggregate's later events from the pass;
//! 3. mark the acknowledged rows published and the failed ones retried later (or dead), commit.
//!
//! Under a backlog, [`Relay::run`] overlaps step 3 of one pass with steps 1–2 of the next.
//!
//! A crash between publish and commit publishes the row again; the broker drops the copy inside
//! its duplicate window (`Nats-Msg-Id`) and the consumer's inbox drops it after that.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use chrono::SecondsFormat;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::outbox::storage::{self, Claimed};
use crate::{Backoff, Error, Message, Publisher};

/// How the relay runs.
#[derive(Debug, Clone)]
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
    /// Delay between attempts of a failed event.
    pub backoff: Backoff,
}

impl RelayConfig {
    /// Defaults for everything but the subject prefix and the CloudEvents source.
    pub fn new(subject_prefix: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            subject_prefix: subject_prefix.into(),
            source: source.into(),
            batch_size: 500,
            max_attempts: 10,
            poll_interval: Duration::from_millis(500),
            backoff: Backoff::default(),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

impl<P: Publisher> Relay<P> {
    /// A relay over the outbox in `pool`.
    pub fn new(pool: PgPool, publisher: P, config: RelayConfig) -> Self {
        Self {
            pool,
            publisher,
            config,
        }
    }

    /// Runs passes until `shutdown` is cancelled; a pass in progress is finished first.
    ///
    /// The relay listens on [`crate::outbox::CHANNEL`] before its first pass, so a commit that
    /// enqueues wakes it at once; `poll_interval` remains the fallback when notifications are
    /// lost (a dropped listener connection is re-established by the next wait).
    ///
    /// While a backlog lasts (full batches), a pass's outcome is recorded and committed while
    /// the next pass claims and publishes on a second connection: `SKIP LOCKED` keeps the
    /// recording pass's rows out of the next claim, and the per-aggregate barrier holds back
    /// any later event of theirs, exactly as between two relays.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(prefix = %self.config.subject_prefix, "relay started");
        let mut listener = None;
        let mut published_unrecorded: Option<Pass> = None;
        while !shutdown.is_cancelled() {
            if listener.is_none() {
                listener = self.listen().await;
            }
            let (recorded, next) = tokio::join!(
                self.record_if_any(published_unrecorded.take()),
                self.claim_and_publish()
            );
            if let Err(error) = recorded {
                tracing::error!(error = ?error, "relay pass failed");
            }
            let wait = match next {
                Ok(pass) if pass.report.claimed as i64 >= self.config.batch_size => {
                    published_unrecorded = Some(pass);
                    continue;
                }
                Ok(pass) => match self.record(pass).await {
                    Ok(_) => self.config.poll_interval,
                    Err(error) => {
                        tracing::error!(error = ?error, "relay pass failed");
                        self.config.poll_interval.max(Duration::from_secs(1))
                    }
                },
                Err(error) => {
                    tracing::error!(error = ?error, "relay pass failed");
                    self.config.poll_interval.max(Duration::from_secs(1))
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(wait) => {}
                () = notified(&mut listener) => {}
            }
            // One pass serves every commit notified so far.
            if let Some(listener) = &mut listener {
                while listener.next_buffered().is_some() {}
            }
        }
        if let Err(error) = self.record_if_any(published_unrecorded).await {
            tracing::error!(error = ?error, "relay pass failed");
        }
        tracing::info!("relay stopped");
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
    pub async fn run_once(&self) -> Result<BatchReport, Error> {
        let pass = self.claim_and_publish().await?;
        self.record(pass).await
    }

    /// Claims due rows in a new transaction and publishes them; the transaction stays open,
    /// holding the rows, until [`Relay::record`].
    async fn claim_and_publish(&self) -> Result<Pass, Error> {
        let mut tx = self.pool.begin().await?;
        let claimed = storage::claim(&mut tx, self.config.batch_size).await?;
        let mut pass = Pass {
            report: BatchReport {
                claimed: claimed.len(),
                ..BatchReport::default()
            },
            tx,
            published: Vec::new(),
            failed: Failures::default(),
        };
        let mut queues = by_aggregate(claimed);
        loop {
            let wave: Vec<(usize, Claimed)> = queues
                .iter_mut()
                .enumerate()
                .filter_map(|(i, queue)| queue.pop_front().map(|row| (i, row)))
                .collect();
            if wave.is_empty() {
                break;
            }
            let messages = wave.iter().map(|(_, row)| self.message(row)).collect();
            let results = self.publisher.publish(messages).await;
            for ((queue, row), result) in wave.into_iter().zip(results) {
                match result {
                    Ok(()) => pass.published.push((row.seq, row.created_at)),
                    Err(error) => {
                        let attempts = row.attempts.unsigned_abs() + 1;
                        let delay = self.config.backoff.delay(attempts, &mut rand::rng());
                        tracing::warn!(
                            event.id = %row.id, aggregate.id = %row.aggregate_id, attempts,
                            error = %error.chain(), "publish failed"
                        );
                        pass.failed.push(row.seq, error.chain(), delay);
                        // Later events of this aggregate must not overtake the failed one.
                        queues[queue].clear();
                    }
                }
            }
        }
        Ok(pass)
    }

    /// [`Relay::record`] for a pass, if there is one.
    async fn record_if_any(&self, pass: Option<Pass>) -> Result<(), Error> {
        match pass {
            Some(pass) => self.record(pass).await.map(drop),
            None => Ok(()),
        }
    }

    /// Marks a pass's acknowledged rows published and its failed ones retried later (or dead),
    /// commits, and counts the outcome.
    async fn record(&self, pass: Pass) -> Result<BatchReport, Error> {
        let Pass {
            mut report,
            mut tx,
            published,
            failed,
        } = pass;
        if !published.is_empty() {
            let seqs: Vec<i64> = published.iter().map(|(seq, _)| *seq).collect();
            storage::mark_published(&mut tx, &seqs).await?;
        }
        let dead = if failed.seqs.is_empty() {
            Vec::new()
        } else {
            storage::mark_failed(
                &mut tx,
                &failed.seqs,
                &failed.errors,
                &failed.delays,
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

    /// The broker message for a row: CloudEvents binary mode over NATS headers.
    fn message(&self, row: &Claimed) -> Message {
        let mut headers = HeaderMap::new();
        headers.insert("ce-specversion", "1.0");
        headers.insert("ce-id", row.id.to_string().as_str());
        headers.insert("ce-type", row.event_type.as_str());
        headers.insert("ce-source", self.config.source.as_str());
        headers.insert("ce-subject", row.aggregate_id.as_str());
        headers.insert(
            "ce-time",
            row.created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true)
                .as_str(),
        );
        headers.insert("content-type", "application/json");
        if let Some(traceparent) = &row.traceparent {
            headers.insert("traceparent", traceparent.as_str());
        }
        Message {
            id: row.id,
            subject: format!(
                "{}.{}.{}",
                self.config.subject_prefix, row.event_type, row.aggregate_id
            ),
            headers,
            payload: Bytes::from(row.payload.clone()),
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

/// Splits claimed rows (in seq order) into one queue per aggregate, each in seq order.
fn by_aggregate(rows: Vec<Claimed>) -> Vec<VecDeque<Claimed>> {
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut queues: Vec<VecDeque<Claimed>> = Vec::new();
    for row in rows {
        let key = (row.aggregate_type.clone(), row.aggregate_id.clone());
        let i = *index.entry(key).or_insert_with(|| {
            queues.push(VecDeque::new());
            queues.len() - 1
        });
        queues[i].push_back(row);
    }
    queues
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
}

impl Failures {
    fn push(&mut self, seq: i64, error: String, delay: Duration) {
        self.seqs.push(seq);
        self.errors.push(error);
        self.delays.push(delay.as_secs_f64());
    }
}
