//! What a trickle of commits costs the database: one claim each, not a claim and an empty one.
//! In a test binary of its own: the counter lives in the process-wide metrics recorder.

mod common;

use std::time::Duration;

use common::{TestStream, migrate};
use jetstream_outbox::testing::eventually;
use jetstream_outbox::{NewEvent, Relay, Wakeup};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use sqlx::PgPool;

/// Twenty orders committed one at a time, each published before the next: the relay claims
/// once per commit. A partial claim took every row committed before it began, so claiming
/// again without a new commit would find nothing; only the relay's first claim, at start,
/// may. Before this was so, every commit cost an empty claim too (21 of them here).
#[sqlx::test(migrations = false)]
async fn a_trickle_of_commits_costs_a_claim_each(pool: PgPool) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let claims = |outcome: &str| {
        let prefix = format!("outbox_relay_claims_total{{outcome=\"{outcome}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let mut config = stream.relay_config();
    // The poll would add claims of its own, at its own pace; only commits should cause them.
    config.poll_interval = Duration::from_secs(600);
    let wakeup = Wakeup::in_process();
    let relay = Relay::new(pool.clone(), stream.publisher(), config).with_wakeup(&wakeup);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));

    let orders = 20;
    for i in 0..orders {
        let mut tx = pool.begin().await.unwrap();
        let event = NewEvent::new("order", format!("o{i}"), "OrderPlaced", &json!({})).unwrap();
        jetstream_outbox::enqueue(&mut tx, &event).await.unwrap();
        jetstream_outbox::commit(tx, &wakeup).await.unwrap();
        eventually(
            "the event recorded as published",
            Duration::from_secs(10),
            || async {
                let pending: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status <> 'published'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                (pending == 0).then_some(())
            },
        )
        .await;
    }
    stop.cancel();
    running.await.unwrap();

    assert_eq!(stream.contents().await.len(), orders);
    assert_eq!(claims("rows"), orders as u64);
    assert!(
        claims("empty") <= 1,
        "{} claims found nothing for {orders} commits",
        claims("empty")
    );
    stream.delete().await;
}
