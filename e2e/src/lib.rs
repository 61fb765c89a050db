//! The end-to-end harness. Each test has its own databases, stream and subject prefix.
//!
//! - [`Stack`] and [`RunningApp`]: both services started in-process on port 0;
//! - [`cluster`]: the real binaries as processes with their own nats-server, for scenarios
//!   that kill and restart them;
//! - [`process`]: starting, killing and restarting those processes;
//! - [`proxy`]: a TCP proxy that loses the broker's replies (lost PubAcks);
//! - [`load`]: a steady load of orders whose outcome is always known in the end;
//! - [`identities`]: the services' identities on the broker, with a test's names;
//! - [`docs`]: the documents generated from the code (the configuration reference);
//! - [`promtool`]: Prometheus' tool, for the metrics served and the alert rules shipped;
//! - [`checker`]: lost, duplicated, unexpected, wrongly totalled and out-of-order, after a
//!   scenario drained;
//! - [`bench`](mod@bench): the benchmark behind BENCHMARKS.md's figures
//!   (`cargo run --release -p e2e --bin bench`).

pub mod bench;
pub mod checker;
pub mod cluster;
pub mod docs;
pub mod identities;
pub mod load;
pub mod process;
pub mod promtool;
pub mod proxy;

use std::time::Duration;

use service_kit::testing;
use sqlx::PgPool;

pub use service_kit::testing::eventually;

/// The stream, subject prefix and database names of one test.
#[derive(Debug, Clone)]
pub struct Names {
    /// JetStream stream.
    pub stream: String,
    /// Subject prefix.
    pub prefix: String,
    /// orders-service database.
    pub orders_db: String,
    /// billing-service database.
    pub billing_db: String,
}

impl Names {
    /// Fresh names for one test.
    pub fn unique() -> Self {
        let stream = testing::unique("E2E");
        Self {
            // What `testing::point_at` sets.
            prefix: stream.to_lowercase(),
            orders_db: testing::unique("e2e_orders"),
            billing_db: testing::unique("e2e_billing"),
            stream,
        }
    }

    /// orders-service settings for this test.
    pub fn orders_config(&self) -> orders_service::Config {
        let mut config = orders_service::Config::from_env().expect("orders config");
        testing::point_at(&mut config.common, &self.orders_db, &self.stream);
        config.relay.subject_prefix.clone_from(&self.prefix);
        config
    }

    /// billing-service settings for this test.
    pub fn billing_config(&self) -> billing_service::Config {
        let mut config = billing_service::Config::from_env().expect("billing config");
        testing::point_at(&mut config.common, &self.billing_db, &self.stream);
        // A message that cannot apply yet (its order's earlier event not applied) is retried
        // every 100 ms rather than every second, so that it applies soon after the event it
        // waits for; it is also dead-lettered ten times sooner, which is stricter, not looser.
        config.consumer.retry_delay = Duration::from_millis(100);
        config
    }

    /// Drops the databases and the stream.
    pub async fn clean_up(&self) {
        testing::drop_database(&self.orders_db).await;
        testing::drop_database(&self.billing_db).await;
        testing::delete_stream(&self.stream).await;
    }
}

/// One service running in this process.
#[derive(Debug)]
pub struct RunningApp {
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    /// Its database.
    pub pool: PgPool,
    running: testing::Running,
}

impl RunningApp {
    /// Starts orders-service.
    pub async fn orders(config: orders_service::Config) -> Self {
        let app = orders_service::App::build(config)
            .await
            .expect("orders-service starts");
        let pool = app.pool().clone();
        let running = testing::Running::spawn(app.port(), |stop| app.run_until_stopped(stop));
        Self {
            url: running.url.clone(),
            pool,
            running,
        }
    }

    /// Starts billing-service.
    pub async fn billing(config: billing_service::Config) -> Self {
        // The stream is orders-service's to make, and billing waits for it: a test that starts
        // billing first makes it as orders-service would.
        let nats = service_kit::infra::connect_nats(config.common.nats_url(), "e2e-setup")
            .await
            .expect("NATS");
        // With orders-service's retries: nats-server 2.9 may answer a creation among many at
        // once with a transient "error creating store for stream".
        service_kit::infra::ensure_stream(
            &async_nats::jetstream::new(nats),
            &service_kit::infra::stream_spec(
                &config.common,
                &service_kit::config::StreamLimits::default(),
            ),
            &service_kit::infra::Refusals::default(),
        )
        .await
        .expect("the stream made");
        let app = billing_service::App::build(config)
            .await
            .expect("billing-service starts");
        let pool = app.pool().clone();
        let running = testing::Running::spawn(app.port(), |stop| app.run_until_stopped(stop));
        Self {
            url: running.url.clone(),
            pool,
            running,
        }
    }

    /// Shuts the service down gracefully and waits for it.
    pub async fn stop(self) {
        self.running.stop().await;
    }
}

/// Both services on one stream.
#[derive(Debug)]
pub struct Stack {
    /// This test's names.
    pub names: Names,
    /// orders-service.
    pub orders: RunningApp,
    /// billing-service.
    pub billing: RunningApp,
}

impl Stack {
    /// Starts both services with fresh databases and a fresh stream.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`Stack::start`], with orders-service's settings changed by `adjust`.
    pub async fn start_with(adjust: impl FnOnce(&mut orders_service::Config)) -> Self {
        let names = Names::unique();
        let mut config = names.orders_config();
        adjust(&mut config);
        let orders = RunningApp::orders(config).await;
        let billing = RunningApp::billing(names.billing_config()).await;
        Self {
            names,
            orders,
            billing,
        }
    }

    /// Stops both services and removes the databases and the stream.
    pub async fn stop(self) {
        self.orders.stop().await;
        self.billing.stop().await;
        self.names.clean_up().await;
    }
}
