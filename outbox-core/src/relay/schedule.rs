//! The overlap of passes that [`Relay::run`] drives: each round records the passes published
//! in the round before, publishes the full claim made in the round before, and claims anew
//! (during an outage, only when nothing is in flight), all at once; a round with nothing left
//! in flight ends in a wait for a commit or the poll.
//!
//! A claim that came back partial took every due row committed before it began, so the next
//! round claims again only if a commit was signalled since, rows were held back, or the claim
//! failed: at a steady trickle of commits, each commit then costs one claim, not a claim and
//! an empty one. Rows held back in any claim are claimed again right after the passes ahead of
//! them are recorded, whatever the poll interval.
//!
//! A check of the stream (`watch`) runs when it is due and nothing is in flight; no claim is
//! made until a failed full check succeeds. A pass whose record fails after its publishes
//! (its transaction lost, a permission missing, a trigger failing) is not published again:
//! its outcome is recorded again alone, after a growing pause, and nothing is claimed
//! meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Relay;
use super::pass::{Claim, Pass, Unrecorded};
use super::watch::Checked;
use crate::{Backoff, Publisher};

/// What is in flight between rounds, and how commits are heard of.
pub(super) struct Scheduler<'r, P> {
    relay: &'r Relay<P>,
    listener: Option<PgListener>,
    woken: Option<watch::Receiver<u64>>,
    /// A full claim (a backlog), published in the next round.
    claimed: Option<Claim>,
    /// Passes published but not recorded: their transactions still hold their rows.
    unrecorded: Vec<Pass>,
    /// Whether the next round claims even if no commit was signalled: false only after a
    /// partial claim that held nothing back.
    reclaim: bool,
    /// A full claim held rows back: once nothing is in flight, claim again at once.
    held_back: bool,
    /// Outcomes of passes published but not recorded, and how many times in a row recording
    /// them failed.
    unrecorded_outcomes: Vec<Unrecorded>,
    record_failures: u32,
}

/// What a round leaves to do.
pub(super) enum Round {
    /// Passes are in flight: the next round follows at once.
    Busy,
    /// Nothing in flight: wait this long, or until a commit is notified.
    Idle(Duration),
    /// Shutdown: before the round, or during its pause.
    Stopped,
}

/// Pauses between attempts to record an outcome again: it was published, so nothing waits
/// on the broker, and the cause (a missing grant, a failing trigger) needs an operator.
const RECORD_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(60));

impl<'r, P: Publisher> Scheduler<'r, P> {
    pub(super) fn new(relay: &'r Relay<P>) -> Self {
        Self {
            relay,
            listener: None,
            woken: relay.woken.clone(),
            claimed: None,
            unrecorded: Vec::new(),
            reclaim: true,
            held_back: false,
            unrecorded_outcomes: Vec::new(),
            record_failures: 0,
        }
    }

    fn in_flight(&self) -> bool {
        self.claimed.is_some() || !self.unrecorded.is_empty()
    }

    /// One round; see the module documentation.
    pub(super) async fn round(&mut self, shutdown: &CancellationToken) -> Round {
        let relay = self.relay;
        if shutdown.is_cancelled() {
            return Round::Stopped;
        }
        if self.listener.is_none() {
            self.listener = relay.listen().await;
        }
        if !self.in_flight() && !self.unrecorded_outcomes.is_empty() {
            return self.record_again(shutdown).await;
        }
        let check_due = relay.check_due();
        if check_due
            && !self.in_flight()
            && let Some(round) = self.check_stream(shutdown).await
        {
            return round;
        }
        // While the broker is unreachable, one claim at a time, each after a pause: the
        // backlog is not cycled through (and rewritten) as fast as the database allows.
        let outage = relay.outage.load(Ordering::Relaxed);
        let in_flight = self.in_flight();
        if outage > 0 && !in_flight {
            let pause = relay
                .config
                .unreachable_backoff
                .delay(outage, &mut rand::rng());
            tokio::select! {
                () = shutdown.cancelled() => return Round::Stopped,
                () = tokio::time::sleep(pause) => {}
            }
        }
        // A check waits for what is in flight; a pass not recorded, for its record.
        let claiming = if (check_due && in_flight) || !self.unrecorded_outcomes.is_empty() {
            false
        } else if outage > 0 {
            !in_flight
        } else {
            self.reclaim || self.signalled()
        };
        if claiming {
            // Commits signalled from here on may be missed by this claim: they call for the next.
            if let Some(woken) = &mut self.woken {
                woken.borrow_and_update();
            }
        }
        let (recorded, published, next) = tokio::join!(
            relay.record_all(std::mem::take(&mut self.unrecorded)),
            relay.publish_if_any(self.claimed.take()),
            async {
                if claiming {
                    relay.claim_next().await
                } else {
                    Ok(Next::Skipped)
                }
            },
        );
        self.unrecorded.extend(published);
        let mut failed = !recorded.is_empty();
        self.unrecorded_outcomes.extend(recorded);
        let nothing_to_publish = matches!(next, Ok(Next::Nothing { .. }));
        let (claim_failed, mut held_back) = self.take(next);
        failed |= claim_failed;
        if self.in_flight() || !self.unrecorded_outcomes.is_empty() {
            return Round::Busy;
        }
        held_back |= std::mem::take(&mut self.held_back);
        // The claim found nothing to publish and no pass holds rows: during an outage, only
        // asking tells whether the broker is back. While events wait, their publishes tell
        // (a broker that answers but refuses them, e.g. without the stream, stays unreachable).
        if nothing_to_publish
            && relay.outage.load(Ordering::Relaxed) > 0
            && relay.publisher.reachable().await == Some(true)
        {
            relay.note_reachability(true, false);
        }
        Round::Idle(if failed {
            relay.config.poll_interval.max(Duration::from_secs(1))
        } else if held_back {
            HELD_BACK_WAIT.min(relay.config.poll_interval)
        } else {
            relay.config.poll_interval
        })
    }

    /// Waits `wait`, or until a commit is notified (here or in another process), or shutdown.
    pub(super) async fn idle(&mut self, wait: Duration, shutdown: &CancellationToken) {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
            () = notified(&mut self.listener) => {}
            () = committed(&mut self.woken) => {}
        }
        // One pass serves every commit notified so far.
        if let Some(listener) = &mut self.listener {
            while listener.next_buffered().is_some() {}
        }
        self.reclaim = true;
    }

    /// Whether a commit was signalled since the last claim began, here or by a notification
    /// from another process (read without waiting, and taken: the next claim serves it). A
    /// listener that lost its connection counts as signalled, since notifications may be lost.
    fn signalled(&mut self) -> bool {
        let here = self
            .woken
            .as_ref()
            .is_some_and(|woken| woken.has_changed().unwrap_or(false));
        let Some(listener) = &mut self.listener else {
            return here;
        };
        let mut elsewhere = match listener.try_recv().now_or_never() {
            None => false,
            Some(Ok(_)) => true,
            Some(Err(_)) => {
                // The next round listens anew.
                self.listener = None;
                return true;
            }
        };
        while listener.next_buffered().is_some() {
            elsewhere = true;
        }
        here || elsewhere
    }

    /// Keeps what a claim led to for the next rounds; returns whether it failed and whether it
    /// held rows back.
    fn take(&mut self, next: sqlx::Result<Next>) -> (bool, bool) {
        match next {
            Ok(Next::Backlog(claim)) => {
                self.held_back |= claim.locked > claim.rows.len();
                self.claimed = Some(claim);
                self.reclaim = true;
                (false, false)
            }
            Ok(Next::Published { pass, held_back }) => {
                self.unrecorded.push(pass);
                self.reclaim = held_back;
                (false, held_back)
            }
            Ok(Next::Nothing { held_back }) => {
                self.reclaim = held_back;
                (false, held_back)
            }
            Ok(Next::Skipped) => (false, false),
            Err(error) => {
                tracing::error!(error = ?error, "relay pass failed");
                self.reclaim = true;
                (true, false)
            }
        }
    }

    /// Checks the stream; returns the round's end when the check failed (nothing is claimed
    /// until one succeeds).
    async fn check_stream(&mut self, shutdown: &CancellationToken) -> Option<Round> {
        match self.relay.check_stream().await {
            Checked::Clear => None,
            Checked::Republished => {
                self.reclaim = true;
                None
            }
            Checked::Failed => Some(pause(Duration::from_secs(1), shutdown).await),
        }
    }

    /// Records again, after a pause that grows with each failure, the outcomes of passes whose
    /// record failed; see the module documentation.
    async fn record_again(&mut self, shutdown: &CancellationToken) -> Round {
        let delay = RECORD_BACKOFF.delay(self.record_failures, &mut rand::rng());
        if let Round::Stopped = pause(delay, shutdown).await {
            return Round::Stopped;
        }
        let outcomes = std::mem::take(&mut self.unrecorded_outcomes);
        for outcome in outcomes {
            match self.relay.record_alone(outcome).await {
                Ok(()) => self.record_failures = 0,
                Err(outcome) => {
                    self.record_failures = self.record_failures.saturating_add(1);
                    self.unrecorded_outcomes.push(outcome);
                }
            }
        }
        self.reclaim = true;
        Round::Busy
    }

    /// Records the passes published, and the outcomes not recorded yet; a claim not yet
    /// published is let go.
    pub(super) async fn finish(self) {
        let failed = self.relay.record_all(self.unrecorded).await;
        for outcome in self.unrecorded_outcomes.into_iter().chain(failed) {
            let _ = self.relay.record_alone(outcome).await;
        }
    }
}

/// Waits `wait`, or until shutdown: a pause that commits do not cut short.
async fn pause(wait: Duration, shutdown: &CancellationToken) -> Round {
    tokio::select! {
        () = shutdown.cancelled() => Round::Stopped,
        () = tokio::time::sleep(wait) => Round::Busy,
    }
}

impl<P: Publisher> Relay<P> {
    /// Claims the next rows: a full claim (a backlog) is returned to be published in the next
    /// round, a partial one is published at once.
    async fn claim_next(&self) -> sqlx::Result<Next> {
        let claim = self.claim().await?;
        let outcome = if claim.rows.is_empty() {
            "empty"
        } else {
            "rows"
        };
        metrics::counter!("outbox_relay_claims_total", "outcome" => outcome).increment(1);
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

    /// [`Relay::record`]s passes side by side; returns the outcomes that could not be
    /// recorded, each logged.
    async fn record_all(&self, passes: Vec<Pass>) -> Vec<Unrecorded> {
        let results = futures::future::join_all(passes.into_iter().map(|p| self.record(p))).await;
        let failed: Vec<Unrecorded> = results.into_iter().filter_map(Result::err).collect();
        for outcome in &failed {
            log_unrecorded(outcome);
        }
        failed
    }

    /// Records an outcome in a transaction of its own (its pass's is gone); hands it back when
    /// that fails too.
    async fn record_alone(&self, outcome: Unrecorded) -> Result<(), Unrecorded> {
        let recorded = async {
            let mut tx = self.pool.begin().await?;
            let dead = self
                .record_outcome(&mut tx, &outcome.published, &outcome.failed)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(dead)
        }
        .await;
        match recorded {
            Ok(dead) => {
                tracing::info!(
                    events = outcome.published.len(),
                    "a published pass is recorded at last"
                );
                Self::count_recorded(outcome.report, &outcome.published, &outcome.failed, &dead);
                Ok(())
            }
            Err(error) => {
                let outcome = Unrecorded { error, ..outcome };
                log_unrecorded(&outcome);
                Err(outcome)
            }
        }
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
}

/// Logs and counts an outcome whose record failed.
fn log_unrecorded(outcome: &Unrecorded) {
    metrics::counter!("outbox_record_failures_total").increment(1);
    tracing::error!(
        error = %crate::error::chain(&outcome.error),
        published = outcome.published.len(),
        failed = outcome.failed.len(),
        "recording a relay pass failed; its outcome is recorded again after a pause, \
         without publishing it again"
    );
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
/// [`Wakeup`](crate::Wakeup), or once every handle of it is gone.
async fn committed(woken: &mut Option<watch::Receiver<u64>>) {
    let Some(receiver) = woken else {
        return std::future::pending().await;
    };
    if receiver.changed().await.is_err() {
        *woken = None;
        std::future::pending::<()>().await;
    }
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
    /// No claim was made: the last one was partial and no commit was signalled since.
    Skipped,
}
