//! The overlap of passes that [`Relay::run`] drives: each round records the passes published
//! in the round before, publishes the full claim made in the round before, and claims anew
//! (during an outage, only when nothing is in flight), all at once; a round with nothing left
//! in flight ends in a wait for a commit or the poll.
//!
//! A claim that came back partial took every due row committed before it began, so the next
//! round claims again only if a commit was signalled since, rows were held back, or the claim
//! failed: at a steady trickle of commits, each commit then costs one claim, not a claim and
//! an empty one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt as _;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Relay;
use super::pass::{Claim, Pass};
use crate::Publisher;

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

impl<'r, P: Publisher> Scheduler<'r, P> {
    pub(super) fn new(relay: &'r Relay<P>) -> Self {
        Self {
            relay,
            listener: None,
            woken: relay.woken.clone(),
            claimed: None,
            unrecorded: Vec::new(),
            reclaim: true,
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
        let claiming = if outage > 0 {
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
        let mut failed = recorded.is_err();
        let mut held_back = false;
        let nothing_to_publish = matches!(next, Ok(Next::Nothing { .. }));
        match next {
            Ok(Next::Backlog(claim)) => {
                self.claimed = Some(claim);
                self.reclaim = true;
            }
            Ok(Next::Published {
                pass,
                held_back: held,
            }) => {
                self.unrecorded.push(pass);
                held_back = held;
                self.reclaim = held;
            }
            Ok(Next::Nothing { held_back: held }) => {
                held_back = held;
                self.reclaim = held;
            }
            Ok(Next::Skipped) => {}
            Err(error) => {
                tracing::error!(error = ?error, "relay pass failed");
                failed = true;
                self.reclaim = true;
            }
        }
        if self.in_flight() {
            return Round::Busy;
        }
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

    /// Records the passes published; a claim not yet published is let go.
    pub(super) async fn finish(self) {
        let _ = self.relay.record_all(self.unrecorded).await;
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
