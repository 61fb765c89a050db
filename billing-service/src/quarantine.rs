//! Messages the NATS client cannot read, found and dead-lettered from the stream itself.
//!
//! nats-server stores whatever bytes a producer sends, but async-nats drops its connection on a
//! delivered message whose subject or header block is not UTF-8 (or whose header lines it cannot
//! parse). Such a message never reaches the consumer: it is delivered again after every ack
//! wait, and cuts billing's connection each time, for good. The sweep looks at the messages the
//! durable consumer delivered and that are still unacknowledged, reads those billing never
//! received through the stream's JSON API (which carries any bytes, headers and body in base64),
//! and for each one the client cannot read keeps a dead letter (its headers as hex, its body as
//! it is) and terminates it, as billing terminates every dead letter.
//!
//! The termination is an ordinary `+TERM` acknowledgement sent to the subject nats-server builds
//! for a delivery, with the message's stream sequence: the server finds its pending delivery by
//! that sequence alone.

use std::collections::BTreeSet;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::reason::UNREADABLE;
use async_nats::jetstream;
use base64::Engine as _;
use jetstream_outbox::Inbox;
use jetstream_outbox::inbox::NewDeadLetter;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How often the sweep looks at the consumer's unacknowledged messages.
const EVERY: Duration = Duration::from_secs(5);
/// Most unacknowledged messages one sweep reads.
const SCAN: usize = 1000;
/// Wait after a nudge, for the client to connect again.
const NUDGE_DELAY: Duration = Duration::from_millis(200);

/// Finds and dead-letters the messages of one durable consumer the client cannot read.
#[derive(Debug, Clone)]
pub struct Sweep {
    jetstream: jetstream::Context,
    stream: String,
    consumer: String,
    inbox: Inbox,
    /// What the sweep knows: the sequences received by this process, and how far it has
    /// looked.
    seen: Arc<Mutex<Seen>>,
    /// Wakes the sweep before its time.
    nudged: Arc<Notify>,
}

/// A stored message as `STREAM.MSG.GET` answers it.
#[derive(Debug, Deserialize)]
struct Stored {
    message: StoredMessage,
}

#[derive(Debug, Deserialize)]
struct StoredMessage {
    /// Not-UTF-8 bytes arrive replaced by U+FFFD (the server encodes JSON strings that way).
    subject: String,
    #[serde(default)]
    hdrs: Option<String>,
    #[serde(default)]
    data: Option<String>,
}

impl Sweep {
    /// A sweep of `consumer` on `stream`, keeping its dead letters in `inbox`.
    pub fn new(jetstream: jetstream::Context, stream: &str, consumer: &str, inbox: Inbox) -> Self {
        Self {
            jetstream,
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            inbox,
            seen: Arc::default(),
            nudged: Arc::default(),
        }
    }

    /// Notes that the consumer received the message at `stream_sequence`: it was readable.
    pub fn received(&self, stream_sequence: u64) {
        let mut seen = self.seen();
        if stream_sequence > seen.swept {
            seen.received.insert(stream_sequence);
        }
    }

    /// Sweeps soon, from the ack floor again: the consumer lost its pull, as it does when a
    /// message it cannot read cuts the client's connection. That message may be one swept
    /// before whose termination the cut connection lost.
    pub fn nudge(&self) {
        self.seen().from_floor = true;
        self.nudged.notify_one();
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sweeps every few seconds, and when nudged, until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(EVERY) => {}
                () = self.nudged.notified() => {
                    // Once the client has connected again.
                    tokio::time::sleep(NUDGE_DELAY).await;
                }
            }
            if let Err(error) = self.once().await {
                tracing::warn!(error = ?error, "cannot look for unreadable messages; trying again");
            }
        }
    }

    /// One sweep; returns how many messages it dead-lettered.
    ///
    /// It looks at the delivered sequences above both the ack floor and where the last sweep
    /// stopped, that this process did not receive, reading at most `SCAN` of them: so each
    /// delivered message is looked at once between two cut connections, however long the
    /// floor stays where it is (an `OrderPaid` waiting for its `OrderPlaced` holds it), and
    /// the sweep never falls behind by more than it reads.
    pub async fn once(&self) -> anyhow::Result<usize> {
        let info = self
            .jetstream
            .get_stream(&self.stream)
            .await?
            .consumer_info(&self.consumer)
            .await?;
        let floor = info.ack_floor.stream_sequence;
        let delivered = info.delivered.stream_sequence;
        let (to_read, reached) = {
            let mut seen = self.seen();
            seen.swept = if std::mem::take(&mut seen.from_floor) {
                floor
            } else {
                seen.swept.max(floor)
            };
            let from = seen.swept;
            seen.received = seen.received.split_off(&(from + 1));
            let (mut to_read, mut reached) = (Vec::new(), from);
            for seq in from + 1..=delivered {
                if !seen.received.contains(&seq) {
                    if to_read.len() == SCAN {
                        break;
                    }
                    to_read.push(seq);
                }
                reached = seq;
            }
            (to_read, reached)
        };
        let mut dead = 0;
        for seq in to_read {
            if let Some(stored) = self.read(seq).await?
                && let Some(reason) = unreadable(&stored)
                && self.dead_letter(seq, &stored, &reason).await?
            {
                dead += 1;
            }
        }
        // Only once every read went through: an error leaves them for the next sweep.
        self.seen().swept = reached;
        Ok(dead)
    }

    /// The message at `seq` with its bytes, or `None` if the stream no longer has it.
    async fn read(&self, seq: u64) -> anyhow::Result<Option<(StoredMessage, Vec<u8>, Vec<u8>)>> {
        let answer: serde_json::Value = self
            .jetstream
            .request(
                format!("STREAM.MSG.GET.{}", self.stream),
                &serde_json::json!({ "seq": seq }),
            )
            .await?;
        if let Some(error) = answer.get("error") {
            // Deleted or aged out since it was delivered: nothing left to settle. Any other
            // answer (JetStream unavailable for a moment) is for the next sweep to try again.
            anyhow::ensure!(
                error.get("code").and_then(serde_json::Value::as_u64) == Some(404),
                "cannot read stream sequence {seq}: {error}"
            );
            return Ok(None);
        }
        let Stored { message } = serde_json::from_value(answer)?;
        let decode = |field: &Option<String>| {
            field.as_deref().map_or(Ok(Vec::new()), |text| {
                base64::engine::general_purpose::STANDARD.decode(text)
            })
        };
        let (headers, body) = (decode(&message.hdrs)?, decode(&message.data)?);
        Ok(Some((message, headers, body)))
    }

    /// Keeps the message as a dead letter, then terminates its delivery; false when a letter of
    /// it was kept before (by another instance, or before a restart, or by a sweep whose
    /// termination was lost): it is terminated again.
    async fn dead_letter(
        &self,
        seq: u64,
        (message, headers, body): &(StoredMessage, Vec<u8>, Vec<u8>),
        reason: &str,
    ) -> anyhow::Result<bool> {
        let error = format!(
            "the NATS client cannot read this message ({reason}); kept from stream sequence \
             {seq} (bytes of the subject that are not UTF-8 are shown as U+FFFD)"
        );
        // Its id says where it came from, so that it is kept once.
        let id = format!("nats-sequence:{}:{seq}", self.stream);
        // The broker's delivery count is not known without a delivery to read it from.
        let mut letter =
            NewDeadLetter::new(&message.subject, body, &error).with_error_class(UNREADABLE);
        letter.message_id = Some(&id);
        letter.headers = serde_json::json!({ "NATS-Raw-Headers": [{ "hex": hex(headers) }] });
        let kept = self.inbox.dead_letter_once(letter).await?;
        if let Some(letter) = kept {
            tracing::error!(
                dead_letter.id = letter,
                stream.sequence = seq,
                reason,
                "message dead-lettered"
            );
        }
        // The server takes the delivery's own numbers from its pending record, found by stream
        // sequence; the delivery number 0 given here can never move the ack floor by itself.
        let ack = format!("$JS.ACK.{}.{}.1.{seq}.0.0.0", self.stream, self.consumer);
        let client = self.jetstream.client();
        client.publish(ack, "+TERM".into()).await?;
        client.flush().await?;
        Ok(kept.is_some())
    }
}

/// The sequences the sweep need not read.
#[derive(Debug, Default)]
struct Seen {
    /// Everything up to here was received, read, or acknowledged.
    swept: u64,
    /// Sequences above `swept` this process received.
    received: BTreeSet<u64>,
    /// The next sweep starts from the ack floor, not from `swept`.
    from_floor: bool,
}

/// Why async-nats cannot read a stored message, if it cannot: the checks its parser makes before
/// a message reaches the application.
fn unreadable((message, headers, _): &(StoredMessage, Vec<u8>, Vec<u8>)) -> Option<String> {
    // Bytes that are not UTF-8 arrive as U+FFFD (a subject really holding one is taken for them);
    // the client splits its protocol line at any white space, the server only at spaces and tabs.
    if message.subject.contains('\u{FFFD}') {
        return Some("its subject is not UTF-8".into());
    }
    if message.subject.contains(char::is_whitespace) {
        return Some("its subject holds white space".into());
    }
    if headers.is_empty() {
        return None;
    }
    let Ok(text) = std::str::from_utf8(headers) else {
        return Some("its headers are not UTF-8".into());
    };
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|version| version.strip_prefix("NATS/1.0"))
        .map(|rest| {
            rest.trim()
                .split_once(' ')
                .map_or(rest.trim(), |(code, _)| code)
        });
    match status {
        None => return Some("its header block does not start with NATS/1.0".into()),
        // A status line makes a message a control message to the client (408, 409, 100 are
        // swallowed, 404 and others become errors): no stored message may carry one.
        Some(code) if !code.is_empty() => {
            return Some("its header block carries a status".into());
        }
        Some(_) => {}
    }
    let mut lines = lines.peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            return Some("a header line has no colon".into());
        };
        if async_nats::HeaderName::from_str(name).is_err() {
            return Some("a header name is invalid".into());
        }
        // A value continued on the lines that follow.
        while lines
            .next_if(|next| next.starts_with(char::is_whitespace))
            .is_some()
        {}
    }
    None
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(subject: &str, headers: &[u8]) -> (StoredMessage, Vec<u8>, Vec<u8>) {
        let message = StoredMessage {
            subject: subject.into(),
            hdrs: None,
            data: None,
        };
        (message, headers.to_vec(), Vec::new())
    }

    #[test]
    fn what_the_client_reads_is_readable_and_the_rest_is_not() {
        let readable = [
            stored("orders.OrderPlaced.o1", b""),
            stored(
                "orders.x",
                b"NATS/1.0\r\nce-id: a\r\nce-type: OrderPlaced\r\n\r\n",
            ),
            stored("orders.x", b"NATS/1.0\r\nx-long: a\r\n  b\r\n\r\n"),
            stored("orders.x\0y", b"NATS/1.0\r\n\r\n"),
        ];
        for message in &readable {
            assert_eq!(unreadable(message), None, "{:?}", message.0.subject);
        }
        for (message, why) in [
            (stored("orders.\u{FFFD}", b""), "subject"),
            (
                stored("orders.x", b"NATS/1.0\r\nce-id: \xff\r\n\r\n"),
                "not UTF-8",
            ),
            (stored("orders.x", b"HTTP/1.1\r\n\r\n"), "NATS/1.0"),
            (stored("orders.x", b"NATS/1.0 abc\r\n\r\n"), "status"),
            (stored("orders.x", b"NATS/1.0 408 x\r\n\r\n"), "status"),
            (stored("orders.a\u{0b}b", b""), "white space"),
            (
                stored("orders.x", b"NATS/1.0\r\nno colon here\r\n\r\n"),
                "colon",
            ),
            (
                stored("orders.x", b"NATS/1.0\r\nbad name: v\r\n\r\n"),
                "name",
            ),
        ] {
            let reason = unreadable(&message).expect("unreadable");
            assert!(reason.contains(why), "{reason}");
        }
    }
}
