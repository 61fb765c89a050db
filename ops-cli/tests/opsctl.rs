//! opsctl against orders-service and billing-service running in-process: what it lists, shows
//! and does, what the read-only token may not do, and that a bulk action asks first.

use std::process::Output;

use e2e::{Names, RunningApp};
use serde_json::{Value, json};

const ADMIN: &str = "opsctl-admin";
const READ: &str = "opsctl-read";

/// Runs opsctl with `args` against `url` with `token`, its standard input empty (not a
/// terminal).
async fn opsctl(url: &str, token: &str, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_opsctl"));
    command
        .args(args)
        .env("OPS_URL", url)
        .env("OPS_TOKEN", token)
        .stdin(std::process::Stdio::null());
    tokio::task::spawn_blocking(move || command.output().expect("opsctl runs"))
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "opsctl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    assert!(!output.status.success(), "opsctl should have failed");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_names_every_command_and_the_settings() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_opsctl"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for word in [
        "stats",
        "list",
        "show",
        "groups",
        "retry",
        "skip",
        "retry-all",
        "skip-all",
        "audit",
        "OPS_URL",
        "OPS_TOKEN",
    ] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opsctl_lists_shows_and_acts_on_dead_events() {
    let names = Names::unique();
    let mut config = names.orders_config();
    config.common.admin_token = Some(ADMIN.into());
    config.common.read_token = Some(READ.into());
    // No relay: it would publish the events before they are made dead below.
    config.relay_enabled = false;
    let orders = RunningApp::orders(config).await;
    let client = reqwest::Client::new();
    for id in ["o1", "o2"] {
        let placed = client
            .post(format!("{}/orders", orders.url))
            .json(&json!({"id": id, "customer": "ada", "totalMinor": 5}))
            .send()
            .await
            .unwrap();
        assert_eq!(placed.status(), 201);
    }
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "UPDATE outbox SET status = 'dead', attempts = 10, last_error = CASE \
         WHEN aggregate_id = 'o1' THEN 'boom' ELSE 'message size exceeds maximum' END, \
         error_class = CASE WHEN aggregate_id = 'o1' THEN NULL ELSE 'too-large' END \
         RETURNING id",
    )
    .fetch_all(&orders.pool)
    .await
    .unwrap();
    let (first, second) = (ids[0].to_string(), ids[1].to_string());

    let listed = stdout(&opsctl(&orders.url, READ, &["list"]).await);
    assert!(
        listed.contains(&first) && listed.contains(&second),
        "{listed}"
    );
    let shown = stdout(&opsctl(&orders.url, READ, &["show", &first, "--json"]).await);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["id"], first.as_str());
    let stats = stdout(&opsctl(&orders.url, READ, &["stats"]).await);
    assert!(stats.contains("dead: 2"), "{stats}");
    let groups = stdout(&opsctl(&orders.url, READ, &["groups"]).await);
    let lines: Vec<&str> = groups.lines().collect();
    assert_eq!(lines.len(), 3, "a heading and two causes:\n{groups}");
    assert!(
        lines[1].contains("OrderPlaced")
            && (lines[1].contains("boom") || lines[1].contains("size")),
        "{groups}"
    );

    let refused = stderr(&opsctl(&orders.url, READ, &["retry", &first]).await);
    assert!(
        refused.contains("403") && refused.contains("read-only"),
        "{refused}"
    );
    let retried = stdout(&opsctl(&orders.url, ADMIN, &["retry", &first]).await);
    assert!(retried.contains("status: pending"), "{retried}");

    let listed = stdout(&opsctl(&orders.url, READ, &["list", "--error-class", "too-large"]).await);
    assert!(
        listed.contains(&second) && !listed.contains(&first),
        "{listed}"
    );
    let skip_all = ["skip-all", "--error-class", "too-large"];
    let asked = stderr(&opsctl(&orders.url, ADMIN, &skip_all).await);
    assert!(
        asked.contains("1 dead event(s) matching errorClass=too-large") && asked.contains("--yes"),
        "{asked}"
    );
    let skipped = stdout(&opsctl(&orders.url, ADMIN, &[&skip_all[..], &["--yes"]].concat()).await);
    assert!(skipped.contains("skip: 1 done"), "{skipped}");

    let audit = stdout(&opsctl(&orders.url, READ, &["audit"]).await);
    let lines: Vec<&str> = audit.lines().collect();
    assert_eq!(lines.len(), 3, "a heading and two actions:\n{audit}");
    assert!(
        lines[1].contains("skip") && lines[1].contains("errorClass=too-large"),
        "{audit}"
    );
    assert!(
        lines[2].contains("retry") && lines[2].contains(&first),
        "{audit}"
    );
    orders.stop().await;
    names.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opsctl_knows_billing_service_and_its_dead_letters() {
    let names = Names::unique();
    let mut config = names.billing_config();
    config.common.admin_token = Some(ADMIN.into());
    let billing = RunningApp::billing(config).await;
    let stats = stdout(&opsctl(&billing.url, ADMIN, &["stats"]).await);
    assert!(
        stats.contains("processed: 0") && stats.contains("waiting: 0"),
        "{stats}"
    );
    let listed = stdout(&opsctl(&billing.url, ADMIN, &["list"]).await);
    assert_eq!(listed.trim(), "(none)");
    let refused = stderr(
        &opsctl(
            &billing.url,
            ADMIN,
            &["skip-all", "--aggregate-type", "order", "--yes"],
        )
        .await,
    );
    assert!(refused.contains("--aggregate-type"), "{refused}");
    let unreachable = stderr(&opsctl("http://127.0.0.1:9", ADMIN, &["stats"]).await);
    assert!(unreachable.contains("did not answer"), "{unreachable}");
    billing.stop().await;
    names.clean_up().await;
}
