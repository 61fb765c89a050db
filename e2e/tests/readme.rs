//! Every shell command in the code blocks of the README, docs/operations.md and
//! docs/performance.md is run, so none can
//! rot: the quick start's `curl` commands here, as written but for the ports, against both
//! services, each answering what the README shows after it (timestamps and ids aside); every
//! other command by the script named beside it in [`RUN_ELSEWHERE`]. A command added to those
//! documents fails this test until it is run somewhere.

use std::time::Duration;

use e2e::{Stack, eventually};

/// The documents whose commands are checked.
const DOCUMENTS: [&str; 3] = [
    include_str!("../../README.md"),
    include_str!("../../docs/operations.md"),
    include_str!("../../docs/performance.md"),
];

/// Commands of the documents run by something other than this test, and what runs them.
const RUN_ELSEWHERE: &[(&str, &str)] = &[
    (
        "docker compose up --build --wait",
        "scripts/compose-smoke (as `up -d --build` and a wait for every container's health \
         check: Compose v1 has no --wait)",
    ),
    ("docker compose down -v", "scripts/compose-smoke"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318 docker compose --profile tracing up --build",
        "scripts/compose-smoke (validated only: Jaeger's image is not built on a machine that \
         cannot pull it)",
    ),
    (
        "docker compose --profile monitoring up --build",
        "scripts/compose-smoke (as `up -d --build` with the default stack, checking that \
         Prometheus scrapes both services and loaded the rules); e2e/tests/alerts.rs checks its \
         configuration and rules",
    ),
    (
        "export OPS_URL=http://127.0.0.1:8080 OPS_TOKEN=demo-admin-token",
        "ops-cli/tests/opsctl.rs, which sets both for each run of opsctl",
    ),
    (
        "cargo run -q -p ops-cli -- groups",
        "ops-cli/tests/opsctl.rs runs groups of the same binary",
    ),
    (
        "cargo run -q -p ops-cli -- list --error-class too-large",
        "ops-cli/tests/opsctl.rs runs list --error-class too-large (and show) of the same binary",
    ),
    (
        "cargo run -q -p ops-cli -- retry-all --error-class too-large",
        "ops-cli/tests/opsctl.rs runs skip-all --error-class too-large, asked and with --yes",
    ),
    (
        "cargo run -q -p ops-cli -- audit",
        "ops-cli/tests/opsctl.rs",
    ),
    ("scripts/test", ".ci/run"),
    (
        "scripts/test -p jetstream-outbox",
        ".ci/run, whose scripts/test runs these tests among every other",
    ),
    (
        "cargo run --release -p e2e --bin bench",
        "scripts/test runs the same binary with --smoke",
    ),
    (
        "cargo run --release -p e2e --bin bench -- --smoke",
        "scripts/test (from the test build, with the release services)",
    ),
    (
        "cargo run --release -p e2e --bin bench -- --markdown BENCHMARKS.md docs/bench/*.json",
        "scripts/test runs the same binary's --markdown on its smoke run's results, and \
         e2e/tests/benchmarks.rs the same function on docs/bench/",
    ),
];

/// The commands of `document`'s `sh` blocks (continued lines joined, comments dropped), each
/// with the `json` block that follows its block, if any.
fn commands(document: &str) -> Vec<(String, Option<String>)> {
    let mut commands: Vec<(String, Option<String>)> = Vec::new();
    let (mut in_sh, mut in_json, mut after_sh) = (false, false, false);
    let mut pending = String::new();
    for line in document.lines() {
        if let Some(kind) = line.strip_prefix("```") {
            if in_sh || in_json {
                after_sh = in_sh;
                in_sh = false;
                in_json = false;
            } else {
                in_sh = kind == "sh";
                in_json = kind == "json" && after_sh;
                after_sh = false;
            }
            continue;
        }
        if !line.is_empty() {
            after_sh = false;
        }
        if in_json {
            if let Some((_, output)) = commands.last_mut() {
                output.get_or_insert_with(String::new).push_str(line);
            }
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = line.split(" # ").next().unwrap_or_default().trim();
        if let Some(start) = line.strip_suffix('\\') {
            pending.push_str(start.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        if !pending.is_empty() {
            commands.push((std::mem::take(&mut pending), None));
        }
    }
    commands
}

/// Every command of the checked documents.
fn all_commands() -> Vec<(String, Option<String>)> {
    DOCUMENTS
        .iter()
        .flat_map(|document| commands(document))
        .collect()
}

/// Whether `actual` is what `shown` shows: the same fields, the same values but where the
/// document shows a time or an id (the values change with every run), which must be of the
/// same kind.
fn answers_as_shown(shown: &serde_json::Value, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    let volatile = |text: &str| {
        chrono::DateTime::parse_from_rfc3339(text).is_ok() || uuid::Uuid::parse_str(text).is_ok()
    };
    match (shown, actual) {
        (Value::Object(shown), Value::Object(actual)) => {
            shown.len() == actual.len()
                && shown.iter().all(|(key, value)| {
                    actual
                        .get(key)
                        .is_some_and(|actual| answers_as_shown(value, actual))
                })
        }
        (Value::Array(shown), Value::Array(actual)) => {
            shown.len() == actual.len()
                && shown
                    .iter()
                    .zip(actual)
                    .all(|(s, a)| answers_as_shown(s, a))
        }
        (Value::String(shown), Value::String(actual)) if volatile(shown) => volatile(actual),
        _ => shown == actual,
    }
}

/// Runs `command` with `sh`, and returns what it printed; panics if it failed.
async fn sh(command: &str) -> String {
    let output = tokio::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .await
        .expect("sh runs");
    assert!(
        output.status.success(),
        "`{command}` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_documented_command_is_run_somewhere() {
    let commands = all_commands();
    assert!(commands.iter().any(|(c, _)| c.starts_with("curl")));
    for (command, _) in commands.iter().filter(|(c, _)| !c.starts_with("curl")) {
        assert!(
            RUN_ELSEWHERE.iter().any(|(known, _)| known == command),
            "a document shows `{command}`, which nothing runs: run it in a test or script and \
             list it in RUN_ELSEWHERE"
        );
    }
}

#[tokio::test]
async fn the_quick_start_answers_as_shown() {
    let stack = Stack::start().await;
    let at = |url: &str| {
        url.trim_start_matches("http://")
            .replace("127.0.0.1", "localhost")
    };
    let (orders, billing) = (at(&stack.orders.url), at(&stack.billing.url));
    let curls: Vec<(String, serde_json::Value)> = all_commands()
        .into_iter()
        .filter(|(c, _)| c.starts_with("curl"))
        .map(|(command, output)| {
            let output = output.unwrap_or_else(|| panic!("`{command}` shows no answer"));
            let shown = serde_json::from_str(&output)
                .unwrap_or_else(|e| panic!("the answer shown for `{command}`: {e}"));
            let command = command
                .replace("localhost:8080", &orders)
                .replace("localhost:8081", &billing);
            (command, shown)
        })
        .collect();
    assert_eq!(curls.len(), 3, "place, pay, find the invoice");
    for (command, shown) in curls {
        // The invoice follows the events, a few milliseconds behind the order.
        let answer = eventually(
            &format!("`{command}` to answer as shown"),
            Duration::from_secs(20),
            || async {
                let actual: serde_json::Value = serde_json::from_str(&sh(&command).await).ok()?;
                answers_as_shown(&shown, &actual).then_some(actual)
            },
        )
        .await;
        assert!(answers_as_shown(&shown, &answer));
    }
    stack.stop().await;
}
