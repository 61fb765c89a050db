//! orders-service over HTTP against the real PostgreSQL and nats-server.

use orders_service::orders::{self, NewOrder};
use orders_service::{App, Config};
use reqwest::StatusCode;
use serde_json::{Value, json};
use service_kit::testing::{self, Running};
use sqlx::PgPool;

struct TestApp {
    running: Running,
    pool: PgPool,
    client: reqwest::Client,
    database: String,
    stream: String,
}

impl TestApp {
    async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    async fn spawn_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let database = testing::unique("orders_test");
        let stream = testing::unique("ORDERS_TEST");
        let mut config = Config::from_env().unwrap();
        testing::point_at(&mut config.common, &database, &stream);
        config
            .relay
            .subject_prefix
            .clone_from(&config.common.subject_prefix);
        adjust(&mut config);
        let app = App::build(config).await.unwrap();
        let pool = app.pool().clone();
        let running = Running::spawn(app.port(), |stop| app.run_until_stopped(stop));
        Self {
            running,
            pool,
            client: reqwest::Client::new(),
            database,
            stream,
        }
    }

    async fn post(&self, path: &str, body: Option<Value>) -> reqwest::Response {
        let request = self.client.post(format!("{}{path}", self.running.url));
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send().await.unwrap()
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.running.url))
            .send()
            .await
            .unwrap()
    }

    async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// An app with the admin token `s3cret` and the read-only token `r34d`, no relay (it would
    /// publish the events before they are made dead), and two orders whose events were made
    /// dead by hand, the first failing with `boom`, the second with the broker's refusal.
    async fn with_two_dead_events() -> (Self, Vec<uuid::Uuid>) {
        let app = Self::spawn_with(|config| {
            config.common.admin_token = Some("s3cret".into());
            config.common.read_token = Some("r34d".into());
            config.relay_enabled = false;
        })
        .await;
        for id in ["o1", "o2"] {
            let body = json!({"id": id, "customer": "ada", "totalMinor": 5});
            assert_eq!(
                app.post("/orders", Some(body)).await.status(),
                StatusCode::CREATED
            );
        }
        let ids = sqlx::query_scalar(
            "UPDATE outbox SET status = 'dead', attempts = 10, last_error = CASE \
             WHEN seq = (SELECT min(seq) FROM outbox) THEN 'boom' \
             ELSE 'message size exceeds maximum allowed' END RETURNING id",
        )
        .fetch_all(&app.pool)
        .await
        .unwrap();
        (app, ids)
    }

    /// Makes every insert into `table` fail with `message` (trigger `refuse`).
    async fn refuse_inserts(&self, table: &str, message: &str) {
        let sql = format!(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION '{message}'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION refuse();"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn stop(self) {
        self.running.stop().await;
        testing::drop_database(&self.database).await;
        testing::delete_stream(&self.stream).await;
    }
}

/// Asserts an RFC 9457 body with this status (and field, when given); returns it.
async fn problem(response: reqwest::Response, status: u16, field: Option<&str>) -> Value {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"].is_string() && body["title"].is_string() && body["detail"].is_string());
    if let Some(field) = field {
        assert_eq!(body["field"], field, "{body}");
    }
    body
}

#[tokio::test]
async fn failure_before_commit_leaves_neither_order_nor_event() {
    let app = TestApp::spawn().await;
    // The outbox insert fails after the order row was written in the same transaction.
    app.refuse_inserts("outbox", "injected failure: secret detail")
        .await;

    let order = NewOrder {
        id: Some("o1".into()),
        customer: "ada".into(),
        total_minor: 100,
    };
    assert!(
        orders::place(
            &mut app.pool.acquire().await.unwrap(),
            &jetstream_outbox::Wakeup::in_process(),
            order.validate().unwrap(),
            None
        )
        .await
        .is_err()
    );
    let response = app
        .post(
            "/orders",
            Some(json!({"customer": "ada", "totalMinor": 100})),
        )
        .await;
    let body = problem(response, 500, None).await;
    assert!(
        !body.to_string().contains("secret"),
        "500 leaks its cause: {body}"
    );

    assert_eq!(
        (app.count("orders").await, app.count("outbox").await),
        (0, 0)
    );
    let stats: Value = app.get("/outbox/stats").await.json().await.unwrap();
    assert_eq!(stats["pending"], 0, "{stats}");
    assert!(
        stats.get("walLagBytes").is_none() && stats.get("walLagSeconds").is_none(),
        "no slot, no lag: {stats}"
    );
    assert_eq!(stats["broker"], "ok", "its relay sees the broker: {stats}");
    app.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_problem_json_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let cases = [
        (
            json!({"customer": "", "totalMinor": 1}),
            422,
            Some("customer"),
        ),
        (
            json!({"customer": "ada", "totalMinor": 0}),
            422,
            Some("totalMinor"),
        ),
        (
            json!({"customer": "ada", "totalMinor": -5}),
            422,
            Some("totalMinor"),
        ),
        (
            json!({"id": "a.b", "customer": "ada", "totalMinor": 1}),
            422,
            Some("id"),
        ),
        (
            json!({"id": "x>", "customer": "ada", "totalMinor": 1}),
            422,
            Some("id"),
        ),
        (
            json!({"customer": "ada", "totalMinor": 1, "extra": true}),
            422,
            None,
        ),
        (json!({"customer": "ada", "totalMinor": 1.5}), 422, None),
        (json!({"customer": "ada", "totalMinor": 1e30}), 422, None),
        (json!({"customer": "ada"}), 422, None),
    ];
    for (body, status, field) in cases {
        problem(app.post("/orders", Some(body)).await, status, field).await;
    }

    let url = format!("{}/orders", app.running.url);
    let malformed = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body("{");
    problem(malformed.send().await.unwrap(), 400, None).await;
    let text = app
        .client
        .post(&url)
        .header("content-type", "text/plain")
        .body("{}");
    problem(text.send().await.unwrap(), 415, None).await;
    let huge = format!(
        r#"{{"customer": "{}", "totalMinor": 1}}"#,
        "x".repeat(100_000)
    );
    let too_large = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body(huge);
    problem(too_large.send().await.unwrap(), 413, None).await;
    problem(app.get("/orders?limit=0").await, 422, Some("limit")).await;
    problem(
        app.get("/orders?cursor=nonsense").await,
        422,
        Some("cursor"),
    )
    .await;
    problem(app.get("/nowhere").await, 404, None).await;

    assert_eq!(
        (app.count("orders").await, app.count("outbox").await),
        (0, 0)
    );
    app.stop().await;
}

#[tokio::test]
async fn idempotent_post_and_lifecycle_transitions() {
    let app = TestApp::spawn().await;
    let body = json!({"id": "o1", "customer": "ada", "totalMinor": 700});
    let created = app.post("/orders", Some(body.clone())).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let order: Value = created.json().await.unwrap();
    let again = app.post("/orders", Some(body)).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.unwrap(), order);
    let different = json!({"id": "o1", "customer": "ada", "totalMinor": 701});
    problem(app.post("/orders", Some(different)).await, 409, None).await;

    problem(app.post("/orders/o1/ship", None).await, 409, None).await;
    let paid: Value = app.post("/orders/o1/pay", None).await.json().await.unwrap();
    assert_eq!(paid["status"], "paid");
    problem(app.post("/orders/o1/pay", None).await, 409, None).await;
    let shipped: Value = app
        .post("/orders/o1/ship", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(shipped["status"], "shipped");
    problem(app.post("/orders/nope/pay", None).await, 404, None).await;
    problem(app.get("/orders/nope").await, 404, None).await;
    let fetched: Value = app.get("/orders/o1").await.json().await.unwrap();
    assert_eq!(fetched["status"], "shipped");

    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event_type FROM outbox_events WHERE aggregate_id = 'o1' ORDER BY seq",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(events, ["OrderPlaced", "OrderPaid", "OrderShipped"]);
    app.stop().await;
}

/// PostgreSQL's text cannot hold U+0000: a request carrying one is refused, never a 500.
#[tokio::test]
async fn a_nul_character_is_refused_with_a_problem() {
    let app = TestApp::spawn().await;
    for response in [
        app.get("/orders/a%00b").await,
        app.post("/orders/a%00b/pay", None).await,
    ] {
        let body = problem(response, 422, None).await;
        assert!(
            body["detail"].as_str().unwrap().contains("U+0000"),
            "{body}"
        );
    }
    // A body's values are checked before they reach the database.
    let body = json!({"id": "o-nul", "customer": "a\u{0}b", "totalMinor": 1});
    problem(app.post("/orders", Some(body)).await, 422, Some("customer")).await;
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(orders, 0);
    app.stop().await;
}

#[tokio::test]
async fn list_pages_newest_first() {
    let app = TestApp::spawn().await;
    for i in 0..5 {
        let body = json!({"id": format!("o{i}"), "customer": "ada", "totalMinor": 1 + i});
        assert_eq!(
            app.post("/orders", Some(body)).await.status(),
            StatusCode::CREATED
        );
    }
    let mut seen = Vec::new();
    let mut path = "/orders?limit=2".to_owned();
    loop {
        let page: Value = app.get(&path).await.json().await.unwrap();
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["id"].as_str().unwrap().to_owned()),
        );
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/orders?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["o4", "o3", "o2", "o1", "o0"]);
    let status: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(status["status"], "ok");
    app.stop().await;
}

#[tokio::test]
async fn admin_endpoints_need_the_token_and_retry_or_skip_dead_events() {
    let (app, ids) = TestApp::with_two_dead_events().await;
    let stats: Value = app.get("/outbox/stats").await.json().await.unwrap();
    assert!(
        stats.get("broker").is_none(),
        "no relay, no broker: {stats}"
    );

    let url = format!("{}/outbox/dead", app.running.url);
    problem(app.client.get(&url).send().await.unwrap(), 401, None).await;
    problem(
        app.client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap(),
        401,
        None,
    )
    .await;
    let page: Value = app
        .client
        .get(&url)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2, "{page}");
    assert_eq!(page["items"][0]["lastError"], "boom");

    let admin = |path: String| {
        app.client
            .post(format!("{}{path}", app.running.url))
            .bearer_auth("s3cret")
    };
    let retried = admin(format!("/outbox/dead/{}/retry", ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    let skipped = admin(format!("/outbox/dead/{}/skip", ids[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);
    problem(
        admin(format!("/outbox/dead/{}/skip", ids[1]))
            .send()
            .await
            .unwrap(),
        404,
        None,
    )
    .await;
    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox_events ORDER BY seq")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(statuses, ["pending", "skipped"]);

    app.stop().await;

    let without_token = TestApp::spawn().await;
    let url = format!("{}/outbox/dead", without_token.running.url);
    problem(
        without_token
            .client
            .get(&url)
            .bearer_auth("anything")
            .send()
            .await
            .unwrap(),
        403,
        None,
    )
    .await;
    without_token.stop().await;
}

/// Retry and skip in bulk take the dead events their filter matches, and nothing twice.
#[tokio::test]
async fn bulk_admin_actions_take_the_dead_events_a_filter_matches() {
    let (app, _) = TestApp::with_two_dead_events().await;
    let admin = |path: String| {
        app.client
            .post(format!("{}{path}", app.running.url))
            .bearer_auth("s3cret")
    };
    let bulk = |path: &'static str| async move {
        let response = admin(path.into()).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json::<Value>().await.unwrap()["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        bulk("/outbox/dead/retry?errorContains=size%20exceeds").await,
        1
    );
    assert_eq!(
        bulk("/outbox/dead/retry?errorContains=size%20exceeds").await,
        0
    );
    assert_eq!(bulk("/outbox/dead/skip?eventType=OrderPaid").await, 0);
    assert_eq!(bulk("/outbox/dead/skip?aggregateType=order").await, 1);
    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox_events ORDER BY seq")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(statuses, ["skipped", "pending"]);
    problem(
        admin("/outbox/dead/retry?aggregateType=a.b".into())
            .send()
            .await
            .unwrap(),
        422,
        Some("aggregateType"),
    )
    .await;
    problem(
        admin("/outbox/dead/skip?errorContains=".into())
            .send()
            .await
            .unwrap(),
        422,
        Some("errorContains"),
    )
    .await;
    // A time without its offset is ambiguous: refused, not read as some zone's.
    problem(
        admin("/outbox/dead/skip?since=2026-12-06T09:00:00".into())
            .send()
            .await
            .unwrap(),
        422,
        Some("since"),
    )
    .await;
    problem(
        app.client
            .post(format!("{}/outbox/dead/skip", app.running.url))
            .send()
            .await
            .unwrap(),
        401,
        None,
    )
    .await;
    app.stop().await;
}

/// The read-only token lists dead events and the audit log but may not act; every action the
/// admin token takes is in the audit log, newest first, with the token's name and the count.
#[tokio::test]
async fn the_read_only_token_reads_and_every_action_is_audited() {
    let (app, ids) = TestApp::with_two_dead_events().await;
    let get = |path: &str, token: &str| {
        app.client
            .get(format!("{}{path}", app.running.url))
            .bearer_auth(token)
            .send()
    };
    let post = |path: String, token: &str| {
        app.client
            .post(format!("{}{path}", app.running.url))
            .bearer_auth(token)
            .send()
    };
    let listed: Value = get("/outbox/dead", "r34d")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");
    let refused = post(format!("/outbox/dead/{}/retry", ids[0]), "r34d")
        .await
        .unwrap();
    let refused = problem(refused, 403, None).await;
    assert!(
        refused["detail"].as_str().unwrap().contains("read-only"),
        "{refused}"
    );
    problem(
        post("/outbox/dead/skip".into(), "r34d").await.unwrap(),
        403,
        None,
    )
    .await;
    assert_eq!(app.count("outbox WHERE status = 'dead'").await, 2);

    let retried = post(format!("/outbox/dead/{}/retry", ids[0]), "s3cret")
        .await
        .unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    let skipped = post("/outbox/dead/skip?errorContains=size".into(), "s3cret")
        .await
        .unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);

    problem(get("/ops/audit", "wrong").await.unwrap(), 401, None).await;
    let audit: Value = get("/ops/audit", "r34d")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries: Vec<(String, String, String, i64)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["actor"].as_str().unwrap().to_owned(),
                entry["action"].as_str().unwrap().to_owned(),
                entry["target"].as_str().unwrap().to_owned(),
                entry["count"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            (
                "admin".into(),
                "skip".into(),
                "errorContains=size".into(),
                1
            ),
            (
                "admin".into(),
                "retry".into(),
                format!("event {}", ids[0]),
                1
            ),
        ]
    );
    app.stop().await;
}

/// An action and its audit row commit together: when the row cannot be written, the action is
/// not taken either, so the log never misses an action that was.
#[tokio::test]
async fn an_action_the_audit_log_cannot_record_is_not_taken() {
    let (app, ids) = TestApp::with_two_dead_events().await;
    app.refuse_inserts("ops_audit", "audit log unavailable")
        .await;
    let post = |path: String| {
        app.client
            .post(format!("{}{path}", app.running.url))
            .bearer_auth("s3cret")
            .send()
    };
    for path in [
        format!("/outbox/dead/{}/retry", ids[0]),
        format!("/outbox/dead/{}/skip", ids[0]),
        "/outbox/dead/retry".into(),
        "/outbox/dead/skip".into(),
    ] {
        let refused = problem(post(path.clone()).await.unwrap(), 500, None).await;
        assert!(
            !refused["detail"]
                .as_str()
                .unwrap()
                .contains("audit log unavailable"),
            "{path}: {refused}"
        );
        assert_eq!(app.count("outbox WHERE status = 'dead'").await, 2, "{path}");
    }
    assert_eq!(app.count("ops_audit").await, 0);

    sqlx::raw_sql("DROP TRIGGER refuse ON ops_audit")
        .execute(&app.pool)
        .await
        .unwrap();
    let skipped = post(format!("/outbox/dead/{}/skip", ids[0])).await.unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);
    assert_eq!(app.count("outbox WHERE status = 'dead'").await, 1);
    assert_eq!(app.count("ops_audit").await, 1);
    app.stop().await;
}

#[tokio::test]
async fn overload_is_answered_503_at_once_not_queued() {
    let app = TestApp::spawn_with(|config| {
        config.common.http_max_concurrency = 1;
        // The stuck request is cut off after 3 s rather than the default 10: the timeout's
        // answer is what is tested, not its length.
        config.common.http_timeout = std::time::Duration::from_secs(3);
    })
    .await;
    // Holds the only request slot: GET /orders waits on this lock.
    let mut lock = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let stuck = tokio::spawn(app.client.get(format!("{}/orders", app.running.url)).send());

    let shed = testing::eventually(
        "a request to be shed",
        std::time::Duration::from_secs(10),
        || async {
            let response = app.get("/healthz").await;
            (response.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(response)
        },
    )
    .await;
    let body = problem(shed, 503, None).await;
    assert!(
        body["detail"].as_str().unwrap().contains("overloaded"),
        "{body}"
    );
    // The stuck request is cut off by the timeout instead of waiting for the lock.
    problem(stuck.await.unwrap().unwrap(), 503, None).await;
    lock.rollback().await.unwrap();
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    app.stop().await;
}

/// A database with no connection to give is a condition a client retries: 503, as the
/// OpenAPI document says, never 500.
#[tokio::test]
async fn a_pool_with_no_free_connection_answers_503() {
    // A pool of one, so that the test can hold all of it (the relay's connections are its own).
    let app = TestApp::spawn_with(|config| config.common.database_max_connections = 1).await;
    let held = app.pool.acquire().await.unwrap();
    let response = app
        .post(
            "/orders",
            Some(json!({"customer": "ada", "totalMinor": 100})),
        )
        .await;
    let body = problem(response, 503, None).await;
    assert!(
        body["detail"].as_str().unwrap().contains("database"),
        "{body}"
    );
    drop(held);
    app.stop().await;
}

#[tokio::test]
async fn the_relay_publishes_while_requests_hold_every_connection_of_the_pool() {
    // A small pool (the default is 20), so that the test can hold all of it.
    let app = TestApp::spawn_with(|config| config.common.database_max_connections = 2).await;
    // Every connection the service's pool will give.
    let mut held = Vec::new();
    while let Ok(Ok(conn)) =
        tokio::time::timeout(std::time::Duration::from_secs(1), app.pool.acquire()).await
    {
        held.push(conn);
    }
    assert!(!held.is_empty());
    // An event committed by another process, relayed by the poll.
    let other = PgPool::connect(&testing::database_url(&app.database))
        .await
        .unwrap();
    let mut tx = other.begin().await.unwrap();
    let event = jetstream_outbox::NewEvent::new("order", "o1", "OrderPlaced", &json!({})).unwrap();
    let id = jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();

    testing::eventually(
        "the event published",
        std::time::Duration::from_secs(20),
        || async {
            let status: String =
                sqlx::query_scalar("SELECT status FROM outbox_events WHERE id = $1")
                    .bind(id)
                    .fetch_one(&other)
                    .await
                    .unwrap();
            (status == "published").then_some(())
        },
    )
    .await;
    drop(held);
    other.close().await;
    app.stop().await;
}

/// Each person's token of `OPS_TOKENS_FILE` acts, or only reads, under its name: the audit log
/// says who acted, beside the admin token's actions.
#[tokio::test]
async fn a_named_token_acts_under_its_name_and_a_named_reader_cannot_act() {
    let file = std::env::temp_dir().join(format!("orders-ops-tokens-{}", uuid::Uuid::new_v4()));
    std::fs::write(
        &file,
        "# who  role   token\nada     admin  ada-0123456789abcdef\ngrafana read   gra-0123456789abcdef\n",
    )
    .unwrap();
    let path = file.to_str().unwrap().to_owned();
    let tokens = service_kit::ops_tokens::OpsTokens::read(&path).unwrap();
    let app = TestApp::spawn_with(|config| {
        config.common.admin_token = Some("s3cret".into());
        config.common.ops_tokens_file = Some(service_kit::config::OpsTokensFile { path, tokens });
        // No relay: it would publish the events before they are made dead below.
        config.relay_enabled = false;
    })
    .await;
    std::fs::remove_file(&file).unwrap();
    for id in ["o1", "o2"] {
        let body = json!({"id": id, "customer": "ada", "totalMinor": 5});
        assert_eq!(
            app.post("/orders", Some(body)).await.status(),
            StatusCode::CREATED
        );
    }
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "WITH dead AS (UPDATE outbox SET status = 'dead' RETURNING seq, id) \
         SELECT id FROM dead ORDER BY seq",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let post = |path: String, token: &str| {
        app.client
            .post(format!("{}{path}", app.running.url))
            .bearer_auth(token)
            .send()
    };
    let refused = post(
        format!("/outbox/dead/{}/skip", ids[0]),
        "gra-0123456789abcdef",
    )
    .await
    .unwrap();
    problem(refused, 403, None).await;
    let skipped = post(
        format!("/outbox/dead/{}/skip", ids[0]),
        "ada-0123456789abcdef",
    )
    .await
    .unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);
    let skipped = post(format!("/outbox/dead/{}/skip", ids[1]), "s3cret")
        .await
        .unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);

    let audit: Value = app
        .client
        .get(format!("{}/ops/audit", app.running.url))
        .bearer_auth("gra-0123456789abcdef")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actors: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["actor"].as_str().unwrap())
        .collect();
    assert_eq!(actors, ["admin", "ada"], "{audit}");
    app.stop().await;
}

/// `RELAY_WAL_SLOT`: an event another application enqueued with SQL, telling no relay, is
/// published at once, though the relay polls only hourly here (`RELAY_POLL_INTERVAL_MS`) so
/// that nothing but the slot can wake it in time.
#[tokio::test]
async fn a_wal_slot_wakes_the_relay_for_another_applications_commit() {
    let slot = testing::unique("orders_wal").to_lowercase();
    let app = TestApp::spawn_with(|config| {
        config.relay_wal_slot = Some(slot.clone());
        config.relay.poll_interval = std::time::Duration::from_secs(3600);
    })
    .await;
    let slot = jetstream_outbox::testing::SlotGuard::new(&app.pool.connect_options(), &slot);
    let limit = std::time::Duration::from_secs(10);
    jetstream_outbox::testing::slot_streamed_by(&app.pool, slot.name()).await;
    let nats = async_nats::jetstream::new(async_nats::connect(testing::nats_url()).await.unwrap());
    let published = |count: u64| {
        let nats = nats.clone();
        let stream = app.stream.clone();
        async move {
            testing::eventually("the events published", limit, || async {
                let mut stream = nats.get_stream(&stream).await.ok()?;
                (stream.info().await.ok()?.state.messages == count).then_some(())
            })
            .await;
        }
    };
    // An order of its own first: once it is published, the relay's first pass is over.
    let placed = app
        .post(
            "/orders",
            Some(json!({"customer": "ada", "totalMinor": 100})),
        )
        .await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    published(1).await;
    sqlx::query(
        "SELECT outbox_enqueue(gen_random_uuid(), 'order', 'o-elsewhere', 'OrderPlaced', \
         '{\"orderId\": \"o-elsewhere\"}')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    published(2).await;
    let stats: Value = app.get("/outbox/stats").await.json().await.unwrap();
    assert!(
        stats["walLagBytes"].is_i64() && stats["walLagSeconds"].is_number(),
        "the slot's lag: {stats}"
    );
    let database = app.database.clone();
    app.running.stop().await;
    drop(slot);
    testing::drop_database(&database).await;
    testing::delete_stream(&app.stream).await;
}

/// A configuration changed after it was read (by a test, or a program embedding the service)
/// meets the same rules as one read from the environment: a lease too short for a publish
/// timeout is refused before anything starts, naming the variable.
#[tokio::test]
async fn a_configuration_changed_after_reading_is_checked() {
    let mut config = Config::from_env().unwrap();
    // Against the rules on purpose: the refusal is the scenario.
    config.relay.lease = config.publish_timeout;
    let Err(error) = App::build(config).await else {
        panic!("a lease of one publish timeout was accepted");
    };
    assert!(error.to_string().contains("RELAY_LEASE_MS"), "{error:#}");
}
