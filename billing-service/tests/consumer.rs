//! billing-service's consumer against the real nats-server and PostgreSQL, with messages put on
//! the stream by hand.

use std::time::Duration;

use async_nats::HeaderMap;
use billing_service::{App, Config};
use bytes::Bytes;
use jetstream_outbox::headers;
use serde_json::{Value, json};
use service_kit::testing::{self, Running, eventually};
use sqlx::PgPool;

struct TestApp {
    running: Running,
    config: Config,
    pool: PgPool,
    jetstream: async_nats::jetstream::Context,
    prefix: String,
    database: String,
    stream: String,
}

impl TestApp {
    async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let database = testing::unique("billing_test");
        let stream = testing::unique("BILLING_TEST");
        let mut config = Config::from_env().unwrap();
        testing::point_at(&mut config.common, &database, &stream);
        let prefix = config.common.subject_prefix.clone();
        // Redeliveries 50 ms apart (the default is a second), so that a message waiting for
        // another comes back within a test; as many retries as make that a minute, so that none
        // is dead-lettered for waiting while a test runs, except where a test lowers them.
        config.consumer.retry_delay = Duration::from_millis(50);
        config.consumer.max_retries = 1000;
        adjust(&mut config);
        let client = async_nats::connect(testing::nats_url()).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        // orders-service's part, with its retries: billing waits for the stream, never makes it.
        service_kit::infra::ensure_stream(
            &jetstream,
            &service_kit::infra::stream_spec(
                &config.common,
                &service_kit::config::StreamLimits::default(),
            ),
            &service_kit::infra::Refusals::default(),
        )
        .await
        .unwrap();
        let (running, pool) = Self::start(config.clone()).await;
        Self {
            running,
            config,
            pool,
            jetstream,
            prefix,
            database,
            stream,
        }
    }

    async fn start(config: Config) -> (Running, PgPool) {
        let app = App::build(config).await.unwrap();
        let pool = app.pool().clone();
        (
            Running::spawn(app.port(), |stop| app.run_until_stopped(stop)),
            pool,
        )
    }

    /// Stops the service and starts it again on the same database and stream, once the broker
    /// holds no pull request of the stopped one: a message sent to such a request would reach
    /// nobody and come back only after the ack wait, a second delivery the restart did not cause.
    async fn restart(self) -> Self {
        let Self {
            running,
            config,
            jetstream,
            prefix,
            database,
            stream,
            ..
        } = self;
        running.stop().await;
        let broker_stream = jetstream.get_stream(&stream).await.unwrap();
        eventually("no pull request of the stopped service", WAIT, || async {
            let info = broker_stream
                .consumer_info(&config.consumer.name)
                .await
                .ok()?;
            (info.num_waiting == 0).then_some(())
        })
        .await;
        let (running, pool) = Self::start(config.clone()).await;
        Self {
            running,
            config,
            pool,
            jetstream,
            prefix,
            database,
            stream,
        }
    }

    /// Publishes a message as the relay would, with `ce-id` = `id`.
    async fn publish(&self, id: &str, event_type: &str, order_id: &str, body: impl Into<Bytes>) {
        self.publish_all([(id, event_type, order_id, body.into())])
            .await;
    }

    /// Publishes messages (`ce-id`, type, order, body) in their order on one connection, as a
    /// relay's wave does: all sent before their acknowledgements are awaited.
    async fn publish_all<'a>(
        &self,
        messages: impl IntoIterator<Item = (&'a str, &'a str, &'a str, Bytes)>,
    ) {
        let mut acks = Vec::new();
        for (id, event_type, order_id, body) in messages {
            let mut headers = HeaderMap::new();
            headers.insert(headers::SPECVERSION, "1.0");
            headers.insert(headers::ID, id);
            headers.insert(headers::TYPE, event_type);
            headers.insert(headers::SOURCE, "/test");
            headers.insert(headers::SUBJECT, order_id);
            // A fresh Nats-Msg-Id so the broker does not drop deliberate duplicates.
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                uuid::Uuid::new_v4().to_string().as_str(),
            );
            let subject = format!("{}.{event_type}.{order_id}", self.prefix);
            let ack = self
                .jetstream
                .publish_with_headers(subject, headers, body)
                .await
                .unwrap();
            acks.push(ack);
        }
        for ack in acks {
            ack.await.unwrap();
        }
    }

    async fn invoice(&self, order_id: &str) -> Option<(i64, String)> {
        sqlx::query_as("SELECT total_minor, status FROM invoices WHERE order_id = $1")
            .bind(order_id)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    /// Keeps `event_type` message `id` of `order` (total 100) as a dead letter by hand, as
    /// an earlier version's bug would have; returns the letter's id.
    async fn dead_letter(&self, id: &str, event_type: &str, order: &str) -> i64 {
        let inbox = jetstream_outbox::Inbox::new(self.pool.clone(), &self.config.consumer.name);
        let subject = format!("{}.{event_type}.{order}", self.prefix);
        let body = placed(order, 100);
        let mut letter =
            jetstream_outbox::inbox::NewDeadLetter::new(&subject, &body, "an earlier bug");
        letter.message_id = Some(id);
        letter.headers = json!({ headers::ID: [id], headers::TYPE: [event_type] });
        inbox.dead_letter(letter).await.unwrap()
    }

    /// Makes the statements `when` names fail with `message` (trigger `refuse`), as
    /// `BEFORE INSERT ON ops_audit FOR EACH ROW`.
    async fn refuse(&self, when: &str, message: &str) {
        let sql = format!(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION '{message}'; END $$; \
             CREATE TRIGGER refuse {when} EXECUTE FUNCTION refuse();"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn stats(&self) -> Value {
        reqwest::get(format!("{}/inbox/stats", self.running.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// An admin request with the token `s3cret`, which must answer 200; its JSON.
    async fn admin(&self, method: &str, path_and_query: &str) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = reqwest::Client::new()
            .request(method, format!("{}{path_and_query}", self.running.url))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path_and_query}");
        response.json().await.unwrap()
    }

    /// The answer to a POST with the admin token `s3cret`, whatever its status.
    async fn admin_post(&self, path_and_query: &str) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}{path_and_query}", self.running.url))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
    }

    /// How many dead letters are open.
    async fn open_letters(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM inbox_dead WHERE closed_at IS NULL")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.running.stop().await;
        testing::drop_database(&self.database).await;
        testing::delete_stream(&self.stream).await;
    }
}

fn placed(order_id: &str, total_minor: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"orderId": order_id, "customer": "ada", "totalMinor": total_minor}))
        .unwrap()
}

/// Publishes a message to the test server byte for byte, through the NATS protocol itself:
/// client libraries refuse what a hostile producer can send (a subject or header that is not
/// UTF-8), and nats-server stores it all the same.
async fn publish_bytes(subject: &[u8], headers: &[u8], body: &[u8]) {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let url = testing::nats_url();
    let address = url.trim_start_matches("nats://");
    let mut connection =
        tokio::io::BufStream::new(tokio::net::TcpStream::connect(address).await.unwrap());
    let mut line = String::new();
    connection.read_line(&mut line).await.unwrap(); // INFO
    let mut frame = b"CONNECT {\"verbose\":false,\"headers\":true}\r\nHPUB ".to_vec();
    frame.extend_from_slice(subject);
    let block = [b"NATS/1.0\r\n".as_slice(), headers, b"\r\n"].concat();
    let total = block.len() + body.len();
    frame.extend_from_slice(format!(" {} {total}\r\n", block.len()).as_bytes());
    frame.extend_from_slice(&block);
    frame.extend_from_slice(body);
    frame.extend_from_slice(b"\r\nPING\r\n");
    connection.write_all(&frame).await.unwrap();
    connection.flush().await.unwrap();
    line.clear();
    connection.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim_end(), "PONG", "the server took the message");
}

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn poison_message_is_dead_lettered_and_others_flow() {
    let app = TestApp::spawn_with(|config| config.common.admin_token = Some("s3cret".into())).await;
    app.publish("m-poison", "OrderPlaced", "o1", "not json")
        .await;
    app.publish("m-ok", "OrderPlaced", "o2", placed("o2", 300))
        .await;

    let invoice = eventually("o2's invoice", WAIT, || async { app.invoice("o2").await }).await;
    assert_eq!(invoice, (300, "open".into()));
    let stats = eventually("the dead letter", WAIT, || async {
        let stats = app.stats().await;
        (stats["dead"] == 1).then_some(stats)
    })
    .await;
    assert_eq!(stats["processed"], 1, "{stats}");
    let (message_id, payload): (Option<String>, Vec<u8>) =
        sqlx::query_as("SELECT message_id, payload FROM inbox_dead")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        (message_id.as_deref(), payload.as_slice()),
        (Some("m-poison"), &b"not json"[..])
    );
    assert_eq!(app.invoice("o1").await, None);
    // An operator gives up on it: closed as skipped, still kept.
    let id: i64 = sqlx::query_scalar("SELECT id FROM inbox_dead")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    // Before that, reads it whole: its headers and its body (left out of the listing).
    let url = app.running.url.clone();
    let read = |path: String| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .get(format!("{url}{path}"))
                .bearer_auth("s3cret")
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let listed = read("/inbox/dead".into()).await;
    assert!(listed["items"][0].get("body").is_none(), "{listed}");
    let letter = read(format!("/inbox/dead/{id}")).await;
    assert_eq!(letter["body"]["text"], "not json", "{letter}");
    assert_eq!(letter["headers"][headers::ID][0], "m-poison", "{letter}");
    let skip = || {
        reqwest::Client::new()
            .post(format!("{}/inbox/dead/{id}/skip", app.running.url))
            .bearer_auth("s3cret")
            .send()
    };
    assert_eq!(skip().await.unwrap().status(), 200);
    assert_eq!(skip().await.unwrap().status(), 404, "closed by the first");
    assert_eq!(app.stats().await["dead"], 0);
    let resolution: Option<String> = sqlx::query_scalar("SELECT resolution FROM inbox_dead")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(resolution.as_deref(), Some("skipped"));
    assert_eq!(app.invoice("o1").await, None);
    app.stop().await;
}

#[tokio::test]
async fn paid_before_placed_is_retried_not_lost() {
    let app = TestApp::spawn().await;
    app.publish("m-paid", "OrderPaid", "o1", placed("o1", 500))
        .await;
    app.publish("m-placed", "OrderPlaced", "o1", placed("o1", 500))
        .await;

    let invoice = eventually("o1 paid", WAIT, || async {
        app.invoice("o1")
            .await
            .filter(|(_, status)| status == "paid")
    })
    .await;
    assert_eq!(invoice.0, 500);
    let stats = app.stats().await;
    assert_eq!(
        (stats["processed"].as_i64(), stats["dead"].as_i64()),
        (Some(2), Some(0)),
        "{stats}"
    );
    app.stop().await;
}

/// A payment that arrives before its order waits in the consumer, retried: `/inbox/stats` says
/// one message waits and how long ago it was stored; once the order is placed, nothing waits.
/// (The gauges of `/metrics` are checked by e2e/tests/alerts.rs: this binary's tests share one
/// recorder.)
#[tokio::test]
async fn the_consumers_lag_counts_what_waits() {
    let app = TestApp::spawn().await;
    let stats = app.stats().await;
    assert_eq!(
        (
            stats["waiting"].as_u64(),
            stats["oldestWaitingSeconds"].as_f64()
        ),
        (Some(0), Some(0.0)),
        "{stats}"
    );
    app.publish("m-paid", "OrderPaid", "o1", placed("o1", 500))
        .await;
    let stats = eventually("the payment waiting", WAIT, || async {
        let stats = app.stats().await;
        let old = stats["oldestWaitingSeconds"].as_f64().unwrap_or_default() > 0.5;
        (stats["waiting"].as_u64() == Some(1) && old).then_some(stats)
    })
    .await;
    assert_eq!(stats["processed"].as_i64(), Some(0), "{stats}");

    app.publish("m-placed", "OrderPlaced", "o1", placed("o1", 500))
        .await;
    eventually("nothing waiting", WAIT, || async {
        let stats = app.stats().await;
        (stats["waiting"].as_u64() == Some(0)).then_some(())
    })
    .await;
    app.stop().await;
}

/// Many orders' placements and payments arriving together, so that transactions run side by
/// side (a small `CONSUMER_APPLY_BATCH`, several `CONSUMER_CONCURRENCY`): an order's payment is
/// never applied in a transaction beside the one of its placement, which would not see the
/// invoice yet. One not-yet outcome is made a dead letter here, so a payment taken out of its
/// order shows as one instead of being retried quietly.
#[tokio::test]
async fn one_orders_messages_apply_in_their_order_while_transactions_run_side_by_side() {
    const ORDERS: usize = 200;
    let app = TestApp::spawn_with(|config| {
        // Small batches, four at a time, so that one order's two messages often land in
        // transactions running side by side; one not-yet outcome dead-letters, so that a
        // payment applied before its placement shows as a dead letter, not a retry.
        config.consumer.apply_batch = 4;
        config.consumer.concurrency = 4;
        config.consumer.max_retries = 1;
    })
    .await;
    // Each order's payment right behind its placement, the orders interleaved in pairs.
    let mut messages = Vec::new();
    for pair in (0..ORDERS).collect::<Vec<_>>().chunks(2) {
        for (event_type, id) in [("OrderPlaced", "placed"), ("OrderPaid", "paid")] {
            for &i in pair {
                let order = format!("o{i}");
                messages.push((format!("{id}-{i}"), event_type, placed(&order, 100), order));
            }
        }
    }
    let messages = messages.iter().map(|(id, event_type, body, order)| {
        (
            id.as_str(),
            *event_type,
            order.as_str(),
            body.clone().into(),
        )
    });
    app.publish_all(messages).await;

    let stats = eventually("every message settled", WAIT, || async {
        let stats = app.stats().await;
        let settled = stats["processed"].as_u64()? + stats["dead"].as_u64()?;
        (settled == 2 * ORDERS as u64).then_some(stats)
    })
    .await;
    assert_eq!(stats["dead"].as_i64(), Some(0), "{stats}");
    let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices WHERE status = 'paid'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(paid, ORDERS as i64);
    app.stop().await;
}

/// Every copy after the first is a duplicate: the inbox alone keeps it from being applied
/// again (a log of every committed application counts, not the invoices, which the UNIQUE
/// order id and the insert's ON CONFLICT would keep at one whatever billing did).
#[tokio::test]
async fn redelivered_message_changes_nothing() {
    let app = TestApp::spawn().await;
    sqlx::raw_sql(include_str!("applications.sql"))
        .execute(&app.pool)
        .await
        .unwrap();
    for _ in 0..3 {
        app.publish("m-same", "OrderPlaced", "o1", placed("o1", 900))
            .await;
    }
    app.publish("m-other", "OrderPlaced", "o2", placed("o2", 100))
        .await;

    let stats = eventually("all four deliveries", WAIT, || async {
        let stats = app.stats().await;
        (stats["processed"] == 2 && stats["duplicate"] == 2).then_some(stats)
    })
    .await;
    assert_eq!(stats["dead"], 0);
    let applications: i64 = sqlx::query_scalar("SELECT count(*) FROM test_applications")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(applications, 2, "one application per message");
    app.stop().await;
}

/// A message that cannot be applied (OrderPaid for an order billing never saw) becomes a dead
/// letter; once the cause is fixed (the OrderPlaced arrives), an admin replay applies it
/// exactly once.
#[tokio::test]
async fn dead_letter_replay_after_the_cause_is_fixed_applies_once() {
    let app = TestApp::spawn_with(|config| {
        // Two not-yet outcomes make the payment a dead letter at once, rather than after
        // the hundred of the default.
        config.consumer.max_retries = 2;
        config.common.admin_token = Some("s3cret".into());
    })
    .await;
    app.publish("m-paid", "OrderPaid", "o1", placed("o1", 800))
        .await;
    eventually("the dead letter", WAIT, || async {
        (app.stats().await["dead"] == 1).then_some(())
    })
    .await;
    app.publish("m-other", "OrderPlaced", "o2", placed("o2", 100))
        .await;
    eventually("o2's invoice", WAIT, || async { app.invoice("o2").await }).await;

    let client = reqwest::Client::new();
    let dead: Value = client
        .get(format!("{}/inbox/dead", app.running.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = dead["items"][0]["id"].as_i64().unwrap();
    assert!(
        dead["items"][0]["error"]
            .as_str()
            .unwrap()
            .contains("no invoice for order o1")
    );
    let retry = |token: &'static str| {
        client
            .post(format!("{}/inbox/dead/{id}/retry", app.running.url))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(retry("wrong").await.unwrap().status(), 401);
    assert_eq!(
        retry("s3cret").await.unwrap().status(),
        409,
        "o1 still has no invoice"
    );

    app.publish("m-placed", "OrderPlaced", "o1", placed("o1", 800))
        .await;
    eventually("o1's invoice", WAIT, || async { app.invoice("o1").await }).await;
    assert_eq!(retry("s3cret").await.unwrap().status(), 200);
    assert_eq!(app.invoice("o1").await, Some((800, "paid".into())));
    assert_eq!(
        retry("s3cret").await.unwrap().status(),
        404,
        "closed after the replay"
    );
    let stats = app.stats().await;
    assert_eq!(
        (stats["processed"].as_i64(), stats["dead"].as_i64()),
        (Some(3), Some(0)),
        "{stats}"
    );
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(invoices, 2);
    app.stop().await;
}

/// An operator replays or skips every open dead letter a filter matches: a replay goes through
/// the inbox as a single one does, page by page, and a bulk skip closes only the matches.
#[tokio::test]
async fn bulk_replay_and_skip_take_the_letters_their_filter_matches() {
    let app = TestApp::spawn_with(|config| {
        // Two not-yet outcomes make the payments dead letters at once.
        config.consumer.max_retries = 2;
        config.common.admin_token = Some("s3cret".into());
    })
    .await;
    app.publish("m-paid-1", "OrderPaid", "o1", placed("o1", 100))
        .await;
    app.publish("m-paid-2", "OrderPaid", "o2", placed("o2", 200))
        .await;
    app.publish("m-poison", "OrderPlaced", "o3", "not json")
        .await;
    eventually("three dead letters", WAIT, || async {
        (app.stats().await["dead"] == 3).then_some(())
    })
    .await;
    let listed = app
        .admin("GET", "/inbox/dead?errorContains=no%20invoice")
        .await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");
    let listed = app.admin("GET", "/inbox/dead?eventType=OrderPlaced").await;
    assert_eq!(listed["items"][0]["messageId"], "m-poison", "{listed}");
    // Each kind of failure has its class: the poison message's, and the two not applicable.
    let listed = app
        .admin("GET", "/inbox/dead?errorClass=invalid-payload")
        .await;
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["messageId"], "m-poison", "{listed}");
    let groups = app.admin("GET", "/inbox/dead/groups").await;
    let classes: Vec<_> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["errorClass"].as_str(), g["count"].as_i64()))
        .collect();
    assert_eq!(
        classes,
        [
            (Some("not-applicable"), Some(2)),
            (Some("invalid-payload"), Some(1))
        ],
        "{groups}"
    );
    let refused = reqwest::Client::new()
        .post(format!(
            "{}/inbox/dead/retry?eventType=a.b",
            app.running.url
        ))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);

    let paid = "/inbox/dead/retry?eventType=OrderPaid";
    let outcome = app.admin("POST", paid).await;
    let nothing_yet = json!({"count": 0, "notApplied": 2, "nextCursor": null});
    assert_eq!(outcome, nothing_yet, "no invoice yet");
    // The oldest letter's order gets its OrderPlaced: the first page of one applies.
    let listed = app.admin("GET", "/inbox/dead?eventType=OrderPaid").await;
    let ((order, total), other) = match listed["items"][0]["messageId"].as_str() {
        Some("m-paid-1") => (("o1", 100), "m-paid-2"),
        _ => (("o2", 200), "m-paid-1"),
    };
    app.publish("m-placed", "OrderPlaced", order, placed(order, total))
        .await;
    eventually("the invoice", WAIT, || async { app.invoice(order).await }).await;
    let first = app.admin("POST", &format!("{paid}&limit=1")).await;
    let counts = (first["count"].as_u64(), first["notApplied"].as_u64());
    assert_eq!(counts, (Some(1), Some(0)));
    let cursor = first["nextCursor"].as_str().expect("a second page");
    let second = app
        .admin("POST", &format!("{paid}&limit=1&cursor={cursor}"))
        .await;
    assert_eq!(
        second,
        json!({"count": 0, "notApplied": 1, "nextCursor": null})
    );
    assert_eq!(app.invoice(order).await, Some((total, "paid".into())));

    let skip = "/inbox/dead/skip?errorContains=invalid%20OrderPlaced";
    assert_eq!(app.admin("POST", skip).await["count"], 1);
    assert_eq!(app.admin("POST", skip).await["count"], 0, "idempotent");
    let open: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM inbox_dead WHERE closed_at IS NULL")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(open, [other]);
    // Every request that acted is in the audit log, newest first, with what it took.
    let audit = app.admin("GET", "/ops/audit").await;
    let entries = actions(&audit);
    assert_eq!(entries[..2], [("skip", 0), ("skip", 1)], "{audit}");
    assert!(entries.contains(&("replay", 1)), "{audit}");
    app.stop().await;
}

/// A replay the database fails answers 503 and leaves the letter open, rather than 409
/// "still not applicable", which would send the operator looking for a missing order.
#[tokio::test]
async fn a_replay_the_database_fails_answers_503_and_the_letter_stays() {
    let app = TestApp::spawn_with(|config| {
        config.common.admin_token = Some("s3cret".into());
        // A pool of one: the replay's hold takes it, and its effect waits for another in vain.
        config.common.database_max_connections = 1;
    })
    .await;
    let id = app.dead_letter("m-placed", "OrderPlaced", "o-1").await;

    let response = app.admin_post(&format!("/inbox/dead/{id}/retry")).await;
    assert_eq!(response.status(), 503);
    let problem: Value = response.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("stays open"),
        "{problem}"
    );
    assert_eq!(app.invoice("o-1").await, None);
    assert_eq!(app.open_letters().await, 1);
    app.stop().await;
}

/// The audit log's entries as (action, count), newest first.
fn actions(audit: &Value) -> Vec<(&str, i64)> {
    audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["action"].as_str().unwrap(),
                entry["count"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// An operator's replays of a letter not applicable yet leave it so, however many: the
/// retries `CONSUMER_MAX_RETRIES` allows are the consumer's, and a letter is never answered
/// "can never be applied" for having been replayed.
#[tokio::test]
async fn replays_never_use_up_the_consumers_retries() {
    let app = TestApp::spawn_with(|config| {
        // CONSUMER_MAX_RETRIES low, so that the test's three replays go past it.
        config.consumer.max_retries = 2;
        config.common.admin_token = Some("s3cret".into());
    })
    .await;
    let id = app
        .dead_letter("m-paid-later", "OrderPaid", "o-later")
        .await;
    for _ in 0..3 {
        let response = app.admin_post(&format!("/inbox/dead/{id}/retry")).await;
        assert_eq!(response.status(), 409, "{}", response.text().await.unwrap());
    }
    app.stop().await;
}

/// A bulk replay that fails part-way keeps what it applied before, and says so in the audit
/// log: the request answers 500, the letters applied stay closed, and the one it stopped at
/// counts as not applied.
#[tokio::test]
async fn a_bulk_replay_stopped_by_an_error_is_audited() {
    let app = TestApp::spawn_with(|config| config.common.admin_token = Some("s3cret".into())).await;
    // The payment first: it applies at the second pass, once the order is placed.
    for (id, event_type) in [("m-paid", "OrderPaid"), ("m-placed", "OrderPlaced")] {
        app.dead_letter(id, event_type, "o-1").await;
    }
    // Closing the payment's letter fails, after its effect committed.
    app.refuse(
        "BEFORE UPDATE ON inbox_dead FOR EACH ROW WHEN (NEW.message_id = 'm-paid')",
        "injected failure",
    )
    .await;
    let response = app.admin_post("/inbox/dead/retry").await;
    assert_eq!(response.status(), 500);
    let open: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM inbox_dead WHERE closed_at IS NULL")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(open, ["m-paid"]);
    let audit = app.admin("GET", "/ops/audit").await;
    let entry = &audit["items"][0];
    assert_eq!(
        (entry["action"].as_str(), entry["count"].as_i64()),
        (Some("replay"), Some(1)),
        "{audit}"
    );
    assert!(
        entry["target"]
            .as_str()
            .unwrap()
            .ends_with("(1 not applied, stopped by an error)"),
        "{audit}"
    );
    app.stop().await;
}

/// A skip and its audit row commit together, and a replay writes its row before its effect:
/// when the row cannot be written, the letter stays open and nothing is applied.
#[tokio::test]
async fn a_letter_is_not_skipped_or_replayed_without_its_audit_row() {
    let app = TestApp::spawn_with(|config| config.common.admin_token = Some("s3cret".into())).await;
    let id = app.dead_letter("m-placed", "OrderPlaced", "o-1").await;
    app.refuse(
        "BEFORE INSERT ON ops_audit FOR EACH ROW",
        "audit log unavailable",
    )
    .await;
    for path in [
        format!("/inbox/dead/{id}/skip"),
        "/inbox/dead/skip".into(),
        format!("/inbox/dead/{id}/retry"),
    ] {
        assert_eq!(app.admin_post(&path).await.status(), 500, "{path}");
        assert_eq!(app.open_letters().await, 1, "{path}");
    }
    assert_eq!(app.invoice("o-1").await, None);

    sqlx::raw_sql("DROP TRIGGER refuse ON ops_audit")
        .execute(&app.pool)
        .await
        .unwrap();
    let replayed = app.admin_post(&format!("/inbox/dead/{id}/retry")).await;
    assert_eq!(replayed.status(), 200);
    assert_eq!(app.open_letters().await, 0);
    assert_eq!(app.invoice("o-1").await, Some((100, "open".into())));
    let audit = app.admin("GET", "/ops/audit").await;
    let entries = actions(&audit);
    assert_eq!(entries, [("replay", 1)], "{audit}");
    app.stop().await;
}

/// The durable consumer is created at start-up, or updated when it exists: a changed
/// `CONSUMER_ACK_WAIT_MS` takes effect.
#[tokio::test]
async fn the_durable_consumer_is_created_or_updated() {
    use async_nats::jetstream::stream;
    let name = testing::unique("BILLING_DURABLE");
    let subjects = format!("{}.>", name.to_lowercase());
    let client = async_nats::connect(testing::nats_url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subjects.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut config = Config::from_env().unwrap().consumer;
    for ack_wait in [Duration::from_secs(30), Duration::from_secs(2)] {
        config.ack_wait = ack_wait;
        let durable = billing_service::durable::Durable::create(
            jetstream.clone(),
            &name,
            subjects.clone(),
            &config,
        )
        .await
        .unwrap();
        let info = durable.current().info().await.unwrap().clone();
        assert_eq!(info.config.ack_wait, ack_wait);
    }
    testing::delete_stream(&name).await;
}

/// A consumer billing made again from a sequence (after the broker lost messages) is kept as it
/// is at the next start: the broker refuses to change a consumer's deliver policy, so asking for
/// "all" again would stop billing from starting at all.
#[tokio::test]
async fn a_consumer_made_again_from_a_sequence_survives_a_restart() {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull};
    use async_nats::jetstream::stream;
    let name = testing::unique("BILLING_RESTART");
    let subjects = format!("{}.>", name.to_lowercase());
    let client = async_nats::connect(testing::nats_url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let handle = jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subjects.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let config = Config::from_env().unwrap().consumer;
    // As `Durable` leaves it after making the consumer again from sequence 7.
    handle
        .create_consumer(pull::Config {
            durable_name: Some(config.name.clone()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_deliver: -1,
            filter_subject: subjects.clone(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: 7 },
            ..Default::default()
        })
        .await
        .unwrap();
    let durable =
        billing_service::durable::Durable::create(jetstream.clone(), &name, subjects, &config)
            .await
            .expect("billing starts with the consumer it made again");
    let info = durable.current().info().await.unwrap().clone();
    assert_eq!(
        info.config.deliver_policy,
        DeliverPolicy::ByStartSequence { start_sequence: 7 }
    );
    testing::delete_stream(&name).await;
}

/// Publishes, straight to the stream, what a broken or hostile producer could: ids of 3 KB, with
/// a NUL and empty; a NUL in the body; a body that is not UTF-8; `ce-type` 1,000 times; bytes
/// that are not UTF-8 in a subject and in a header; a NUL in a subject.
async fn publish_hostile_list(app: &TestApp) {
    let publish_raw = |headers: HeaderMap, order_id: &str, body: Vec<u8>| {
        let subject = format!("{}.OrderPlaced.{order_id}", app.prefix);
        async {
            let mut headers = headers;
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                uuid::Uuid::new_v4().to_string().as_str(),
            );
            let ack = app
                .jetstream
                .publish_with_headers(subject, headers, body.into())
                .await
                .unwrap();
            ack.await.unwrap();
        }
    };
    let with_id = |id: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(headers::TYPE, "OrderPlaced");
        headers.insert(headers::ID, id);
        headers
    };
    let long_id = "a".repeat(3000);
    for (id, order) in [
        (long_id.as_str(), "h-long"),
        ("m\0nul", "h-nul"),
        ("", "h-empty"),
    ] {
        publish_raw(with_id(id), order, placed(order, 100)).await;
    }
    let mut body_with_nul = placed("h-body", 100);
    body_with_nul.push(0);
    publish_raw(with_id("m-body-nul"), "h-body", body_with_nul).await;
    publish_raw(with_id("m-utf8"), "h-utf8", vec![b'{', 0xff, 0xfe, b'}']).await;
    let mut repeated = with_id("m-repeated");
    for _ in 0..1000 {
        repeated.append(headers::TYPE, "OrderPlaced");
    }
    publish_raw(repeated, "h-repeated", placed("h-repeated", 100)).await;
    // What no client library lets a producer send: bytes that are not UTF-8 in the subject and
    // in a header value. nats-server keeps them; async-nats cannot read them.
    let ordinary_headers = b"ce-type: OrderPlaced\r\nce-id: m-bad-subject\r\n";
    let subject = [app.prefix.as_bytes(), b".OrderPlaced.h\xffsubject"].concat();
    publish_bytes(&subject, ordinary_headers, &placed("h-subject", 100)).await;
    let subject = format!("{}.OrderPlaced.h-header", app.prefix);
    let headers = b"ce-type: OrderPlaced\r\nce-id: m-bad\xfe-header\r\n";
    publish_bytes(subject.as_bytes(), headers, &placed("h-header", 100)).await;
    // A NUL in the subject (UTF-8, so it is delivered) of a message that is dead-lettered.
    let subject = format!("{}.OrderPlaced.h\0subject", app.prefix);
    let mut headers = with_id("m-nul-subject");
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "m-nul-subject");
    let ack = app
        .jetstream
        .publish_with_headers(subject, headers, "not json".into())
        .await
        .unwrap();
    ack.await.unwrap();
}

/// What the hostile list left is kept byte for byte: NUL-bearing header values and subjects,
/// and the messages the client could not read.
async fn assert_kept_byte_for_byte(app: &TestApp) {
    // The NUL byte is kept: the header value is stored as its bytes.
    let nul: Value =
        sqlx::query_scalar("SELECT headers->$1->0 FROM inbox_dead WHERE headers->$1->0 ? 'hex'")
            .bind(headers::ID)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(nul["hex"], "6d006e756c");
    // A NUL in the subject is kept too: shown as ␀, and byte for byte.
    let (subject, bytes): (String, Vec<u8>) = sqlx::query_as(
        "SELECT subject, subject_bytes FROM inbox_dead WHERE message_id = 'm-nul-subject'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        subject,
        format!("{}.OrderPlaced.h\u{2400}subject", app.prefix)
    );
    assert_eq!(
        bytes,
        format!("{}.OrderPlaced.h\0subject", app.prefix).as_bytes()
    );
    // What the client could not read is kept with its body and the bytes of its headers.
    let unreadable: Vec<(Value, Vec<u8>)> = sqlx::query_as(
        "SELECT headers, payload FROM inbox_dead \
         WHERE error LIKE 'the NATS client cannot read%' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(unreadable.len(), 2);
    assert_eq!(unreadable[0].1, placed("h-subject", 100));
    let raw_headers = unreadable[1].0["NATS-Raw-Headers"][0]["hex"]
        .as_str()
        .unwrap();
    assert!(
        raw_headers.contains("6d2d626164fe2d686561646572"),
        "{raw_headers}"
    );
}

/// Messages a broken or hostile producer could publish straight to the stream: each is
/// dead-lettered (kept whole, listed) instead of being applied, acked away or redelivered for
/// good, and an ordinary order published after them is invoiced.
#[tokio::test]
async fn hostile_messages_are_dead_lettered_and_nothing_loops() {
    // A message the client cannot read makes it drop its connection, and the messages delivered
    // with it come back after the ack wait: 3 s instead of the default 30 keeps the test short.
    let app = TestApp::spawn_with(|config| config.consumer.ack_wait = Duration::from_secs(3)).await;
    publish_hostile_list(&app).await;
    app.publish("m-ok", "OrderPlaced", "o-ok", placed("o-ok", 700))
        .await;

    let invoice = eventually("the ordinary order's invoice", WAIT, || async {
        app.invoice("o-ok").await
    })
    .await;
    assert_eq!(invoice, (700, "open".into()));
    // The ordinary order's ce-id reused for another order; then a true copy of it.
    app.publish("m-ok", "OrderPlaced", "h-reused", placed("h-reused", 900))
        .await;
    app.publish("m-ok", "OrderPlaced", "o-ok", placed("o-ok", 700))
        .await;
    // The bound covers several ack waits: on a busy machine the client may connect again only
    // after the next delivery of the message it cannot read.
    // Each change of the counts is printed, so that a failure shows where they stopped.
    let last = std::cell::RefCell::new(Value::Null);
    let stats = eventually("ten dead letters and the copy seen", 3 * WAIT, || async {
        let stats = app.stats().await;
        if *last.borrow() != stats {
            eprintln!("inbox stats: {stats}");
            last.replace(stats.clone());
        }
        // At least one: an ack lost with a dropped connection brings a copy back once more.
        (stats["dead"] == 10 && stats["duplicate"].as_u64() >= Some(1)).then_some(stats)
    })
    .await;
    assert_eq!(stats["processed"], 1, "{stats}");
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(invoices, 1, "no hostile message was applied");
    let reused: String =
        sqlx::query_scalar("SELECT error FROM inbox_dead WHERE message_id = 'm-ok'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(reused.contains("applied before"), "{reused}");
    assert_kept_byte_for_byte(&app).await;
    // Every message was settled: nothing is waiting for an ack or a redelivery.
    let consumer_name = Config::from_env().unwrap().consumer.name;
    let stream = app.jetstream.get_stream(&app.stream).await.unwrap();
    let settled = || async {
        let info = stream.consumer_info(&consumer_name).await.ok()?;
        (info.num_ack_pending == 0 && info.num_pending == 0).then_some(info.delivered)
    };
    let delivered = eventually("every delivery settled", WAIT, settled).await;
    // Started again, billing is delivered nothing of it: an order after the restart is the
    // only message it gets, and the dead letters stay as they were. The default ack wait
    // again, so that a slow first ack is not a second delivery.
    let mut app = app;
    app.config.consumer.ack_wait = Config::from_env().unwrap().consumer.ack_wait;
    let app = app.restart().await;
    app.publish("m-after", "OrderPlaced", "o-after", placed("o-after", 300))
        .await;
    eventually("the order after the restart", WAIT, || async {
        app.invoice("o-after").await
    })
    .await;
    let after = eventually("every delivery settled again", WAIT, settled).await;
    assert_eq!(after.consumer_sequence, delivered.consumer_sequence + 1);
    assert_eq!(app.stats().await["dead"], 10);
    app.stop().await;
}

/// Only "not applicable yet" outcomes bring a message closer to a dead letter: however often it
/// was delivered before (a long database outage, expired ack waits), an `OrderPaid` that
/// overtakes its `OrderPlaced` waits for it. With the default `CONSUMER_MAX_RETRIES`, it is
/// dead after that many not-yet outcomes, and not one earlier.
#[tokio::test]
async fn only_not_yet_outcomes_count_toward_a_dead_letter() {
    let app = TestApp::spawn().await;
    let max_retries = Config::from_env().unwrap().consumer.max_retries;
    let rules = billing_service::consumer::Rules::new(
        jetstream_outbox::Inbox::new(app.pool.clone(), "rules-test"),
        max_retries,
    );
    let message = |id: &str, event_type: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(headers::ID, id);
        headers.insert(headers::TYPE, event_type);
        headers
    };
    let (paid, placed_body) = (message("m-paid", "OrderPaid"), placed("o-wait", 250));
    for _ in 1..max_retries {
        let verdict = rules.verdict(&paid, &placed_body).await;
        assert!(
            matches!(verdict, billing_service::consumer::Verdict::Retry(_)),
            "{verdict:?}"
        );
    }
    let verdict = rules
        .verdict(&message("m-placed", "OrderPlaced"), &placed_body)
        .await;
    assert_eq!(verdict, billing_service::consumer::Verdict::Ack);
    assert_eq!(
        rules.verdict(&paid, &placed_body).await,
        billing_service::consumer::Verdict::Ack
    );

    let never = message("m-never", "OrderPaid");
    let body = placed("o-never", 1);
    for _ in 1..max_retries {
        let verdict = rules.verdict(&never, &body).await;
        assert!(
            matches!(verdict, billing_service::consumer::Verdict::Retry(_)),
            "{verdict:?}"
        );
    }
    let verdict = rules.verdict(&never, &body).await;
    assert!(
        matches!(verdict, billing_service::consumer::Verdict::Dead(_)),
        "{verdict:?}"
    );
    app.stop().await;
}

/// A message older than the inbox retention (by its producer's `ce-time`) could be a copy of
/// one whose inbox record is gone: it is dead-lettered as too old, not applied.
#[tokio::test]
async fn a_message_older_than_the_inbox_retention_is_not_applied() {
    let app = TestApp::spawn().await;
    let retention = Config::from_env().unwrap().inbox_retention;
    let old = chrono::Utc::now()
        - chrono::Duration::from_std(retention).unwrap()
        - chrono::Duration::hours(1);
    let mut headers = HeaderMap::new();
    headers.insert(headers::ID, "m-old");
    headers.insert(headers::TYPE, "OrderPlaced");
    headers.insert(headers::TIME, old.to_rfc3339().as_str());
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "m-old");
    let subject = format!("{}.OrderPlaced.o-old", app.prefix);
    let ack = app
        .jetstream
        .publish_with_headers(subject, headers, placed("o-old", 100).into())
        .await
        .unwrap();
    ack.await.unwrap();
    app.publish("m-new", "OrderPlaced", "o-new", placed("o-new", 100))
        .await;

    eventually("the young order's invoice", WAIT, || async {
        app.invoice("o-new").await
    })
    .await;
    let error: String = eventually("the dead letter", WAIT, || async {
        sqlx::query_scalar("SELECT error FROM inbox_dead WHERE message_id = 'm-old'")
            .fetch_optional(&app.pool)
            .await
            .unwrap()
    })
    .await;
    assert!(error.starts_with("too old to deduplicate"), "{error}");
    assert_eq!(app.invoice("o-old").await, None);
    app.stop().await;
}

/// A configuration changed after it was read (by a test, or a program embedding the service)
/// meets the same rules as one read from the environment: an inbox retention shorter than the
/// broker's redeliveries is refused before anything starts, naming the variable.
#[tokio::test]
async fn a_configuration_changed_after_reading_is_checked() {
    let mut config = Config::from_env().unwrap();
    // Against the rules on purpose: the refusal is the scenario.
    config.inbox_retention = config.consumer.ack_wait;
    let Err(error) = App::build(config).await else {
        panic!("an inbox retention of one ack wait was accepted");
    };
    assert!(
        error.to_string().contains("INBOX_RETENTION_MS"),
        "{error:#}"
    );
}
