//! One pass: claim due rows, publish them in waves, record the outcome; its transaction holds
//! the rows from the claim to the record.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::storage::{self, Claimed, Failures};
use super::{BatchReport, Relay};
use crate::{Ack, Message, PublishError, Publisher};

impl<P: Publisher> Relay<P> {
    /// Claims due rows in a new transaction, which stays open, holding them, until
    /// [`Relay::record`].
    pub(super) async fn claim(&self) -> sqlx::Result<Claim> {
        // A commit the WAL brings meanwhile waits for this claim to end before it wakes the
        // relay: the claim may be taking its events.
        let _claiming = self.wakeup.as_ref().and_then(|w| w.claims().claiming());
        let mut tx = storage::begin_claim(&self.pool, self.config.lease).await?;
        let rows = storage::claim(&mut tx, self.config.batch_size, self.longest_delay()).await?;
        if let Some(wakeup) = &self.wakeup {
            // Held-back rows too: the relay claims them again on its own.
            wakeup.claims().note(rows.iter().map(|row| row.seq));
        }
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
    pub(super) async fn publish_if_any(&self, claim: Option<Claim>) -> Option<Pass> {
        match claim {
            Some(claim) => Some(self.publish(claim).await),
            None => None,
        }
    }

    /// Publishes a claim's rows in waves, one event per aggregate each (see the `relay`
    /// module's documentation).
    pub(super) async fn publish(&self, claim: Claim) -> Pass {
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
            if self.full_check_due() {
                // A reconnect, or a sign the stream lost messages: the stream is checked (and
                // what it lost moved back) before any later event goes out, or it could overtake
                // an earlier one of its aggregate that is to be published again.
                break;
            }
            // Later events of a failed aggregate must not overtake the failed one.
            let mut wave: Vec<(usize, Claimed)> = wave
                .into_iter()
                .filter(|(aggregate, _)| !failed_aggregates[*aggregate])
                .collect();
            let mut messages = Vec::with_capacity(wave.len());
            wave.retain_mut(|(aggregate, row)| match self.message(row) {
                Ok(message) => {
                    messages.push(message);
                    true
                }
                Err(reason) => {
                    tracing::error!(
                        event.id = %row.id, outbox.seq = row.seq, reason,
                        "event cannot be published; it is dead and its aggregate is parked"
                    );
                    pass.failed.push_fatal(row.seq, reason);
                    failed_aggregates[*aggregate] = true;
                    false
                }
            });
            if wave.is_empty() {
                // A later wave holds only aggregates of this one, all failed.
                break;
            }
            // Any stream sequence acknowledged from here on is above this one, unless the
            // stream lost what it had stored.
            let floor = self.acked_high.load(Ordering::Acquire);
            let results = self.publish_unless_stored(&wave, messages).await;
            for ((aggregate, row), result) in wave.into_iter().zip(results) {
                match self.settle(&mut pass, &row, result, floor) {
                    Settled::Published => reached = true,
                    Settled::Unreached => {
                        unreached = true;
                        failed_aggregates[aggregate] = true;
                    }
                    Settled::Refused => {
                        reached = true;
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

    /// Publishes a wave's messages, except those an earlier publish may have stored
    /// unacknowledged which the stream is found to hold: their outcome is where it holds them.
    /// The results are in the wave's order.
    async fn publish_unless_stored(
        &self,
        wave: &[(usize, Claimed)],
        messages: Vec<Message>,
    ) -> Vec<Result<Ack, PublishError>> {
        let known: Vec<Option<Result<Ack, PublishError>>> = futures::future::join_all(
            wave.iter()
                .zip(&messages)
                .map(|((_, row), message)| self.stored(row, message)),
        )
        .await;
        let unknown: Vec<Message> = messages
            .into_iter()
            .zip(&known)
            .filter_map(|(message, known)| known.is_none().then_some(message))
            .collect();
        let mut sent = if unknown.is_empty() {
            Vec::new()
        } else {
            self.publisher.publish(unknown).await
        }
        .into_iter();
        known
            .into_iter()
            .map(|known| {
                known.unwrap_or_else(|| {
                    sent.next().unwrap_or_else(|| {
                        Err(PublishError::NoAck(
                            "the publisher returned no result".into(),
                        ))
                    })
                })
            })
            .collect()
    }

    /// Where the stream holds `row`'s message if an earlier publish may have stored it and it
    /// does, or why the stream could not be asked; `None`: publish it.
    async fn stored(&self, row: &Claimed, message: &Message) -> Option<Result<Ack, PublishError>> {
        if !row.maybe_published {
            return None;
        }
        match self.publisher.stored(message).await {
            Ok(Some(ack)) => {
                tracing::info!(
                    event.id = %row.id, stream.seq = ack.stream_seq,
                    "an earlier publish with no clear answer was stored: not published again"
                );
                metrics::counter!("outbox_found_stored_total").increment(1);
                Some(Ok(ack))
            }
            Ok(None) => None,
            Err(error) => Some(Err(error)),
        }
    }

    /// Notes the broker's answer to `row`'s publish in `pass`.
    fn settle(
        &self,
        pass: &mut Pass,
        row: &Claimed,
        result: Result<Ack, PublishError>,
        floor: u64,
    ) -> Settled {
        match result {
            Ok(ack) => {
                if !ack.duplicate {
                    if ack.stream_seq <= floor {
                        self.stream_went_back(ack.stream_seq, floor);
                    }
                    self.acked(ack.stream_seq, row.id);
                }
                pass.published.push(Published {
                    seq: row.seq,
                    created_at: row.created_at,
                    stream_seq: i64::try_from(ack.stream_seq).unwrap_or(i64::MAX),
                });
                Settled::Published
            }
            Err(error) if error.is_transient() => {
                match error {
                    PublishError::StreamNotFound(_) => self.stream_missing(),
                    PublishError::StorageFull(_) => self.note_storage_full(true),
                    _ => {}
                }
                let passes = self.outage.load(Ordering::Relaxed) + 1;
                let delay = self
                    .config
                    .unreachable_backoff
                    .delay(passes, &mut rand::rng());
                tracing::debug!(
                    event.id = %row.id, aggregate.id = %row.aggregate_id,
                    error = %error.chain(), "publish failed; retried, not counted"
                );
                pass.failed
                    .push(row.seq, (error.class(), error.chain()), delay, false);
                if error.may_be_stored() {
                    pass.failed.maybe_stored();
                }
                Settled::Unreached
            }
            Err(error) => {
                let attempts = row.attempts.unsigned_abs() + 1;
                let delay = self.config.backoff.delay(attempts, &mut rand::rng());
                tracing::warn!(
                    event.id = %row.id, aggregate.id = %row.aggregate_id, attempts,
                    error = %error.chain(), "publish refused by the broker"
                );
                pass.failed
                    .push(row.seq, (error.class(), error.chain()), delay, true);
                Settled::Refused
            }
        }
    }

    /// Moves a pass's acknowledged rows to `outbox_published`, marks its failed ones retried
    /// later (or dead), commits, and counts the outcome. When that fails, what was published is
    /// handed back, to be recorded again without being published again.
    pub(super) async fn record(&self, pass: Pass) -> Result<BatchReport, Unrecorded> {
        let Pass {
            report,
            mut tx,
            published,
            failed,
        } = pass;
        let recorded = self.record_outcome(&mut tx, &published, &failed).await;
        let recorded = match recorded {
            Ok(dead) => tx.commit().await.map(|()| dead),
            Err(error) => Err(error),
        };
        match recorded {
            Ok(dead) => Ok(Self::count_recorded(report, &published, &failed, &dead)),
            Err(error) => Err(Unrecorded {
                report,
                published,
                failed,
                error,
            }),
        }
    }

    /// Writes a pass's outcome in `conn`'s transaction; returns the seqs that became dead.
    pub(super) async fn record_outcome(
        &self,
        conn: &mut sqlx::PgConnection,
        published: &[Published],
        failed: &Failures,
    ) -> sqlx::Result<Vec<i64>> {
        if !published.is_empty() {
            let seqs: Vec<i64> = published.iter().map(|p| p.seq).collect();
            if self.config.delete_published {
                storage::delete_published(conn, &seqs).await?;
            } else {
                let stream_seqs: Vec<i64> = published.iter().map(|p| p.stream_seq).collect();
                storage::move_published(conn, &seqs, &stream_seqs).await?;
            }
        }
        if failed.is_empty() {
            Ok(Vec::new())
        } else {
            storage::mark_failed(conn, failed, self.config.max_attempts).await
        }
    }

    /// Counts a recorded outcome in the metrics and the report.
    pub(super) fn count_recorded(
        mut report: BatchReport,
        published: &[Published],
        failed: &Failures,
        dead: &[i64],
    ) -> BatchReport {
        if report.claimed == 0 {
            return report;
        }
        let now = chrono::Utc::now();
        for p in published {
            let latency = (now - p.created_at).to_std().unwrap_or_default();
            metrics::histogram!("outbox_commit_to_ack_seconds").record(latency.as_secs_f64());
        }
        metrics::counter!("outbox_published_total").increment(published.len() as u64);
        metrics::counter!("outbox_publish_failures_total").increment(failed.len() as u64);
        metrics::counter!("outbox_dead_total").increment(dead.len() as u64);
        metrics::histogram!("outbox_relay_batch_size").record(report.claimed as f64);
        for seq in dead {
            tracing::error!(outbox.seq = seq, "event is dead; its aggregate is parked");
        }
        report.published = published.len();
        report.failed = failed.len();
        report.dead = dead.len();
        report
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

/// Rows claimed by a transaction that holds them until they are recorded.
pub(super) struct Claim {
    pub(super) tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// Rows locked, held-back ones included.
    pub(super) locked: usize,
    /// Rows to publish, in seq order.
    pub(super) rows: Vec<Claimed>,
    /// When the claim's statement ended: the lease's idle time runs from then.
    pub(super) since: tokio::time::Instant,
}

/// A pass whose rows were published (or failed) but not yet recorded: its transaction still
/// holds them.
pub(super) struct Pass {
    report: BatchReport,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    published: Vec<Published>,
    failed: Failures,
}

/// What became of one publish.
enum Settled {
    /// The broker stored it.
    Published,
    /// The broker was not reached, or had no stream or no room: retried, not counted.
    Unreached,
    /// The broker refused it: retried later, counted.
    Refused,
}

/// A row the broker acknowledged.
#[derive(Debug, Clone, Copy)]
pub(super) struct Published {
    pub(super) seq: i64,
    pub(super) created_at: chrono::DateTime<chrono::Utc>,
    /// Where the stream stored it.
    pub(super) stream_seq: i64,
}

/// The outcome of a pass that could not be recorded (its transaction is gone, its rows free):
/// what the broker stored must be recorded without publishing it again.
#[derive(Debug)]
pub(super) struct Unrecorded {
    pub(super) report: BatchReport,
    pub(super) published: Vec<Published>,
    pub(super) failed: Failures,
    /// Why recording failed.
    pub(super) error: sqlx::Error,
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
            first_published_at: chrono::Utc::now(),
            held_back: false,
            maybe_published: false,
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
