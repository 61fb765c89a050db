//! The checker run after every scenario once the system has drained: it compares what the
//! clients were told with the orders database, the stream and the billing database.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt as _;
use jetstream_outbox::headers;
use sqlx::PgPool;

use crate::load::Ledger;

/// Everything the checker counted. A correct run has every counter but the totals at 0.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Orders the clients were told were accepted.
    pub accepted: usize,
    /// Invoices in billing.
    pub invoices: usize,
    /// Accepted orders without an order row or without an invoice.
    pub lost: usize,
    /// Orders with more than one invoice, or with a change (opened, paid) applied more than
    /// once: counted from a log of every committed application (see [`log_applications`]),
    /// which neither `invoices.order_id UNIQUE` nor the insert's `ON CONFLICT` can hide.
    pub duplicates: usize,
    /// Orders, invoices or events for orders never accepted.
    pub unexpected: usize,
    /// Invoices whose total differs from the order's.
    pub wrong_totals: usize,
    /// Invoices whose status disagrees with the order's (paid iff the order was paid).
    pub wrong_status: usize,
    /// Orders whose events reached the stream out of order.
    pub order_violations: usize,
    /// Messages in the stream with a `ce-id` stored before within the stream's duplicate window
    /// (the broker should have dropped them; a copy published after the window, as a relay
    /// retrying through a longer outage publishes, is the inbox's to drop).
    pub stream_duplicates: usize,
    /// Outbox rows still pending, and dead ones.
    pub pending: i64,
    /// Dead outbox rows plus open dead letters.
    pub dead: i64,
    /// Times an orders-service instance deleted the stream as damaged (returning none of the
    /// messages it counts), from their logs: deleting a sound stream would take every
    /// consumer on it. Only a scenario that damages the stream may expect any.
    pub streams_deleted_as_damaged: usize,
}

impl Report {
    /// Panics with the whole report unless every invariant held.
    pub fn assert_clean(&self) {
        let clean = Report {
            accepted: self.accepted,
            invoices: self.invoices,
            ..Report::default()
        };
        assert_eq!(self, &clean, "the checker found violations");
        assert!(self.accepted > 0, "the load placed no order");
    }

    /// [`Report::assert_clean`], for a scenario that damages the stream: the relays may have
    /// deleted it as damaged.
    pub fn assert_clean_after_damage(&self) {
        Report {
            streams_deleted_as_damaged: 0,
            ..*self
        }
        .assert_clean();
    }
}

/// Where the checker looks.
#[derive(Debug)]
pub struct Sources<'a> {
    /// orders-service's database.
    pub orders: &'a PgPool,
    /// billing-service's database.
    pub billing: &'a PgPool,
    /// The NATS server holding the stream.
    pub nats_url: String,
    /// The stream.
    pub stream: &'a str,
}

/// Has billing's database log every committed application to an invoice (a trigger; the SQL
/// is `billing-service/tests/applications.sql`, which billing's own tests use too). Run it once
/// billing has migrated its database and before any message is applied.
pub async fn log_applications(billing: &PgPool) {
    sqlx::raw_sql(include_str!("../../billing-service/tests/applications.sql"))
        .execute(billing)
        .await
        .expect("the application log");
}

/// Orders with a change applied more than once, from the log of [`log_applications`].
pub async fn applied_twice(billing: &PgPool) -> HashSet<String> {
    sqlx::query_scalar(
        "SELECT DISTINCT order_id FROM test_applications
         GROUP BY order_id, change HAVING count(*) > 1",
    )
    .fetch_all(billing)
    .await
    .expect("the application log")
    .into_iter()
    .collect()
}

/// Waits (bounded) until everything committed was relayed and invoiced, then checks.
pub async fn check(sources: &Sources<'_>, ledger: &Ledger) -> Report {
    drain(sources).await;
    let accepted = ledger.accepted();
    let mut report = Report {
        accepted: accepted.len(),
        ..Report::default()
    };

    let orders: HashMap<String, (i64, String)> =
        sqlx::query_as::<_, (String, i64, String)>("SELECT id, total_minor, status FROM orders")
            .fetch_all(sources.orders)
            .await
            .expect("orders")
            .into_iter()
            .map(|(id, total, status)| (id, (total, status)))
            .collect();
    let invoices: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT order_id, total_minor, status FROM invoices")
            .fetch_all(sources.billing)
            .await
            .expect("invoices");
    report.invoices = invoices.len();
    let applied_twice = applied_twice(sources.billing).await;
    let mut per_order: HashMap<&str, Vec<(i64, &str)>> = HashMap::new();
    for (order_id, total, status) in &invoices {
        per_order
            .entry(order_id)
            .or_default()
            .push((*total, status));
    }

    for (id, total) in &accepted {
        let (Some((order_total, order_status)), Some(found)) =
            (orders.get(id), per_order.get(id.as_str()))
        else {
            report.lost += 1;
            continue;
        };
        if found.len() > 1 || applied_twice.contains(id) {
            report.duplicates += 1;
        }
        let (invoice_total, invoice_status) = found[0];
        if invoice_total != *total || order_total != total {
            report.wrong_totals += 1;
        }
        let paid = matches!(order_status.as_str(), "paid" | "shipped");
        if paid != (invoice_status == "paid") {
            report.wrong_status += 1;
        }
    }
    report.unexpected = orders
        .keys()
        .filter(|id| !accepted.contains_key(*id))
        .count()
        + per_order
            .keys()
            .filter(|id| !accepted.contains_key(**id))
            .count();

    let (violations, duplicates, strangers) = check_stream(sources, &accepted).await;
    report.order_violations = violations;
    report.stream_duplicates = duplicates;
    report.unexpected += strangers;

    let (pending, dead): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'dead') FROM outbox",
    )
    .fetch_one(sources.orders)
    .await
    .expect("outbox counts");
    let open_letters: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_dead WHERE closed_at IS NULL")
            .fetch_one(sources.billing)
            .await
            .expect("dead letters");
    report.pending = pending;
    report.dead = dead + open_letters;
    report
}

/// Waits (at most two minutes: scenarios run side by side on two cores, one of them after a
/// three-minute backlog) until the outbox is empty and billing reflects every order. A system
/// that never gets there is reported by the checks that follow, not by a timeout.
async fn drain(sources: &Sources<'_>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline && !drained(sources).await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn drained(sources: &Sources<'_>) -> bool {
    let counts: Result<(i64, i64, i64), _> = sqlx::query_as(
        "SELECT (SELECT count(*) FROM outbox WHERE status = 'pending'), \
                (SELECT count(*) FROM orders), \
                (SELECT count(*) FROM orders WHERE status IN ('paid', 'shipped'))",
    )
    .fetch_one(sources.orders)
    .await;
    let billed: Result<(i64, i64), _> =
        sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE status = 'paid') FROM invoices")
            .fetch_one(sources.billing)
            .await;
    matches!((counts, billed), (Ok((0, orders, paid)), Ok((invoices, paid_invoices)))
        if invoices == orders && paid_invoices == paid)
}

type Ordered = async_nats::jetstream::consumer::pull::Ordered;

/// One message of the stream, as the checker reads it.
struct Entry {
    sequence: u64,
    /// When the stream stored it, in nanoseconds.
    stored: i128,
    headers: async_nats::HeaderMap,
}

/// Reads a stream from its start, headers only, with an ordered consumer: a request per message
/// took minutes for the backlog of a long outage. When the consumer goes quiet for 30 s, or keeps
/// failing (errors, such as missed heartbeats, are the ordered consumer's to recover from), the
/// rest is read a message at a time by sequence: an ordered consumer of a stream whose files
/// nats-server 2.9 removed delivers nothing, where reading by sequence shows what is missing
/// (the relay makes such a stream again). Either way every message is read once.
struct StreamReader<'a> {
    stream: &'a async_nats::jetstream::stream::Stream,
    ordered: Option<Ordered>,
    read: u64,
    last: u64,
}

impl<'a> StreamReader<'a> {
    async fn new(stream: &'a async_nats::jetstream::stream::Stream, last: u64) -> Self {
        use async_nats::jetstream::consumer::pull::OrderedConfig;
        let ordered = stream
            .create_consumer(OrderedConfig {
                headers_only: true,
                ..Default::default()
            })
            .await
            .expect("ordered consumer")
            .messages()
            .await
            .expect("messages");
        Self {
            stream,
            ordered: Some(ordered),
            read: 0,
            last,
        }
    }

    /// The next message up to the stream's last one when the reader began; `None` after it.
    async fn next(&mut self) -> Option<Entry> {
        while self.read < self.last {
            let (entry, newest) = match self.ordered.as_mut() {
                Some(ordered) => {
                    if let Some(entry) = Self::next_ordered(ordered).await {
                        entry
                    } else {
                        let now = self.stream.get_info().await.map(|info| info.state);
                        eprintln!(
                            "checker: the ordered consumer is quiet after {} (of {}); reading \
                             by sequence: {now:?}",
                            self.read, self.last
                        );
                        self.ordered = None;
                        continue;
                    }
                }
                // Nothing left: the stream removed the rest.
                None => self.next_by_sequence().await?,
            };
            // The stream's newest message: any after `last` came since.
            self.read = if newest {
                entry.sequence.max(self.last)
            } else {
                entry.sequence
            };
            return Some(entry);
        }
        None
    }

    /// The ordered consumer's next message and whether it is the newest; `None` when it is quiet
    /// or keeps failing.
    async fn next_ordered(ordered: &mut Ordered) -> Option<(Entry, bool)> {
        let mut errors = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), ordered.next()).await {
                Ok(Some(Ok(message))) => {
                    let info = message.info().expect("JetStream message");
                    let entry = Entry {
                        sequence: info.stream_sequence,
                        stored: info.published.unix_timestamp_nanos(),
                        headers: message.headers.clone().unwrap_or_default(),
                    };
                    return Some((entry, info.pending == 0));
                }
                Ok(None) => panic!("the stream's messages ended early"),
                Ok(Some(Err(_))) if errors < 10 => errors += 1,
                Ok(Some(Err(_))) | Err(_) => return None,
            }
        }
    }

    /// The message after `read` asked for by sequence (a sequence the stream removed is passed);
    /// `None` when none is left.
    async fn next_by_sequence(&self) -> Option<(Entry, bool)> {
        for sequence in self.read + 1..=self.last {
            match self.stream.get_raw_message(sequence).await {
                Ok(message) => {
                    let entry = Entry {
                        sequence,
                        stored: message.time.unix_timestamp_nanos(),
                        headers: message.headers,
                    };
                    return Some((entry, sequence == self.last));
                }
                Err(error)
                    if error.kind()
                        == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {}
                Err(error) => panic!("message {sequence} of the stream: {error}"),
            }
        }
        None
    }
}

/// Per-order event order on the stream, `ce-id`s stored twice within the stream's duplicate
/// window, and events of unknown orders.
async fn check_stream(
    sources: &Sources<'_>,
    accepted: &HashMap<String, i64>,
) -> (usize, usize, usize) {
    const LIFECYCLE: [&str; 3] = ["OrderPlaced", "OrderPaid", "OrderShipped"];
    let client = service_kit::infra::connect_nats(&sources.nats_url, "e2e-checker")
        .await
        .expect("NATS");
    let stream = async_nats::jetstream::new(client)
        .get_stream(sources.stream)
        .await
        .expect("stream");
    let info = stream.get_info().await.expect("stream info");
    let (last, window) = (info.state.last_sequence, info.config.duplicate_window);
    // When each ce-id was last stored, in nanoseconds.
    let mut seen: HashMap<String, i128> = HashMap::new();
    let mut events: HashMap<String, Vec<String>> = HashMap::new();
    let mut duplicates = 0;
    let mut reader = StreamReader::new(&stream, last).await;
    while let Some(Entry {
        stored, headers, ..
    }) = reader.next().await
    {
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        // The broker's window runs from the last copy it stored.
        if let Some(last_stored) = seen.get_mut(&header(headers::ID)) {
            if stored - *last_stored < window.as_nanos() as i128 {
                duplicates += 1;
            } else {
                *last_stored = stored;
            }
            continue;
        }
        seen.insert(header(headers::ID), stored);
        events
            .entry(header(headers::SUBJECT))
            .or_default()
            .push(header(headers::TYPE));
    }
    let violations = events
        .values()
        .filter(|types| {
            types.len() > LIFECYCLE.len() || types.iter().zip(LIFECYCLE).any(|(t, e)| t != e)
        })
        .count();
    let strangers = events
        .keys()
        .filter(|id| !accepted.contains_key(*id))
        .count();
    (violations, duplicates, strangers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of reading give every message once, in order, with its headers, passing a
    /// sequence the stream removed.
    #[tokio::test]
    async fn the_ordered_consumer_and_reads_by_sequence_see_the_same_messages() {
        let client = async_nats::connect(service_kit::testing::nats_url())
            .await
            .unwrap();
        let js = async_nats::jetstream::new(client);
        let name = service_kit::testing::unique("checker");
        let stream = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .unwrap();
        for i in 1..=5 {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(headers::ID, i.to_string().as_str());
            js.publish_with_headers(format!("{name}.x"), headers, "{}".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        stream.delete_message(3).await.unwrap();
        let read = |by_sequence: bool| {
            let stream = &stream;
            async move {
                let mut reader = StreamReader::new(stream, 5).await;
                if by_sequence {
                    reader.ordered = None;
                }
                let mut seen = Vec::new();
                while let Some(entry) = reader.next().await {
                    let id = entry.headers.get(headers::ID).unwrap().to_string();
                    seen.push((entry.sequence, id));
                }
                seen
            }
        };
        let expected: Vec<(u64, String)> = [1, 2, 4, 5].map(|i| (i, i.to_string())).to_vec();
        assert_eq!(read(false).await, expected);
        assert_eq!(read(true).await, expected);
        js.delete_stream(&name).await.unwrap();
    }
}
