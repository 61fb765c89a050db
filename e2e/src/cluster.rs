//! The system as separate processes: its own nats-server, the service binaries, and the
//! databases and stream of one test.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jetstream_outbox::testing::SlotGuard;
use service_kit::testing::{self, eventually};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Names;
use crate::checker::{self, Report, Sources};
use crate::identities::Identities;
use crate::load::{Ledger, Load};
use crate::process::{Kind, NatsServer, PgServer, Service};
use crate::proxy::Proxy;

/// What orders-service logs when it deletes the stream as damaged, as
/// `jetstream_outbox::StreamRepair` words it.
const DELETED_AS_DAMAGED: &str = "deleted the damaged stream";

/// nats-server, orders-service and billing-service instances of one scenario.
#[derive(Debug)]
pub struct Cluster {
    /// Databases, stream and prefix.
    pub names: Names,
    /// Logs and the NATS store live here.
    pub dir: PathBuf,
    /// The scenario's own nats-server, or the nodes of its NATS cluster.
    pub nats: Vec<NatsServer>,
    /// orders-service instances.
    pub orders: Vec<Service>,
    /// billing-service instances.
    pub billing: Vec<Service>,
    /// The replication slot the orders-service instances share, when started with one;
    /// after the services, so that they have ended when a panicking test drops it.
    slot: Option<SlotGuard>,
    /// Between orders-service and nats-server, when started with one.
    pub proxy: Option<Proxy>,
    /// The scenario's own PostgreSQL, when started with one.
    pub postgres: Option<PgServer>,
    info_logs: bool,
    env: &'static [(&'static str, &'static str)],
    /// The services' identities on the broker, when it requires them.
    pub identities: Option<Identities>,
    stream_replicas: usize,
    orders_pool: PgPool,
    billing_pool: PgPool,
}

impl Cluster {
    /// Starts nats-server, then `orders` orders-service and `billing` billing-service
    /// processes.
    pub async fn start(orders: usize, billing: usize) -> Self {
        Self::start_with(orders, billing, Setup::default()).await
    }

    /// Like [`Cluster::start`], with the [`Setup`] a scenario needs for its faults.
    pub async fn start_with(orders: usize, billing: usize, setup: Setup) -> Self {
        let names = Names::unique();
        let dir = std::env::temp_dir().join(testing::unique("e2e"));
        std::fs::create_dir_all(&dir).expect("scenario dir");
        let credentials = setup
            .nats_auth
            .then(|| ("orders-app".to_owned(), testing::unique("pw")));
        let identities = setup
            .nats_identities
            .map(|without| Identities::for_test(&names, "billing", without));
        let nats = if setup.nats_cluster {
            NatsServer::start_cluster(&dir, 3).await
        } else if let Some(max_file) = setup.account_storage {
            let credentials = ("app".to_owned(), testing::unique("pw"));
            let config = account_config(&credentials, max_file);
            vec![NatsServer::start_with_config(&dir, config, Vec::new(), Some(credentials)).await]
        } else if let Some(identities) = &identities {
            let operator = ("operator".to_owned(), identities.operator.clone());
            let config = identities.config.clone();
            vec![
                NatsServer::start_with_config(
                    &dir,
                    config,
                    identities.server_env(),
                    Some(operator),
                )
                .await,
            ]
        } else {
            vec![NatsServer::start_with(&dir, credentials).await]
        };
        let proxy = if setup.proxy {
            Some(Proxy::start(nats[0].port).await)
        } else {
            None
        };
        let postgres = if setup.postgres_tls {
            let tls = crate::process::TlsFiles::generate(&dir.join("pg-tls"));
            Some(PgServer::start_tls(&dir, &tls).await)
        } else if setup.own_postgres {
            Some(PgServer::start(&dir).await)
        } else {
            None
        };
        let url = |name: &str| {
            postgres
                .as_ref()
                .map_or_else(|| testing::database_url(name), |pg| pg.database_url(name))
        };
        let slot = setup.wal_slot.then(|| {
            let options = url(&names.orders_db).parse().expect("url");
            SlotGuard::new(&options, &testing::unique("e2e_slot"))
        });
        let mut cluster = Self {
            slot,
            proxy,
            orders_pool: PgPool::connect_lazy(&url(&names.orders_db)).expect("url"),
            billing_pool: PgPool::connect_lazy(&url(&names.billing_db)).expect("url"),
            postgres,
            info_logs: setup.info_logs,
            env: setup.env,
            identities,
            stream_replicas: nats.len(),
            names,
            dir,
            nats,
            orders: Vec::new(),
            billing: Vec::new(),
        };
        for _ in 0..orders {
            cluster.start_orders().await;
        }
        for _ in 0..billing {
            let service =
                Service::start(Kind::Billing, cluster.env(Kind::Billing), &cluster.dir).await;
            cluster.billing.push(service);
        }
        // Billing has migrated its database; no message was applied yet.
        checker::log_applications(&cluster.billing_pool).await;
        cluster
    }

    /// Starts one more orders-service instance, as the first ones were started.
    pub async fn start_orders(&mut self) {
        let mut env = self.env(Kind::Orders);
        if let Some(proxy) = &self.proxy {
            env.retain(|(k, _)| k != "NATS_URL");
            env.push(("NATS_URL".into(), proxy.url()));
        }
        let service = Service::start(Kind::Orders, env, &self.dir).await;
        self.orders.push(service);
    }

    /// The environment of a service process in this cluster.
    fn env(&self, kind: Kind) -> Vec<(String, String)> {
        let database = match kind {
            Kind::Orders => &self.names.orders_db,
            Kind::Billing => &self.names.billing_db,
        };
        let database_url = self.postgres.as_ref().map_or_else(
            || testing::database_url(database),
            |pg| pg.database_url(database),
        );
        let (nats_url, identity) = match &self.identities {
            // Each service as itself, with a URL that holds no one's credentials.
            Some(identities) => (
                self.nats
                    .iter()
                    .map(NatsServer::plain_url)
                    .collect::<Vec<_>>()
                    .join(","),
                Some(match kind {
                    Kind::Orders => ("orders", identities.orders.clone()),
                    Kind::Billing => ("billing", identities.billing.clone()),
                }),
            ),
            None => (self.nats_url(), None),
        };
        let mut env = vec![
            (
                "RUST_LOG",
                if self.info_logs { "info" } else { "warn" }.to_owned(),
            ),
            ("DATABASE_URL", database_url),
            ("NATS_URL", nats_url),
            ("NATS_STREAM", self.names.stream.clone()),
            ("NATS_SUBJECT_PREFIX", self.names.prefix.clone()),
        ];
        // orders-service makes the stream.
        if matches!(kind, Kind::Orders) {
            env.push(("NATS_STREAM_REPLICAS", self.stream_replicas.to_string()));
        }
        if let Some((user, password)) = identity {
            env.push(("NATS_USER", user.to_owned()));
            env.push(("NATS_PASSWORD", password));
        }
        // Off by default: only the scenarios about the WAL wake-up turn it on, to run their
        // faults with it too.
        if let (Some(slot), Kind::Orders) = (&self.slot, kind) {
            env.push(("RELAY_WAL_SLOT", slot.name().to_owned()));
        }
        // Both services run their defaults: outages, lost acks and kills must not need
        // tuning. A SIGKILLed billing's unacknowledged messages come back after the default
        // 30 s ack wait, inside the checker's two minutes. A scenario that changes a setting
        // names it in its Setup, with why.
        env.into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .chain(
                self.env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            )
            .collect()
    }

    /// Every NATS server's URL, comma-separated, as `NATS_URL` takes them.
    pub fn nats_url(&self) -> String {
        let urls: Vec<String> = self.nats.iter().map(NatsServer::url).collect();
        urls.join(",")
    }

    /// The index in [`Cluster::nats`] of the server that leads the stream now.
    pub async fn stream_leader(&self) -> usize {
        let client = service_kit::infra::connect_nats(&self.nats_url(), "e2e")
            .await
            .expect("NATS");
        let jetstream = async_nats::jetstream::new(client);
        eventually("a stream leader", Duration::from_secs(30), || async {
            let mut stream = jetstream.get_stream(&self.names.stream).await.ok()?;
            let info = stream.info().await.ok()?;
            assert_eq!(info.config.num_replicas, self.nats.len(), "stream replicas");
            let leader = info.cluster.clone()?.leader?;
            self.nats
                .iter()
                .position(|node| node.node.as_ref().is_some_and(|n| n.name == leader))
        })
        .await
    }

    /// Starts a steady load against every orders-service instance.
    pub fn load(&self, workers: usize, hostile: bool) -> RunningLoad {
        let ledger = Arc::new(Ledger::default());
        let stop = CancellationToken::new();
        let load = Load {
            orders: self.orders.iter().map(|s| s.url.clone()).collect(),
            workers,
            hostile,
            run: testing::unique("o"),
        };
        let task = tokio::spawn(load.run(ledger.clone(), stop.clone()));
        RunningLoad { ledger, stop, task }
    }

    /// Waits until the system drained, then runs the checker.
    pub async fn check(&self, ledger: &Ledger) -> Report {
        let sources = Sources {
            orders: &self.orders_pool,
            billing: &self.billing_pool,
            nats_url: self.nats_url(),
            stream: &self.names.stream,
        };
        let mut report = checker::check(&sources, ledger).await;
        report.streams_deleted_as_damaged = self
            .orders
            .iter()
            .map(|orders| orders.log().matches(DELETED_AS_DAMAGED).count())
            .sum();
        report
    }

    /// Waits until the relays failed `publishes` publishes in all (`outbox_publish_failures_total`
    /// of every orders-service instance): the fault reached them.
    pub async fn relay_failed(&self, publishes: u64) {
        self.orders_counted("outbox_publish_failures_total", publishes)
            .await;
    }

    /// Waits until `counter`, summed over every orders-service instance, reaches `at_least`.
    pub async fn orders_counted(&self, counter: &str, at_least: u64) {
        self.orders_summed(counter, &format!("{counter} at {at_least}"), |sum| {
            sum >= at_least
        })
        .await;
    }

    /// Waits until `metric`, summed over every orders-service instance, is `wanted`; `what`
    /// names the wait.
    pub async fn orders_summed(&self, metric: &str, what: &str, wanted: impl Fn(u64) -> bool) {
        let client = reqwest::Client::new();
        let prefix = format!("{metric} ");
        eventually(what, Duration::from_secs(120), || async {
            let mut sum = 0;
            for orders in &self.orders {
                let metrics = client
                    .get(format!("{}/metrics", orders.url))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                sum += metrics
                    .lines()
                    .find_map(|l| l.strip_prefix(&prefix))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .unwrap_or(0);
            }
            wanted(sum).then_some(())
        })
        .await;
    }

    /// The orders-service instance streaming the replication slot, once exactly one says so
    /// (`outbox_wal_streaming` of its `/metrics`); an instance that does not answer (killed)
    /// streams nothing.
    pub async fn orders_streaming(&self) -> usize {
        let client = reqwest::Client::new();
        let what = "exactly one orders-service instance streaming the slot";
        eventually(what, Duration::from_secs(60), || async {
            let mut streaming = Vec::new();
            for (index, orders) in self.orders.iter().enumerate() {
                let answer = client
                    .get(format!("{}/metrics", orders.url))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                let Ok(metrics) = answer else { continue };
                let metrics = metrics.text().await.ok()?;
                let gauge = metrics
                    .lines()
                    .find_map(|l| l.strip_prefix("outbox_wal_streaming "));
                if gauge.map(str::trim) == Some("1") {
                    streaming.push(index);
                }
            }
            match streaming[..] {
                [one] => Some(one),
                _ => None,
            }
        })
        .await
    }

    /// Waits until every orders-service instance's relay sees the broker as `wanted`
    /// (`broker` in `GET /outbox/stats`: `ok`, `unreachable`, `stream damaged`...).
    pub async fn orders_see_the_broker(&self, wanted: &str) {
        let client = reqwest::Client::new();
        let what = format!("every relay to see the broker {wanted}");
        eventually(&what, Duration::from_secs(120), || async {
            for orders in &self.orders {
                let stats: serde_json::Value = client
                    .get(format!("{}/outbox/stats", orders.url))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                (stats["broker"] == wanted).then_some(())?;
            }
            Some(())
        })
        .await;
    }

    /// Waits until the relays have published every event committed so far.
    pub async fn all_published(&self) {
        eventually("every event published", Duration::from_secs(60), || async {
            let pending: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'pending'")
                    .fetch_one(&self.orders_pool)
                    .await
                    .ok()?;
            (pending == 0).then_some(())
        })
        .await;
    }

    /// The replication slot of [`Setup::wal_slot`].
    pub fn wal_slot(&self) -> Option<&str> {
        self.slot.as_ref().map(SlotGuard::name)
    }

    /// The orders database, for scenario-specific checks and set-ups.
    pub fn orders_pool(&self) -> &PgPool {
        &self.orders_pool
    }

    /// Kills every process and removes the databases and files.
    pub async fn stop(mut self) {
        for service in self.orders.iter_mut().chain(self.billing.iter_mut()) {
            service.kill().await;
        }
        for node in &mut self.nats {
            node.kill().await;
        }
        // Nothing streams it now, and the database cannot be dropped with it.
        drop(self.slot.take());
        self.orders_pool.close().await;
        self.billing_pool.close().await;
        if self.postgres.is_none() {
            testing::drop_database(&self.names.orders_db).await;
            testing::drop_database(&self.names.billing_db).await;
        }
        // Stops the scenario's own PostgreSQL, if any, before its files go.
        drop(self.postgres.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a scenario needs besides the processes themselves: independent switches.
#[derive(Debug, Clone, Copy, Default)]
#[allow(clippy::struct_excessive_bools)]
pub struct Setup {
    /// orders-service reaches NATS through a [`Proxy`] that can lose the broker's replies.
    pub proxy: bool,
    /// Both databases live on a PostgreSQL cluster of the scenario's own, which it restarts.
    pub own_postgres: bool,
    /// Both databases live on a PostgreSQL cluster of the scenario's own that takes TLS
    /// connections only, and the services verify its certificate against a CA of the test's
    /// own (`sslmode=verify-full&sslrootcert=…`).
    pub postgres_tls: bool,
    /// Services log at `info` (default `warn`), for scenarios that read the logs.
    pub info_logs: bool,
    /// nats-server requires a user and password, given to the services in `NATS_URL`.
    pub nats_auth: bool,
    /// Three nats-servers as one JetStream cluster, and the stream with three replicas.
    pub nats_cluster: bool,
    /// nats-server runs the services' account with this much file storage for JetStream
    /// (bytes), as an operator's account limits do; the services log in as its user.
    pub account_storage: Option<u64>,
    /// The orders-service instances share a replication slot of the scenario's own
    /// (`RELAY_WAL_SLOT`), the relays woken from it: the server needs wal_level = logical.
    pub wal_slot: bool,
    /// Settings both services get besides their defaults.
    pub env: &'static [(&'static str, &'static str)],
    /// nats-server requires the services' identities of deploy/nats/accounts.conf (its lines
    /// holding any of these strings left out: a permission withheld), and each service logs
    /// in as its own; the scenario's own checks log in as the operator.
    pub nats_identities: Option<&'static [&'static str]>,
}

/// A nats-server configuration with one account for the services, user and password as given,
/// and `max_file` bytes of JetStream file storage.
pub fn account_config(credentials: &(String, String), max_file: u64) -> String {
    let (user, password) = credentials;
    format!(
        "accounts {{ APP {{ jetstream {{ max_file: {max_file}, max_mem: 0, max_streams: 10, \
         max_consumers: 100 }}, users [ {{ user: \"{user}\", password: \"{password}\" }} ] }} }}"
    )
}

/// A load in progress.
#[derive(Debug)]
pub struct RunningLoad {
    /// What the clients were told so far.
    pub ledger: Arc<Ledger>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningLoad {
    /// Waits until `more` further orders were accepted since this call.
    pub async fn progress(&self, more: usize) {
        let target = self.ledger.count() + more;
        eventually(
            &format!("{more} more accepted orders"),
            Duration::from_secs(120),
            || async { (self.ledger.count() >= target).then_some(()) },
        )
        .await;
    }

    /// Stops the clients (each finishes its order in hand) and returns the ledger.
    pub async fn finish(self) -> Arc<Ledger> {
        self.stop.cancel();
        self.task.await.expect("load");
        self.ledger
    }
}
