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
    Ok(headers_at(stream, seq)
        .await?
        .and_then(|headers| message_id(Some(&headers))))
}

/// The headers of the message at `seq`; `None` when the stream holds none there.
pub(super) async fn headers_at(
    stream: &Stream,
    seq: u64,
) -> Result<Option<async_nats::HeaderMap>, RepairError> {
    match stream.get_raw_message(seq).await {
        Ok(message) => Ok(Some(message.headers)),
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
    let mut read = from_seq;
    loop {
        let Ok(next) = tokio::time::timeout(NEXT_MESSAGE, messages.next()).await else {
            // A stream that lost some of its files delivers nothing past them to an ordered
            // consumer, each new one alike: the relay would never publish again.
            tracing::warn!(
                after = read,
                "the stream's ordered consumer delivers nothing; reading the rest a message at a time"
            );
            read_by_sequence(stream, read, last_seq, &mut scanned, &mut ids, conn).await?;
            break;
        };
        let message = match next {
            Some(Ok(message)) => message,
            // A missed heartbeat: the ordered consumer recovers by itself.
            Some(Err(_)) => continue,
            None => return Err(broker("the stream's messages ended early".into())),
        };
        let info = message.info().map_err(broker)?;
        let (seq, pending) = (info.stream_sequence, info.pending);
        read = seq;
        note(
            &mut scanned,
            &mut ids,
            seq,
            message_id(message.headers.as_ref()),
            conn,
        )
        .await?;
        if seq >= last_seq || pending == 0 {
            break;
        }
    }
    storage::seen(conn, &ids).await?;
    Ok(scanned)
}

/// [`read_ids`]'s reading of the messages after `read` up to `last_seq`, a request each
/// (a sequence the stream removed is passed).
async fn read_by_sequence(
    stream: &Stream,
    read: u64,
    last_seq: u64,
    scanned: &mut Scanned,
    ids: &mut Vec<uuid::Uuid>,
    conn: &mut PgConnection,
) -> Result<(), RepairError> {
    for seq in read + 1..=last_seq {
        if let Some(headers) = headers_at(stream, seq).await? {
            note(scanned, ids, seq, message_id(Some(&headers)), conn).await?;
        }
    }
    Ok(())
}

/// Notes the message read at `seq`, and its id if it has one; writes the ids a chunk at a time.
async fn note(
    scanned: &mut Scanned,
    ids: &mut Vec<uuid::Uuid>,
    seq: u64,
    id: Option<String>,
    conn: &mut PgConnection,
) -> Result<(), RepairError> {
    scanned.scanned += 1;
    if let Some(id) = id {
        if let Ok(uuid) = id.parse() {
            ids.push(uuid);
        }
        scanned.last = Some((seq, id));
    }
    if ids.len() >= CHUNK {
        storage::seen(conn, ids).await?;
        ids.clear();
    }
    Ok(())
}

/// A message's `Nats-Msg-Id`.
fn message_id(headers: Option<&async_nats::HeaderMap>) -> Option<String> {
    headers
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|id| id.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use sqlx::PgPool;

    use super::*;

    /// The reading by sequence that stands in for a quiet ordered consumer notes every message
    /// after the one given, passes a sequence the stream removed, and writes every id.
    #[sqlx::test(migrations = false)]
    async fn reading_by_sequence_notes_every_message_left(pool: PgPool) {
        let (context, stream, name) = super::super::stream_for_test().await;
        let ids: Vec<uuid::Uuid> = (0..5).map(|_| uuid::Uuid::new_v4()).collect();
        for id in &ids {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.to_string().as_str());
            context
                .publish_with_headers(format!("{name}.e"), headers, "{}".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        stream.delete_message(4).await.unwrap();

        let mut conn = pool.acquire().await.unwrap();
        let mut tx = storage::begin_scan(&mut conn).await.unwrap();
        let (mut scanned, mut seen) = (Scanned::default(), Vec::new());
        read_by_sequence(&stream, 1, 5, &mut scanned, &mut seen, &mut tx)
            .await
            .unwrap();
        assert_eq!(scanned.scanned, 3, "messages 2, 3 and 5");
        assert_eq!(scanned.last, Some((5, ids[4].to_string())));
        assert_eq!(seen, [ids[1], ids[2], ids[4]]);
        context.delete_stream(&name).await.unwrap();
    }
}
