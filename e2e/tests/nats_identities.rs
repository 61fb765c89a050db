//! Least privilege on the broker: nats-server runs the services' identities of
//! deploy/nats/accounts.conf (the docs' own file, with the test's names), each service logs in
//! as its own, and the whole pipeline works; a client without credentials is refused; orders'
//! identity cannot consume billing's messages or delete anything; billing's cannot publish an
//! event (so only orders-service can make billing invoice) or touch another consumer. A
//! permission withheld fails readiness naming it, and a refused publish is an outage: the event
//! waits, never dead. A damaged stream, which orders-service may not delete, waits for an
//! operator.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use e2e::cluster::{Cluster, Setup};
use e2e::eventually;
use futures::StreamExt as _;
use serde_json::json;

/// How long a refused request is given: the broker answers a permission violation with an
/// error of its own and nothing on the reply subject.
const REFUSED_WITHIN: Duration = Duration::from_secs(3);

/// How long a request that must succeed is given (a scan of the stream among them), on a
/// machine the whole cluster loads.
const ANSWERED_WITHIN: Duration = Duration::from_secs(30);

/// A JetStream context of `user` on the cluster's server, whose requests wait `timeout`.
async fn as_user(
    cluster: &Cluster,
    user: &str,
    password: &str,
    timeout: Duration,
) -> jetstream::Context {
    let client = async_nats::ConnectOptions::new()
        .user_and_password(user.into(), password.into())
        .custom_inbox_prefix(format!(
            "_INBOX.{}",
            if user == "orders" {
                "orders-service"
            } else {
                "billing-service"
            }
        ))
        .connect(cluster.nats[0].plain_url())
        .await
        .unwrap_or_else(|e| panic!("{user} logs in: {e}"));
    jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client)
}

/// Billing's identity cannot put an event on the stream, nor touch another consumer.
async fn billings_identity_is_refused(
    cluster: &Cluster,
    password: &str,
    stream: &str,
    prefix: &str,
) {
    let billing = as_user(cluster, "billing", password, REFUSED_WITHIN).await;
    let forged = async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("ce-type", "OrderPlaced");
        headers.insert("ce-id", uuid::Uuid::now_v7().to_string().as_str());
        headers.insert("ce-subject", "forged-1");
        let body =
            json!({"orderId": "forged-1", "customer": "x", "totalMinor": 1, "status": "placed"});
        billing
            .publish_with_headers(
                format!("{prefix}.OrderPlaced.forged-1"),
                headers,
                body.to_string().into(),
            )
            .await?
            .await
            .map(drop)
            .map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)
    };
    assert!(
        forged.await.is_err(),
        "billing's identity may not publish an event"
    );
    // Read again until answered: the refusals' short timeout is no bound for an answer.
    let handle = eventually("billing reads its stream", ANSWERED_WITHIN, || async {
        billing.get_stream(stream).await.ok()
    })
    .await;
    assert!(
        handle
            .create_consumer(pull::Config {
                durable_name: Some("other".into()),
                ..Default::default()
            })
            .await
            .is_err(),
        "billing's identity may not make another consumer"
    );
    assert!(
        billing.delete_stream(stream).await.is_err(),
        "billing's identity may not delete the stream"
    );
}

/// Orders' identity cannot read billing's messages, nor delete its consumer or the stream.
async fn orders_identity_is_refused(cluster: &Cluster, password: &str, stream: &str) {
    let orders = as_user(cluster, "orders", password, REFUSED_WITHIN).await;
    // Read again until answered: the refusals' short timeout is no bound for an answer.
    let handle = eventually("orders reads its stream", ANSWERED_WITHIN, || async {
        orders.get_stream(stream).await.ok()
    })
    .await;
    let stolen = async {
        let consumer: async_nats::jetstream::consumer::PullConsumer = handle
            .get_consumer("billing")
            .await
            .map_err(|e| e.to_string())?;
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(REFUSED_WITHIN, batch.next()).await {
            Ok(Some(Ok(_))) => Ok(()),
            _ => Err("nothing".to_owned()),
        }
    };
    assert!(
        stolen.await.is_err(),
        "orders' identity may not pull billing's messages"
    );
    assert!(
        handle.delete_consumer("billing").await.is_err(),
        "orders' identity may not delete billing's consumer"
    );
    assert!(
        orders.delete_stream(stream).await.is_err(),
        "orders' identity may not delete the stream"
    );
}

/// Orders' identity may look for an event in the stream, as the relay does before publishing
/// again one whose acknowledgement it missed.
async fn orders_identity_finds_a_stored_event(cluster: &Cluster, password: &str, stream: &str) {
    use jetstream_outbox::{Message, Publisher as _};
    let orders = as_user(cluster, "orders", password, ANSWERED_WITHIN).await;
    let first = orders
        .get_stream(stream)
        .await
        .expect("orders reads its stream")
        .get_raw_message(1)
        .await
        .expect("orders reads a message");
    let id = first
        .headers
        .get(async_nats::header::NATS_MESSAGE_ID)
        .and_then(|id| id.as_str().parse().ok())
        .expect("the message's id");
    let message = Message::new(
        id,
        first.subject.as_str(),
        async_nats::HeaderMap::new(),
        bytes::Bytes::new(),
    );
    let found = jetstream_outbox::JetStreamPublisher::new(orders)
        .stored(&message)
        .await
        .expect("orders may look");
    assert_eq!(found.map(|ack| ack.stream_seq), Some(1));
}

/// Orders' identity may scan its stream as the relay's repair does (through an ordered
/// consumer, made by the API subject without a consumer name) after the events it had checked.
async fn orders_identity_scans_its_stream(cluster: &Cluster, password: &str, stream: &str) {
    let orders = as_user(cluster, "orders", password, ANSWERED_WITHIN).await;
    let pool = cluster.orders_pool();
    let spec = jetstream_outbox::publisher::StreamSpec::new(
        stream,
        vec![format!("{}.>", cluster.names.prefix)],
    );
    let repair = jetstream_outbox::StreamRepair::new(orders.clone(), spec);
    repair.check(pool).await.expect("orders may check");
    // Past every position recorded (the service's relay records its own): the next check
    // has messages to read.
    eventually(
        "the stream grows past the positions checked",
        Duration::from_secs(30),
        || {
            let orders = orders.clone();
            async move {
                let checked: i64 =
                    sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM outbox_stream_checks")
                        .fetch_one(pool)
                        .await
                        .ok()?;
                let mut handle = orders.get_stream(stream).await.ok()?;
                let last = handle.info().await.ok()?.state.last_sequence;
                (last > checked.unsigned_abs()).then_some(())
            }
        },
    )
    .await;
    let report = repair.check(pool).await.expect("orders may scan");
    assert!(report.scanned > 0, "the second check scans: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_orders_service_can_make_billing_invoice() {
    let setup = Setup {
        nats_identities: Some(&[]),
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(2, false);
    load.progress(50).await;

    assert!(
        async_nats::connect(cluster.nats[0].plain_url())
            .await
            .is_err(),
        "a client without credentials is refused"
    );
    let identities = cluster.identities.clone().expect("identities");
    let stream = cluster.names.stream.clone();
    let prefix = cluster.names.prefix.clone();

    billings_identity_is_refused(&cluster, &identities.billing, &stream, &prefix).await;
    orders_identity_is_refused(&cluster, &identities.orders, &stream).await;
    orders_identity_finds_a_stored_event(&cluster, &identities.orders, &stream).await;
    orders_identity_scans_its_stream(&cluster, &identities.orders, &stream).await;

    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    let forged_invoices: i64 =
        sqlx::query_scalar("SELECT count(*) FROM invoices WHERE order_id = 'forged-1'")
            .fetch_one(
                &sqlx::PgPool::connect(&service_kit::testing::database_url(
                    &cluster.names.billing_db,
                ))
                .await
                .unwrap(),
            )
            .await
            .unwrap();
    assert_eq!(forged_invoices, 0);
    cluster.stop().await;
}

/// orders-service's identity may not publish under the prefix (the permission withheld): its
/// events wait, none dead, and `/readyz` fails naming the subject refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_permission_fails_readiness_and_makes_nothing_dead() {
    const NO_PUBLISH: &[&str] = &["\"orders.>\""];
    let setup = Setup {
        nats_identities: Some(NO_PUBLISH),
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let client = reqwest::Client::new();
    let placed = client
        .post(format!("{}/orders", cluster.orders[0].url))
        .json(&json!({"id": "o-refused", "customer": "ada", "totalMinor": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    let ready = format!("{}/readyz", cluster.orders[0].url);
    let detail = eventually(
        "/readyz to fail naming the refusal",
        Duration::from_secs(30),
        || async {
            let answer = client.get(&ready).send().await.ok()?;
            (answer.status() == 503).then_some(())?;
            let problem: serde_json::Value = answer.json().await.ok()?;
            let detail = problem["detail"].as_str()?.to_owned();
            detail.contains("ermission").then_some(detail)
        },
    )
    .await;
    assert!(detail.contains(&cluster.names.prefix), "{detail}");
    let (pending, dead): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'dead') FROM outbox",
    )
    .fetch_one(cluster.orders_pool())
    .await
    .unwrap();
    assert_eq!((pending, dead), (1, 0), "the event waits, not dead");
    cluster.stop().await;
}

/// With these identities orders-service may not delete its stream, so it cannot make a damaged
/// one again (its files removed from under the broker, as nats-server 2.9 does): it says so and
/// publishes nothing, and once an operator deletes the stream it makes it again and publishes
/// again what it held. Orders are accepted throughout; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_stream_waits_for_an_operator_to_delete_it() {
    let setup = Setup {
        nats_identities: Some(&[]),
        ..Setup::default()
    };
    let mut cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(2, false);
    load.progress(50).await;
    cluster.billing[0].kill().await;
    cluster.nats[0].remove_stream_files(&cluster.names.stream);
    load.progress(25).await;
    eventually(
        "orders-service to say it cannot delete the damaged stream",
        Duration::from_secs(120),
        || async {
            cluster.orders[0]
                .log()
                .contains("cannot delete the damaged stream")
                .then_some(())
        },
    )
    .await;

    let operator = service_kit::infra::connect_nats(&cluster.nats_url(), "operator")
        .await
        .unwrap();
    jetstream::new(operator)
        .delete_stream(&cluster.names.stream)
        .await
        .unwrap();
    cluster.billing[0].restart().await;
    load.progress(25).await;
    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}
