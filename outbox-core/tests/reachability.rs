//! `outbox_broker_unreachable`, and the relay's [`RelayHealth`](jetstream_outbox::relay::RelayHealth),
//! follow the broker, also on a relay that has nothing left to publish. In a test binary of its own: the gauge lives in the process-wide metrics recorder.

mod common;

use std::time::Duration;

use common::{TestStream, enqueue, migrate};
use jetstream_outbox::relay::BrokerState;
use jetstream_outbox::testing::eventually;
use jetstream_outbox::testing::{Fault, FaultyPublisher};
use jetstream_outbox::{Backoff, Relay};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use sqlx::PgPool;

/// Relay A loses the broker on its event, relay B publishes that event, and A is left with
/// nothing to publish: asking the broker, A sees it is back, and the gauge returns to 0, as
/// does A's health.
#[sqlx::test(migrations = false)]
async fn an_idle_relay_notices_the_broker_is_back(pool: PgPool) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
    let gauge = || {
        metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix("outbox_broker_unreachable "))
            .map(str::to_owned)
    };
    migrate(&pool).await;
    let stream = TestStream::new().await;
    enqueue(&pool, "o1", "OrderPlaced", json!({})).await;

    let mut config = stream.relay_config();
    // A fixed pause while the broker is unreachable, so that the test does not wait for the
    // default's growth to five seconds between the checks it counts.
    config.unreachable_backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(50));
    // Every publish of A's, of this one event, finds the broker unreachable.
    let unreachable = FaultyPublisher::new(stream.publisher())
        .with_aggregate_faults("o1", [Fault::Unreachable; 1000]);
    let stop = tokio_util::sync::CancellationToken::new();
    let a = Relay::new(pool.clone(), unreachable, config.clone());
    let health = a.health();
    assert_eq!(health.broker(), BrokerState::Ok);
    let a = tokio::spawn(a.run(stop.clone()));
    eventually("A to lose the broker", Duration::from_secs(10), || async {
        (gauge()? == "1").then_some(())
    })
    .await;
    eventually("A's health to say so", Duration::from_secs(10), || async {
        (health.broker() == BrokerState::Unreachable).then_some(())
    })
    .await;

    let b = Relay::new(pool.clone(), stream.publisher(), config);
    eventually(
        "B to publish the event",
        Duration::from_secs(10),
        || async { (b.run_once().await.ok()?.published == 1).then_some(()) },
    )
    .await;
    eventually(
        "A to see the broker back",
        Duration::from_secs(10),
        || async { (gauge()? == "0").then_some(()) },
    )
    .await;
    eventually("A's health to say so", Duration::from_secs(10), || async {
        (health.broker() == BrokerState::Ok).then_some(())
    })
    .await;
    assert_eq!(stream.published().await, ["o1:OrderPlaced"]);
    stop.cancel();
    a.await.unwrap();
    stream.delete().await;
}
