//! Reading a stream: the id of the message at a sequence, the newest recorded position that
//! still holds, and the ids of every message after a sequence.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use futures::StreamExt as _;
use sqlx::PgConnection;

use super::storage::{self, Check};
use super::{RepairError, StreamState};

/// Ids written to the database at a time.
const CHUNK: usize = 10_000;

/// The longest wait for the next message of a scan.
const NEXT_MESSAGE: Duration = Duration::from_secs(30);

/// The `Nats-Msg-Id` of the message at `seq` (`None`: no message there, or one without an id;
/// always `None` at 0).
pub(super) async fn message_id_at(
    stream: &Stream,
    seq: u64,
) -> Result<Option<String>, RepairError> {
    if seq == 0 {
        return Ok(None);
    }
    match stream.get_raw_message(seq).await {
        Ok(message) => Ok(message
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|id| id.as_str().to_owned())),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(RepairError::Broker(Box::new(error))),
    }
}

/// The newest of `checks` (the newest first) whose message is still at its sequence; a position
/// below the stream's first sequence (removed by its limits) holds. Probes the newest, then
/// ever older ones, then halves the gap: a few requests.
pub(super) async fn newest_holding<'c>(
    stream: &Stream,
    state: &StreamState,
    checks: &[&'c Check],
) -> Result<Option<&'c Check>, RepairError> {
    let holds = async |check: &Check| -> Result<bool, RepairError> {
        if check.seq == 0 || check.seq < state.first_seq {
            return Ok(true);
        }
        if check.seq > state.last_seq {
            return Ok(false);
        }
        Ok(message_id_at(stream, check.seq).await? == check.message_id)
    };
    // The newest that fails (index) and the oldest known to hold.
    let (mut failing, mut holding) = (0, None);
    let mut step = 1;
    let mut index = 0;
    while index < checks.len() {
        if holds(checks[index]).await? {
            holding = Some(index);
            break;
        }
        failing = index;
        index += step;
        step *= 2;
    }
    let Some(mut hold) = holding else {
        return Ok(None);
    };
    // Every position newer than `hold` and older than `failing`'s... is between them.
    while hold > failing + 1 {
        let middle = failing + (hold - failing) / 2;
        if holds(checks[middle]).await? {
            hold = middle;
        } else {
            failing = middle;
        }
    }
    Ok(Some(checks[hold]))
}

/// What a scan read.
#[derive(Debug, Default)]
pub(super) struct Scanned {
    /// Messages read.
    pub(super) scanned: u64,
    /// The newest message read that has an id: its sequence and id.
    pub(super) last: Option<(u64, String)>,
}

/// Reads the `Nats-Msg-Id` of every message after `from_seq` up to `last_seq` (headers only,
/// through an ordered consumer) into the scan's table.
pub(super) async fn read_ids(
    stream: &Stream,
    from_seq: u64,
    last_seq: u64,
    conn: &mut PgConnection,
) -> Result<Scanned, RepairError> {
    let mut scanned = Scanned::default();
    if last_seq <= from_seq {
        return Ok(scanned);
    }
    let broker = |error: Box<dyn std::error::Error + Send + Sync>| RepairError::Broker(error);
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            headers_only: true,
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from_seq + 1,
            },
            ..Default::default()
        })
        .await
        .map_err(|error| broker(Box::new(error)))?;
    // Nothing after `from_seq` (the messages there deleted): nothing would ever arrive.
    if consumer.cached_info().num_pending == 0 {
        return Ok(scanned);
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|error| broker(Box::new(error)))?;
    let mut ids = Vec::with_capacity(CHUNK);
    loop {
        let next = tokio::time::timeout(NEXT_MESSAGE, messages.next())
            .await
            .map_err(|_| broker("no message of the stream within 30 s".into()))?;
        let message = match next {
            Some(Ok(message)) => message,
            // A missed heartbeat: the ordered consumer recovers by itself.
            Some(Err(_)) => continue,
            None => return Err(broker("the stream's messages ended early".into())),
        };
        let info = message.info().map_err(broker)?;
        let (seq, pending) = (info.stream_sequence, info.pending);
        scanned.scanned += 1;
        let id = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|id| id.as_str().to_owned());
        if let Some(id) = id {
            if let Ok(uuid) = id.parse() {
                ids.push(uuid);
            }
            scanned.last = Some((seq, id));
        }
        if ids.len() >= CHUNK {
            storage::seen(conn, &ids).await?;
            ids.clear();
        }
        if seq >= last_seq || pending == 0 {
            break;
        }
    }
    storage::seen(conn, &ids).await?;
    Ok(scanned)
}
