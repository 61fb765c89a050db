//! When the relay checks its stream for what the broker forgot (see [`crate::repair`]), and
//! what it trusts in between: the newest message it had acknowledged, the last position found
//! holding, the client's reconnects.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use uuid::Uuid;

use super::Relay;
use crate::repair::{Position, StreamRepair};
use crate::{Publisher, RepairError};

/// The relay's repair and what it knows between checks.
#[derive(Debug)]
pub(super) struct Watch {
    pub(super) repair: StreamRepair,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The next check must be a full one: nothing is published before it succeeds.
    full: bool,
    /// The client's connects when the last full check began.
    connects: u64,
    last_check: Option<Instant>,
    /// The last position found holding, and the stream's creation time then.
    verified: Option<Position>,
    /// The newest message this relay had acknowledged since.
    newest: Option<(u64, Uuid)>,
    /// Full checks failed in a row: only the first is logged as an error.
    failures: u64,
}

/// What a check left the relay to do.
pub(super) enum Checked {
    /// Publish as before.
    Clear,
    /// Events were moved back into the outbox: claim at once.
    Republished,
    /// The check failed: publish nothing, try again after a pause.
    Failed,
}

impl Watch {
    pub(super) fn new(repair: StreamRepair) -> Self {
        Self {
            repair,
            state: Mutex::new(State {
                full: true,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<P: Publisher> Relay<P> {
    /// Whether a check is due before the next claim: a full one after a reconnect or evidence,
    /// a light one every interval.
    pub(super) fn check_due(&self) -> bool {
        let Some(watch) = &self.watch else {
            return false;
        };
        let connects = watch.repair.connects();
        let state = watch.state();
        state.full
            || state.connects != connects
            || state
                .last_check
                .is_none_or(|at| at.elapsed() >= watch.repair.interval())
    }

    /// Whether a full check is due: nothing is published until it ran.
    pub(super) fn full_check_due(&self) -> bool {
        self.watch.as_ref().is_some_and(|watch| {
            let connects = watch.repair.connects();
            let state = watch.state();
            state.full || state.connects != connects
        })
    }

    /// Runs the check that is due; see [`Checked`].
    pub(super) async fn check_stream(&self) -> Checked {
        let Some(watch) = &self.watch else {
            return Checked::Clear;
        };
        let connects = watch.repair.connects();
        let light = {
            let state = watch.state();
            let full = state.full || state.connects != connects;
            match (&state.verified, full) {
                (Some(verified), false) => Some((verified.clone(), state.newest)),
                _ => None,
            }
        };
        if let Some((verified, newest)) = light {
            match self.check_lightly(watch, &verified, newest).await {
                Ok(true) => return Checked::Clear,
                Ok(false) => {}
                Err(error) => tracing::warn!(
                    error = %crate::error::chain(&error),
                    "cannot check the stream; publishing waits for a full check"
                ),
            }
            watch.state().full = true;
        }
        match watch.repair.check_at(&self.pool).await {
            Ok((report, position)) => {
                metrics::counter!("outbox_stream_checks_total", "outcome" => "ok").increment(1);
                self.note_reached();
                let mut state = watch.state();
                if state.failures > 0 {
                    tracing::info!(
                        failures = state.failures,
                        "the stream is checked; publishing resumes"
                    );
                    state.failures = 0;
                }
                // Nothing of this relay's is in flight during a check, so what it is
                // acknowledged next is above the stream's last sequence now, unless the stream
                // loses more; what it acknowledged before, on a stream that lost its tail or
                // on another stream, says nothing.
                self.acked_high.store(report.last_seq, Ordering::Release);
                state.full = false;
                state.connects = connects;
                state.last_check = Some(Instant::now());
                state.verified = Some(position);
                state.newest = None;
                if report.republished > 0 {
                    Checked::Republished
                } else {
                    Checked::Clear
                }
            }
            Err(error) => {
                metrics::counter!("outbox_stream_checks_total", "outcome" => "failed").increment(1);
                match error {
                    RepairError::Broker(_) => self.note_unreached(),
                    // It answered: only the stream is wrong.
                    RepairError::Damaged => self.note_reached(),
                    _ => {}
                }
                // Tried again every pause while it fails: the first failure says it, the
                // failed checks' counter and the gauges say it lasts.
                let failures = {
                    let mut state = watch.state();
                    state.failures += 1;
                    state.failures
                };
                if failures == 1 {
                    tracing::error!(
                        error = %crate::error::chain(&error),
                        "cannot check the stream for what the broker forgot; nothing is \
                         published until it can"
                    );
                } else {
                    tracing::debug!(
                        error = %crate::error::chain(&error), failures,
                        "cannot check the stream yet"
                    );
                }
                Checked::Failed
            }
        }
    }

    /// The light check: the newest message acknowledged (or the last position verified) is
    /// still where it was; records it as verified when it is a new one.
    async fn check_lightly(
        &self,
        watch: &Watch,
        verified: &Position,
        newest: Option<(u64, Uuid)>,
    ) -> Result<bool, RepairError> {
        let (seq, id) = match newest {
            Some((seq, id)) if seq > verified.seq => (seq, Some(id.to_string())),
            _ => (verified.seq, verified.message_id.clone()),
        };
        let holds = watch
            .repair
            .holds(verified.created, seq, id.as_deref())
            .await?
            .is_some();
        if !holds {
            tracing::warn!(
                stream.seq = seq,
                "the stream no longer holds a message it acknowledged; checking it whole"
            );
            return Ok(false);
        }
        if let Some(id) = id.filter(|_| seq > verified.seq) {
            watch
                .repair
                .record(&self.pool, verified.created, seq, id.clone())
                .await?;
            let mut state = watch.state();
            state.verified = Some(Position {
                created: verified.created,
                seq,
                message_id: Some(id),
            });
        }
        metrics::counter!("outbox_stream_checks_total", "outcome" => "ok").increment(1);
        watch.state().last_check = Some(Instant::now());
        Ok(true)
    }

    /// Notes an acknowledgement at `stream_seq` of event `id`.
    pub(super) fn acked(&self, stream_seq: u64, id: Uuid) {
        self.acked_high.fetch_max(stream_seq, Ordering::AcqRel);
        if let Some(watch) = &self.watch {
            let mut state = watch.state();
            if state.newest.is_none_or(|(seq, _)| seq < stream_seq) {
                state.newest = Some((stream_seq, id));
            }
        }
    }

    /// An acknowledgement named `stream_seq`, at or below `floor`, acknowledged before: the
    /// stream lost messages and numbers new ones again. A full check comes next.
    pub(super) fn stream_went_back(&self, stream_seq: u64, floor: u64) {
        if let Some(watch) = &self.watch {
            let mut state = watch.state();
            if !state.full {
                tracing::warn!(
                    stream.seq = stream_seq,
                    acknowledged = floor,
                    "the stream numbers messages again below one it acknowledged: it lost \
                     messages; checking it whole"
                );
            }
            state.full = true;
        }
    }

    /// No stream answered for a subject: a full check comes next (and makes it again).
    pub(super) fn stream_missing(&self) {
        if let Some(watch) = &self.watch {
            watch.state().full = true;
        }
    }
}
