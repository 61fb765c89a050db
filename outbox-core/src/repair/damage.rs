//! A stream that returns none of the messages it counts: its files are gone from under the
//! broker. nats-server 2.9 does this to a stream made again at once after its deletion, under
//! load; the stream then acknowledges every publish and delivers nothing, to anyone, until the
//! server restarts. Only deleting it and making it again brings it back.
//!
//! Deleting a stream takes its consumers with it, so a stream is judged damaged only when it has
//! returned nothing for a while: the same stream, from the same first sequence, at every check
//! for at least a light check's interval. A short read failure of the server passes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::stream::Stream;

use super::scan::headers_at;
use super::{RepairError, StreamState};

/// What the checks have seen of a stream that returned nothing.
#[derive(Debug, Clone, Default)]
pub(super) struct Suspicion {
    seen: Arc<Mutex<Option<Seen>>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    state: StreamState,
    since: Instant,
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
    /// It has returned none of them for at least the time asked.
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
        if !nothing {
            *seen = None;
            return Ok(Verdict::Sound);
        }
        match *seen {
            Some(earlier)
                if earlier.state.created == state.created
                    && earlier.state.first_seq == state.first_seq =>
            {
                Ok(if earlier.since.elapsed() >= lasting {
                    Verdict::Damaged
                } else {
                    Verdict::Suspected { first: false }
                })
            }
            _ => {
                *seen = Some(Seen {
                    state: *state,
                    since: Instant::now(),
                });
                Ok(Verdict::Suspected { first: true })
            }
        }
    }

    /// Forgets what was seen: the stream was made again.
    pub(super) fn clear(&self) {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
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
    use async_nats::jetstream::{self, stream::Config};

    use super::*;

    /// A stream whose first or last message was deleted, or that counts none, is not taken
    /// for one that returns nothing: only a missing first and last message is damage.
    #[tokio::test]
    async fn a_stream_with_deleted_messages_is_not_damaged() {
        let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let context = jetstream::new(async_nats::connect(url).await.expect("NATS"));
        let name = format!("SCAN_{}", uuid::Uuid::new_v4().simple());
        let subject = format!("{name}.e");
        let mut stream = context
            .create_stream(Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .unwrap();
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
