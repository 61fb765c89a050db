//! Finding the stream checked: created from its spec when gone, deleted and made again when
//! damaged (`damage` judges it), and its state as a check reads it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use chrono::{DateTime, Utc};

use super::{RepairError, StreamRepair, StreamState, damage};

/// How long a stream found gone, or deleted as damaged, is left before it is made again:
/// nats-server 2.9 removes a deleted stream's files after it answered, and a stream made again
/// at once under load can lose its own files to that removal (see `damage`).
const BEFORE_MAKING_AGAIN: Duration = Duration::from_secs(1);

/// The least time a stream returns nothing before it is deleted as damaged, however often the
/// relay checks lightly.
const LEAST_DAMAGED_FOR: Duration = Duration::from_secs(10);

impl StreamRepair {
    /// The stream and its state, or `None` when it does not exist.
    pub(super) async fn stream(
        &self,
    ) -> Result<Option<(stream::Stream, StreamState)>, RepairError> {
        match self.context.get_stream(&self.spec.name).await {
            Ok(stream) => {
                let state = StreamState::of(stream.cached_info());
                Ok(Some((stream, state)))
            }
            Err(error) if is_not_found(&error) => Ok(None),
            Err(error) => Err(RepairError::Broker(Box::new(error))),
        }
    }

    /// The stream and its state, created from the spec when missing, or made again when
    /// damaged (see `damage`); and whether it was.
    pub(super) async fn stream_or_create(
        &self,
    ) -> Result<(stream::Stream, StreamState, Made), RepairError> {
        let Some((stream, state)) = self.stream().await? else {
            tracing::warn!(stream = %self.spec.name, "the stream is gone; creating it again");
            self.not_suspected();
            // One this instance deleted as damaged and failed to make is made with the
            // configuration it had.
            let config = self.deleted.config().unwrap_or_else(|| self.spec.config());
            let (stream, state) = self.create_after_pause(config).await?;
            return Ok((stream, state, Made::InPlaceOfMissing));
        };
        // It exists: one deleted from now on is someone else's doing.
        self.deleted.forget();
        // Consumers remove messages from other streams, and so may leave their first or last
        // sequence empty: only a stream kept by its limits is judged.
        if stream.cached_info().config.retention != stream::RetentionPolicy::Limits {
            self.not_suspected();
            return Ok((stream, state, Made::No));
        }
        let lasting = self.damaged_after();
        match self.suspicion.judge(&stream, &state, lasting).await? {
            damage::Verdict::Sound => {
                self.not_suspected();
                Ok((stream, state, Made::No))
            }
            damage::Verdict::Suspected { first } => {
                self.health.set_stream_damaged(true);
                if first {
                    tracing::error!(
                        stream = %self.spec.name, messages = state.messages,
                        "the stream returns none of the messages it counts: its files are gone \
                         from under the broker; it is deleted and made again if it still does in \
                         {lasting:?}"
                    );
                }
                Err(RepairError::Damaged)
            }
            damage::Verdict::Damaged => self.make_again(&state, stream.cached_info()).await,
        }
    }

    /// Deletes the damaged stream found at `damaged`, unless it was made again meanwhile, and
    /// creates it with the configuration it had (`info`).
    async fn make_again(
        &self,
        damaged: &StreamState,
        info: &stream::Info,
    ) -> Result<(stream::Stream, StreamState, Made), RepairError> {
        // Only the stream judged: one made again meanwhile is judged afresh.
        match self.stream().await? {
            Some((_, now)) if now.created == damaged.created => {}
            Some((stream, now)) => {
                self.not_suspected();
                return Ok((stream, now, Made::No));
            }
            None => {
                self.not_suspected();
                let (stream, state) = self.create_after_pause(self.spec.config()).await?;
                return Ok((stream, state, Made::InPlaceOfMissing));
            }
        }
        if let Err(error) = self.context.delete_stream(&self.spec.name).await
            // A deletion that timed out may have happened all the same.
            && !matches!(self.stream().await, Ok(None))
        {
            self.suspicion.tried();
            tracing::error!(
                stream = %self.spec.name, error = %error,
                "cannot delete the damaged stream: delete it (`nats stream rm`) or restart \
                 nats-server; nothing is published meanwhile, and this is tried again in {:?}",
                self.damaged_after()
            );
            return Err(RepairError::Damaged);
        }
        tracing::error!(
            stream = %self.spec.name,
            "deleted the damaged stream, which still returned none of the messages it counted; \
             making it again"
        );
        self.not_suspected();
        self.suspicion.remade();
        metrics::counter!("outbox_stream_damaged_total").increment(1);
        self.deleted.keep(info.config.clone());
        let (stream, state) = self.create_after_pause(info.config.clone()).await?;
        Ok((stream, state, Made::InPlaceOfDamaged))
    }

    /// How long a stream returns nothing before it is deleted as damaged, and how long after a
    /// refused deletion it is tried again.
    fn damaged_after(&self) -> Duration {
        self.suspicion.wait(self.interval.max(LEAST_DAMAGED_FOR))
    }

    /// Forgets any suspicion of damage: the stream checked is sound, or another one.
    fn not_suspected(&self) {
        self.suspicion.clear();
        self.health.set_stream_damaged(false);
    }

    /// Creates the stream with `config`, [`BEFORE_MAKING_AGAIN`] after it was found gone or
    /// deleted.
    async fn create_after_pause(
        &self,
        config: stream::Config,
    ) -> Result<(stream::Stream, StreamState), RepairError> {
        tokio::time::sleep(BEFORE_MAKING_AGAIN).await;
        let stream = self
            .context
            .get_or_create_stream(config)
            .await
            .map_err(|error| RepairError::Broker(Box::new(error)))?;
        let state = StreamState::of(stream.cached_info());
        Ok((stream, state))
    }
}

/// The configuration of a stream this instance deleted as damaged, until it is found existing
/// again.
#[derive(Debug, Clone, Default)]
pub(super) struct Deleted(Arc<Mutex<Option<stream::Config>>>);

impl Deleted {
    fn keep(&self, config: stream::Config) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(config);
    }

    fn config(&self) -> Option<stream::Config> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn forget(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Whether a check made the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Made {
    No,
    InPlaceOfMissing,
    InPlaceOfDamaged,
}

impl StreamState {
    pub(super) fn of(info: &stream::Info) -> Self {
        Self {
            created: to_chrono(info.created.unix_timestamp_nanos()),
            first_seq: info.state.first_sequence,
            last_seq: info.state.last_sequence,
            messages: info.state.messages,
            max_age: info.config.max_age,
        }
    }
}

/// A time of async-nats (nanoseconds since the epoch), to the microsecond, as PostgreSQL keeps
/// it.
fn to_chrono(nanos: i128) -> DateTime<Utc> {
    let micros = nanos / 1000;
    DateTime::from_timestamp_micros(i64::try_from(micros).unwrap_or_default()).unwrap_or_default()
}

fn is_not_found(error: &jetstream::context::GetStreamError) -> bool {
    matches!(
        error.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(answer)
            if answer.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}
