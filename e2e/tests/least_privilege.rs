//! Both services run as the least-privileged roles of `deploy/postgres/*.sql`, after an owner
//! applied the migrations: an order still becomes a paid invoice, the cleanup tasks may delete
//! what they must, and the roles can change nothing else.

use std::time::Duration;

use e2e::{Names, RunningApp, eventually};
use serde_json::{Value, json};
use service_kit::testing;
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions as _, PgPool};

const WAIT: Duration = Duration::from_secs(30);

/// Runs `deploy/postgres/{file}` in `database` as the superuser of the test server, with
/// `role` in place of the script's role name, and returns the role's URL for `database`.
async fn create_role(script: &str, placeholder: &str, role: &str, database: &str) -> String {
    let owner = PgPoolOptions::new()
        .max_connections(1)
        .connect(&testing::database_url(database))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(script.replace(placeholder, role)))
        .execute(&owner)
        .await
        .unwrap();
    owner.close().await;
    testing::server_options()
        .username(role)
        .database(database)
        .to_url_lossy()
        .to_string()
}

async fn drop_role(role: &str) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&testing::database_url("postgres"))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"DROP ROLE IF EXISTS "{role}""#
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// The SQLSTATE `sql` fails with when `pool`'s role runs it.
async fn refusal(pool: &PgPool, sql: &'static str) -> String {
    let error = sqlx::raw_sql(sql)
        .execute(pool)
        .await
        .expect_err("the role may not do this");
    error
        .as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .map(std::borrow::Cow::into_owned)
        .unwrap_or_default()
}

/// The status of order o-priv-1's invoice, once there is one.
async fn invoice_status(client: &reqwest::Client, billing: &str) -> Option<String> {
    let page: Value = client
        .get(format!("{billing}/invoices?orderId=o-priv-1"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(page["items"][0]["status"].as_str()?.to_owned())
}

/// Runs the outbox's cleanup as `role_pool`'s role and checks that it emptied the partition of
/// the two published events (OrderPlaced and OrderPaid) once they were past the retention of an
/// hour, not before: the role's right to run `outbox_age_out` does not reach newer events. The
/// owner moves the events four hours back in between.
async fn age_out_the_published_events(role_pool: &PgPool, database: &str) {
    let owner = PgPool::connect(&testing::database_url(database))
        .await
        .unwrap();
    let published = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_published")
            .fetch_one(&owner)
            .await
            .unwrap()
    };
    let cleanup = jetstream_outbox::Cleanup::outbox(role_pool.clone(), Duration::from_secs(3600));
    cleanup.run_once().await.unwrap();
    assert_eq!(published().await, 2, "events within the retention are kept");
    let moved = sqlx::query(
        "UPDATE outbox_published SET published_at = published_at - interval '4 hours',
                slot = outbox_published_slot(published_at - interval '4 hours')",
    )
    .execute(&owner)
    .await
    .unwrap();
    assert_eq!(moved.rows_affected(), 2, "OrderPlaced and OrderPaid");
    // orders-service's own cleanup task may be running: age-outs run one at a time, and the
    // one that finds another running returns at once, emptying nothing.
    eventually(
        "the cleanup to empty the published events' partition",
        WAIT,
        || async {
            cleanup.run_once().await.unwrap();
            (published().await == 0).then_some(())
        },
    )
    .await;
    owner.close().await;
}

/// What the roles may not do: change the schema, or delete what they only add to.
async fn assert_least_privilege(orders: &PgPool, billing: &PgPool) {
    const DENIED: &str = "42501";
    for pool in [orders, billing] {
        assert_eq!(refusal(pool, "CREATE TABLE intruder (x int)").await, DENIED);
        assert_eq!(refusal(pool, "DROP TABLE _sqlx_migrations").await, DENIED);
        assert_eq!(refusal(pool, "DELETE FROM _sqlx_migrations").await, DENIED);
    }
    assert_eq!(refusal(orders, "TRUNCATE outbox").await, DENIED);
    // DELETE on outbox_published it has: the relay moves an event the broker lost back into
    // the outbox (as it may delete pending events from the outbox).
    assert_eq!(refusal(orders, "TRUNCATE outbox_published").await, DENIED);
    assert_eq!(
        refusal(orders, "SELECT * FROM outbox_age_out(interval '-1 hour')").await,
        "22023",
        "a negative retention"
    );
    assert_eq!(refusal(orders, "DELETE FROM orders").await, DENIED);
    assert_eq!(refusal(billing, "DELETE FROM invoices").await, DENIED);
    assert_eq!(refusal(billing, "DELETE FROM inbox_dead").await, DENIED);
    assert_eq!(refusal(billing, "TRUNCATE inbox_entries").await, DENIED);
}

#[tokio::test]
async fn services_run_as_roles_that_cannot_change_the_schema() {
    let names = Names::unique();
    let orders_role = testing::unique("orders_app");
    let billing_role = testing::unique("billing_app");

    // The owner (the test server's superuser) creates and migrates both databases.
    for (database, migrate) in [(&names.orders_db, true), (&names.billing_db, false)] {
        let pool = service_kit::infra::connect_db(&testing::database_url(database), 2)
            .await
            .unwrap();
        if migrate {
            orders_service::startup::migrate(&pool).await.unwrap();
        } else {
            billing_service::startup::migrate(&pool).await.unwrap();
        }
        pool.close().await;
    }
    let orders_url = create_role(
        include_str!("../../deploy/postgres/orders-service.sql"),
        "orders_app",
        &orders_role,
        &names.orders_db,
    )
    .await;
    let billing_url = create_role(
        include_str!("../../deploy/postgres/billing-service.sql"),
        "billing_app",
        &billing_role,
        &names.billing_db,
    )
    .await;

    let mut billing_config = names.billing_config();
    billing_config.common.database_url = billing_url.clone().into();
    billing_config.common.database_migrate = false;
    let mut orders_config = names.orders_config();
    orders_config.common.database_url = orders_url.clone().into();
    orders_config.common.database_migrate = false;
    orders_config.common.admin_token = Some("t".into());
    let billing = RunningApp::billing(billing_config).await;
    let orders = RunningApp::orders(orders_config).await;

    let client = reqwest::Client::new();
    let placed = client
        .post(format!("{}/orders", orders.url))
        .json(&json!({"id": "o-priv-1", "customer": "ada", "totalMinor": 500}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    eventually("the invoice", WAIT, || {
        invoice_status(&client, &billing.url)
    })
    .await;
    let paid = client
        .post(format!("{}/orders/o-priv-1/pay", orders.url))
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 200);
    eventually("the paid invoice", WAIT, || async {
        let status = invoice_status(&client, &billing.url).await?;
        (status == "paid").then_some(())
    })
    .await;
    let dead = client
        .get(format!("{}/outbox/dead", orders.url))
        .bearer_auth("t")
        .send()
        .await
        .unwrap();
    assert_eq!(dead.status(), 200);
    // The relay records its pass after the broker acknowledged it: billing may be done first.
    eventually("the relay's pass recorded", WAIT, || async {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'pending'")
                .fetch_one(&orders.pool)
                .await
                .ok()?;
        (pending == 0).then_some(())
    })
    .await;
    // The cleanup tasks' statements, as the roles (their tasks run them once a minute).
    age_out_the_published_events(&orders.pool, &names.orders_db).await;
    let inbox = jetstream_outbox::inbox::Inbox::new(billing.pool.clone(), "billing");
    assert_eq!(inbox.cleanup(Duration::ZERO, 100).await.unwrap(), 2);

    assert_least_privilege(&orders.pool, &billing.pool).await;

    orders.stop().await;
    billing.stop().await;
    names.clean_up().await;
    drop_role(&orders_role).await;
    drop_role(&billing_role).await;
}

/// With `DATABASE_MIGRATE=false`, a database that lacks a migration stops start-up, naming
/// the variable, instead of failing later on a missing table.
#[tokio::test]
async fn a_service_that_may_not_migrate_refuses_an_unmigrated_database() {
    let names = Names::unique();
    let mut config = names.orders_config();
    config.common.database_migrate = false;
    let error = orders_service::App::build(config)
        .await
        .expect_err("the database is empty");
    let message = format!("{error:#}");
    assert!(message.contains("DATABASE_MIGRATE=false"), "{message}");
    assert!(message.contains("not migrated"), "{message}");
    names.clean_up().await;
}
