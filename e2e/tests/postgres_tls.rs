//! Both services against a PostgreSQL that takes TLS connections only (`hostssl`), its
//! certificate signed by a CA of the test's own, as a managed database's: with
//! `sslmode=verify-full&sslrootcert=…` in `DATABASE_URL` the whole pipeline works; a client
//! that does not use TLS, or trusts another CA, is refused.

use e2e::cluster::{Cluster, Setup};
use e2e::process::TlsFiles;
use sqlx::ConnectOptions as _;
use sqlx::postgres::PgConnectOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_over_verify_full_postgres() {
    let setup = Setup {
        postgres_tls: true,
        ..Setup::default()
    };
    let cluster = Cluster::start_with(1, 1, setup).await;
    let load = cluster.load(2, false);
    load.progress(50).await;

    let url = cluster
        .postgres
        .as_ref()
        .expect("own postgres")
        .database_url(&cluster.names.orders_db);
    let verified: PgConnectOptions = url.parse().unwrap();
    let plain = verified
        .clone()
        .ssl_mode(sqlx::postgres::PgSslMode::Disable);
    assert!(
        plain.connect().await.is_err(),
        "a connection without TLS is refused"
    );
    let other_ca = TlsFiles::generate(&cluster.dir.join("other-ca"));
    let wrong = verified.clone().ssl_root_cert(&other_ca.ca);
    assert!(
        wrong.connect().await.is_err(),
        "a certificate another CA signed is not trusted"
    );
    assert!(verified.connect().await.is_ok());

    let ledger = load.finish().await;
    cluster.check(&ledger).await.assert_clean();
    cluster.stop().await;
}
