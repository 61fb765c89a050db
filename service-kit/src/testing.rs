//! Helpers for tests against the real PostgreSQL and NATS: unique names so tests run in
//! parallel, and bounded polling instead of sleeps.

use std::future::Future;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pub use jetstream_outbox::testing::eventually;

/// A name no other test uses: `prefix` plus a random suffix, valid for databases and streams.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

/// The PostgreSQL server the tests use: `DATABASE_URL` (its database is ignored).
pub fn server_options() -> PgConnectOptions {
    std::env::var("DATABASE_URL")
        .ok()
        .and_then(|url| url.parse().ok())
        .unwrap_or_else(|| {
            "postgres://postgres@127.0.0.1:5432/postgres"
                .parse()
                .expect("default URL")
        })
}

/// The URL of database `name` on the test server.
pub fn database_url(name: &str) -> String {
    server_options().database(name).to_url_lossy().to_string()
}

/// The NATS server the tests use: `NATS_URL` or localhost.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Drops database `name`, disconnecting whoever still uses it.
pub async fn drop_database(name: &str) {
    let mut conn = server_options()
        .database("postgres")
        .connect()
        .await
        .expect("connect");
    let sql = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .expect("drop database");
    conn.close().await.ok();
}

/// Deletes stream `name` (and its consumers) from the test NATS server.
pub async fn delete_stream(name: &str) {
    if let Ok(client) = async_nats::connect(nats_url()).await {
        let _ = async_nats::jetstream::new(client).delete_stream(name).await;
    }
}

/// A service started in this process by a test.
#[derive(Debug)]
pub struct Running {
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Spawns `run` (an app's `run_until_stopped`) with a shutdown signal [`Running::stop`]
    /// fires.
    pub fn spawn<Fut>(port: u16, run: impl FnOnce(WaitForCancellationFutureOwned) -> Fut) -> Self
    where
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(stop.clone().cancelled_owned()));
        Self {
            url: format!("http://127.0.0.1:{port}"),
            stop,
            task,
        }
    }

    /// Shuts the service down gracefully and waits until it has stopped.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task
            .await
            .expect("service task")
            .expect("service stopped cleanly");
    }
}

/// Points a service's settings at database `database` and stream `stream` (subject prefix: the
/// stream's name in lower case) on the test servers, listening on a free port.
pub fn point_at(common: &mut crate::config::Common, database: &str, stream: &str) {
    common.database_url = database_url(database).into();
    common.nats_url = nats_url().into();
    common.listen_addr = "127.0.0.1:0".into();
    stream.clone_into(&mut common.stream);
    common.subject_prefix = stream.to_lowercase();
}

/// Asserts that every `$ref` of the OpenAPI document `json` names a schema it defines.
pub fn assert_refs_resolve(json: &str) {
    fn refs<'a>(value: &'a serde_json::Value, found: &mut Vec<&'a str>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(target)) = map.get("$ref") {
                    found.push(target);
                }
                map.values().for_each(|v| refs(v, found));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }
    let doc: serde_json::Value = serde_json::from_str(json).expect("an OpenAPI document");
    let mut found = Vec::new();
    refs(&doc, &mut found);
    let dangling: Vec<_> = found
        .into_iter()
        .filter(|target| doc.pointer(target.trim_start_matches('#')).is_none())
        .collect();
    assert!(dangling.is_empty(), "references to nothing: {dangling:?}");
}

/// Compares `generated` with the snapshot file at `path`; `UPDATE_SNAPSHOTS=1` rewrites it.
pub fn assert_snapshot(path: &str, generated: &str) {
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(path, generated).expect("snapshot written");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} is out of date: rerun with UPDATE_SNAPSHOTS=1 after an intended change"
    );
}

#[cfg(test)]
mod tests {
    use super::assert_refs_resolve;

    const DOC: &str = r##"{"paths": {"/a": {"schema": {"$ref": "#/components/schemas/A"}}},
        "components": {"schemas": {"A": {"items": {"$ref": "#/components/schemas/B"}}}}}"##;

    #[test]
    #[should_panic(expected = "#/components/schemas/B")]
    fn a_reference_to_nothing_is_named() {
        assert_refs_resolve(DOC);
    }

    #[test]
    fn references_to_defined_schemas_pass() {
        assert_refs_resolve(&DOC.replace(r#""A": {"#, r#""B": {}, "A": {"#));
    }
}
