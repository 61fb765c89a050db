//! Shared set-up of the jetstream-outbox tests: a database migrated with both tables, a stream of
//! the test's own, publishers that fail on purpose, and bounded waits.

#![allow(dead_code, unreachable_pub)]

use std::sync::LazyLock;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use futures::future::BoxFuture;
use jetstream_outbox::headers;
use jetstream_outbox::inbox::Digest;
use jetstream_outbox::publisher::{StreamSpec, ensure_stream};
use jetstream_outbox::{Backoff, Inbox, JetStreamPublisher, NewEvent, Outcome, RelayConfig};
use sqlx::{PgConnection, PgPool};

/// Applies both of the crate's migrations.
pub async fn migrate(pool: &PgPool) {
    jetstream_outbox::migrate::outbox(pool)
        .await
        .expect("outbox migrations");
    jetstream_outbox::migrate::inbox(pool)
        .await
        .expect("inbox migrations");
}

/// A stream and subject prefix owned by one test, deleted on drop of the returned guard.
pub struct TestStream {
    pub prefix: String,
    pub name: String,
    pub jetstream: jetstream::Context,
}

impl TestStream {
    pub async fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let client = async_nats::connect(url).await.expect("NATS reachable");
        let jetstream = jetstream::new(client);
        let stream = Self {
            prefix: format!("t{suffix}"),
            name: format!("T{suffix}"),
            jetstream,
        };
        let spec = stream.spec();
        // Set-up, not what the tests are about: nats-server 2.9 once answered a creation among
        // sixteen at once with a transient "error creating store for stream" (500).
        let (jetstream, spec) = (&stream.jetstream, &spec);
        jetstream_outbox::testing::eventually(
            "the test's stream created",
            Duration::from_secs(10),
            || async move {
                ensure_stream(jetstream, spec)
                    .await
                    .inspect_err(|error| eprintln!("creating the test's stream: {error}"))
                    .ok()
            },
        )
        .await;
        stream
    }

    /// The stream as the tests create it.
    pub fn spec(&self) -> StreamSpec {
        StreamSpec::new(&self.name, vec![format!("{}.>", self.prefix)])
    }

    pub fn publisher(&self) -> JetStreamPublisher {
        JetStreamPublisher::new(self.jetstream.clone())
    }

    /// Relay settings for this stream: the defaults but for the pauses after a failure, a few
    /// milliseconds instead of the defaults' 100 ms growing to a minute (or five seconds while
    /// the broker is unreachable), so that tests injecting dozens of faults take seconds. They
    /// are kept above zero: a failed event is then not due for a moment, as with the defaults,
    /// and the claim's barrier behind an event not yet due is met.
    pub fn relay_config(&self) -> RelayConfig {
        let mut config = RelayConfig::new(&self.prefix, "/test");
        config.backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(20));
        config.unreachable_backoff = config.backoff;
        config
    }

    pub async fn stream(&self) -> Stream {
        self.jetstream
            .get_stream(&self.name)
            .await
            .expect("stream exists")
    }

    /// Every message in the stream, in stream order, as (ce-subject, ce-type, ce-id).
    pub async fn contents(&self) -> Vec<(String, String, String)> {
        let stream = self.stream().await;
        let last = stream.get_info().await.expect("info").state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let message = match stream.get_raw_message(seq).await {
                Ok(message) => message,
                // Deleted, or removed by the stream's limits.
                Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => continue,
                Err(error) => panic!("message {seq}: {error}"),
            };
            let header = |name: &str| {
                message
                    .headers
                    .get(name)
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            out.push((
                header(headers::SUBJECT),
                header(headers::TYPE),
                header(headers::ID),
            ));
        }
        out
    }

    /// Every message in the stream, in stream order, as `aggregate:type`.
    pub async fn published(&self) -> Vec<String> {
        let contents = self.contents().await;
        contents
            .into_iter()
            .map(|(subject, kind, _)| format!("{subject}:{kind}"))
            .collect()
    }

    pub async fn delete(self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
    }
}

/// Enqueues one event and commits.
pub async fn enqueue(pool: &PgPool, aggregate: &str, event_type: &str, payload: serde_json::Value) {
    let mut tx = pool.begin().await.expect("begin");
    let event = NewEvent::new("order", aggregate, event_type, &payload).expect("valid event");
    jetstream_outbox::enqueue(&mut tx, &event)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
}

/// Rows in `table`.
pub async fn count(pool: &PgPool, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Moves every published event `hours` back in time, into the partition of
/// `outbox_published` it would then be in, so that a cleanup may age it out; the statistics
/// the cleanup counts with are written before this returns.
pub async fn publish_earlier(pool: &PgPool, hours: i32) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_stat_force_next_flush();
         UPDATE outbox_published
         SET published_at = published_at - interval '{hours} hours',
             slot = outbox_published_slot(published_at - interval '{hours} hours')"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// A counter with no constraint behind it: the effect of the inbox tests that is not idempotent.
pub async fn create_counter(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE counter (n int NOT NULL); INSERT INTO counter VALUES (0)")
        .execute(pool)
        .await
        .unwrap();
}

/// The inbox tests' effect: adds one to the counter.
pub fn add_one(conn: &mut PgConnection) -> BoxFuture<'_, sqlx::Result<()>> {
    Box::pin(async move {
        sqlx::query("UPDATE counter SET n = n + 1")
            .execute(conn)
            .await
            .map(drop)
    })
}

/// Delivers message `id` with `digest` to `inbox`, whose effect adds one to the counter.
pub async fn count_up(inbox: &Inbox, id: &str, digest: &Digest) -> Outcome<()> {
    inbox.process(id, digest, add_one).await.unwrap()
}

/// The counter `count_up` adds to.
pub async fn counter(pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT n FROM counter")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;

/// Milliseconds since 1970 `days` days before the test began (read once, so that ids and
/// partitions agree even if the test runs across midnight).
pub fn ms_ago(days: i64) -> i64 {
    static NOW: LazyLock<i64> = LazyLock::new(|| chrono::Utc::now().timestamp_millis());
    *NOW - days * DAY_MS
}

/// The `n`th UUIDv7 (in canonical text, as the relay's ids) made `days` days ago.
pub fn v7_id(days: i64, n: u64) -> String {
    let ms = ms_ago(days);
    format!("{:08x}-{:04x}-7000-8000-{n:012x}", ms >> 16, ms & 0xffff)
}

/// The file a table's rows are in: `TRUNCATE` gives it a new one, `DELETE` does not.
pub async fn filenode(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar("SELECT pg_relation_filenode($1::regclass)::bigint")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}
