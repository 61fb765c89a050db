//! A stream that returns none of the messages it counts: its files are gone from under the
//! broker. nats-server 2.9 does this to a stream made again at once after its deletion, under
//! load; the stream then acknowledges every publish and delivers nothing, to anyone, until the
//! server restarts. Only deleting it and making it again brings it back.
//!
//! Deleting a stream takes its consumers with it, so a stream is judged damaged only when it has
//! returned nothing for a while: the same stream, from the same first sequence, at every check
//! for at least a light check's interval (and 10 s), the checks never further apart than
//! `CONTINUOUS`. A short read failure of the server passes. A deletion refused (the identity
//! may not) is tried again once per that time. Each deletion in the last hour (by this
//! process, since it started) doubles that time, up to five minutes: a broker that damages the
//! stream again and again is not flooded each time with every event published again. Only
//! streams kept by their limits are judged: consumers remove messages from the others.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::stream::Stream;

use super::scan::headers_at;
use super::{RepairError, StreamState};

/// What the checks have seen of a stream that returned nothing, and when it was made again.
#[derive(Debug, Clone, Default)]
pub(super) struct Suspicion {
    seen: Arc<Mutex<Option<Seen>>>,
    /// When streams judged damaged were deleted, within the last [`REMADE_RECENTLY`].
    remade: Arc<Mutex<VecDeque<Instant>>>,
}

/// Deletions this recent make the wait before the next one longer.
const REMADE_RECENTLY: Duration = Duration::from_secs(3600);

/// The longest wait before deleting a stream damaged again and again.
const LONGEST_WAIT: Duration = Duration::from_secs(300);

/// Judgements further apart than this start the wait again: the checks between failed, and saw
/// nothing.
const CONTINUOUS: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
struct Seen {
    state: StreamState,
    /// The first judgement that found nothing.
    since: Instant,
    /// The latest.
    last: Instant,
    /// The latest judged damaged, its deletion then tried.
    tried: Option<Instant>,
}

/// A check's judgement of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It returns its messages.
    Sound,
    /// It returns none of them, not yet for long.
    Suspected {
        /// First seen so now.
        first: bool,
    },
    /// It has returned none of them for at least the time asked: delete it (tried again, if
    /// refused, once per that time).
    Damaged,
}

impl Suspicion {
    /// Judges `stream` at `state`: damaged once it has returned nothing, the same stream from
    /// the same first sequence, for at least `lasting`.
    pub(super) async fn judge(
        &self,
        stream: &Stream,
        state: &StreamState,
        lasting: Duration,
    ) -> Result<Verdict, RepairError> {
        let nothing = returns_nothing(stream, state).await?;
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(verdict(&mut seen, nothing, state, lasting, Instant::now()))
    }

    /// Notes that deleting the stream judged damaged was refused just now: a refusal that
    /// took its time does not start the wait again.
    pub(super) fn tried(&self) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        refused(&mut seen, Instant::now());
    }

    /// Forgets what was seen: the stream was made again.
    pub(super) fn clear(&self) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Notes that a stream judged damaged was deleted just now, to be made again.
    pub(super) fn remade(&self) {
        let mut remade = self.remade.lock().unwrap_or_else(PoisonError::into_inner);
        remade.push_back(Instant::now());
    }

    /// How long a stream must return nothing before it is deleted: `base`, doubled for each
    /// deletion this repair made in the last hour.
    pub(super) fn wait(&self, base: Duration) -> Duration {
        let mut remade = self.remade.lock().unwrap_or_else(PoisonError::into_inner);
        backed_off(base, &mut remade, Instant::now())
    }
}

/// `base` doubled for each of the deletions `remade` holds within [`REMADE_RECENTLY`] of `now`
/// (older ones forgotten), up to [`LONGEST_WAIT`] and never under `base`.
fn backed_off(base: Duration, remade: &mut VecDeque<Instant>, now: Instant) -> Duration {
    while remade
        .front()
        .is_some_and(|at| now.duration_since(*at) > REMADE_RECENTLY)
    {
        remade.pop_front();
    }
    let doublings = u32::try_from(remade.len()).unwrap_or(u32::MAX).min(16);
    base.saturating_mul(1 << doublings)
        .min(LONGEST_WAIT)
        .max(base)
}

/// The verdict on a stream found at `state` returning nothing or not at `now`, given what was
/// `seen` before (updated).
fn verdict(
    seen: &mut Option<Seen>,
    nothing: bool,
    state: &StreamState,
    lasting: Duration,
    now: Instant,
) -> Verdict {
    if !nothing {
        *seen = None;
        return Verdict::Sound;
    }
    match seen {
        Some(earlier)
            if earlier.state.created == state.created
                && earlier.state.first_seq == state.first_seq
                && now.duration_since(earlier.last) <= CONTINUOUS =>
        {
            earlier.last = now;
            let waited = now.duration_since(earlier.since) >= lasting;
            let may_try = earlier
                .tried
                .is_none_or(|tried| now.duration_since(tried) >= lasting);
            if waited && may_try {
                earlier.tried = Some(now);
                Verdict::Damaged
            } else {
                Verdict::Suspected { first: false }
            }
        }
        _ => {
            *seen = Some(Seen {
                state: *state,
                since: now,
                last: now,
                tried: None,
            });
            Verdict::Suspected { first: true }
        }
    }
}

/// A deletion of the stream `seen` judged damaged was refused at `now`: the wait between checks
/// counts from then.
fn refused(seen: &mut Option<Seen>, now: Instant) {
    if let Some(seen) = seen.as_mut() {
        seen.last = now;
    }
}

/// Whether `stream` returns neither its first nor its last message while it counts some, at
/// `state` and again when asked anew (messages its limits removed meanwhile are not missing).
/// A stream's first sequence always holds a message while it counts any.
async fn returns_nothing(stream: &Stream, state: &StreamState) -> Result<bool, RepairError> {
    let missing = async |state: &StreamState| -> Result<bool, RepairError> {
        Ok(state.messages > 0
            && headers_at(stream, state.first_seq).await?.is_none()
            && headers_at(stream, state.last_seq).await?.is_none())
    };
    if !missing(state).await? {
        return Ok(false);
    }
    let info = stream
        .get_info()
        .await
        .map_err(|error| RepairError::Broker(Box::new(error)))?;
    let again = StreamState::of(&info);
    Ok(again.created == state.created
        && again.first_seq == state.first_seq
        && missing(&again).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each deletion in the last hour doubles the wait before the next, up to five minutes;
    /// an hour later the wait is back to its base.
    #[test]
    fn a_stream_damaged_again_and_again_waits_longer() {
        let base = Duration::from_secs(10);
        let start = Instant::now();
        let mut remade = VecDeque::new();
        assert_eq!(backed_off(base, &mut remade, start), base);
        remade.push_back(start);
        assert_eq!(backed_off(base, &mut remade, start), base * 2);
        remade.push_back(start + Duration::from_secs(60));
        assert_eq!(
            backed_off(base, &mut remade, start + Duration::from_secs(60)),
            base * 4
        );
        for minute in 2..10 {
            remade.push_back(start + Duration::from_secs(60 * minute));
        }
        let later = start + Duration::from_secs(600);
        assert_eq!(backed_off(base, &mut remade, later), LONGEST_WAIT);
        let hour_after = start + Duration::from_secs(600 + 3601);
        assert_eq!(backed_off(base, &mut remade, hour_after), base);
        assert!(remade.is_empty());
        let slow = Duration::from_secs(600);
        assert_eq!(
            backed_off(slow, &mut remade, hour_after),
            slow,
            "never under the base"
        );
    }

    fn state(created_secs: i64, first_seq: u64) -> StreamState {
        StreamState {
            created: chrono::DateTime::from_timestamp(created_secs, 0).unwrap(),
            first_seq,
            last_seq: first_seq + 9,
            messages: 10,
            max_age: Duration::ZERO,
        }
    }

    /// Damage is a stream returning nothing at every check for the time asked: the same stream,
    /// from the same first sequence, the checks close together. A check that finds its
    /// messages, another stream, another first sequence, or a gap between checks starts the
    /// wait again; a deletion refused is tried again once per that time.
    #[test]
    fn damage_is_nothing_returned_for_the_time_asked() {
        let lasting = Duration::from_secs(10);
        let start = Instant::now();
        let mut seen = None;
        let mut judge = |nothing, state: StreamState, secs| {
            verdict(
                &mut seen,
                nothing,
                &state,
                lasting,
                start + Duration::from_secs(secs),
            )
        };
        let (suspected, again) = (
            Verdict::Suspected { first: true },
            Verdict::Suspected { first: false },
        );
        assert_eq!(judge(false, state(1, 1), 0), Verdict::Sound);
        assert_eq!(judge(true, state(1, 1), 0), suspected);
        for secs in 1..10 {
            assert_eq!(judge(true, state(1, 1), secs), again);
        }
        assert_eq!(judge(true, state(1, 1), 10), Verdict::Damaged);
        for secs in 11..20 {
            assert_eq!(judge(true, state(1, 1), secs), again, "refused: waits");
        }
        assert_eq!(
            judge(true, state(1, 1), 20),
            Verdict::Damaged,
            "tried again"
        );

        assert_eq!(judge(false, state(1, 1), 21), Verdict::Sound);
        assert_eq!(
            judge(true, state(1, 1), 22),
            suspected,
            "found the messages"
        );
        assert_eq!(judge(true, state(1, 1), 27), again);
        assert_eq!(
            judge(true, state(1, 2), 32),
            suspected,
            "aged out meanwhile"
        );
        assert_eq!(judge(true, state(2, 2), 34), suspected, "another stream");
        assert_eq!(
            judge(true, state(2, 2), 40),
            suspected,
            "checks failed between"
        );
        assert_eq!(judge(true, state(2, 2), 45), again);
        assert_eq!(judge(true, state(2, 2), 50), Verdict::Damaged);
    }

    /// A stream that goes on acknowledging publishes (its last sequence grows) stays suspected;
    /// a refused deletion that took longer than the gap allowed between checks does not start
    /// the wait again.
    #[test]
    fn a_slow_refusal_keeps_the_wait() {
        let lasting = Duration::from_secs(10);
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut seen = None;
        let growing = |secs: u64| StreamState {
            last_seq: 100 + secs,
            messages: 100 + secs,
            ..state(1, 1)
        };
        assert_eq!(
            verdict(&mut seen, true, &growing(0), lasting, at(0)),
            Verdict::Suspected { first: true }
        );
        for secs in [4, 8] {
            assert_eq!(
                verdict(&mut seen, true, &growing(secs), lasting, at(secs)),
                Verdict::Suspected { first: false }
            );
        }
        assert_eq!(
            verdict(&mut seen, true, &growing(10), lasting, at(10)),
            Verdict::Damaged
        );
        refused(&mut seen, at(16));
        assert_eq!(
            verdict(&mut seen, true, &growing(17), lasting, at(17)),
            Verdict::Suspected { first: false }
        );
        assert_eq!(
            verdict(&mut seen, true, &growing(20), lasting, at(20)),
            Verdict::Damaged,
            "tried again an interval after the last try"
        );
    }

    /// A stream whose first or last message was deleted, or that counts none, is not taken
    /// for one that returns nothing: only a missing first and last message is damage.
    #[tokio::test]
    async fn a_stream_with_deleted_messages_is_not_damaged() {
        let (context, mut stream, name) = super::super::stream_for_test().await;
        let subject = format!("{name}.e");
        let damaged = async |stream: &mut Stream| {
            let state = StreamState::of(stream.info().await.unwrap());
            returns_nothing(stream, &state).await.unwrap()
        };
        assert!(!damaged(&mut stream).await, "empty");
        for _ in 0..3 {
            let ack = context.publish(subject.clone(), "{}".into()).await.unwrap();
            ack.await.unwrap();
        }
        assert!(!damaged(&mut stream).await, "whole");
        stream.delete_message(3).await.unwrap();
        assert!(!damaged(&mut stream).await, "its last message deleted");
        stream.delete_message(1).await.unwrap();
        assert!(!damaged(&mut stream).await, "its first message deleted too");
        stream.delete_message(2).await.unwrap();
        assert!(!damaged(&mut stream).await, "every message deleted");
        context.delete_stream(&name).await.unwrap();
    }
}
