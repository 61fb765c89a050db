//! One pass: claim due rows, publish them in waves, record the outcome; its transaction holds
//! the rows from the claim to the record.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::storage::{self, Claimed};
use super::{BatchReport, Relay};
use crate::Publisher;

impl<P: Publisher> Relay<P> {
    /// Claims due rows in a new transaction, which stays open, holding them, until
    /// [`Relay::record`].
    pub(super) async fn claim(&self) -> sqlx::Result<Claim> {
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

    /// Moves a pass's acknowledged rows to `outbox_published`, marks its failed ones retried
    /// later (or dead), commits, and counts the outcome.
    pub(super) async fn record(&self, pass: Pass) -> sqlx::Result<BatchReport> {
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
                storage::move_published(&mut tx, &seqs).await?;
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
