//! Every shell command in the README's code blocks is run, so none can rot: the quick start's
//! `curl` commands here, as written but for the ports, against both services; every other
//! command by the script named beside it in [`RUN_ELSEWHERE`]. A command added to the README
//! fails this test until it is run somewhere.

use std::time::Duration;

use e2e::{Stack, eventually};

/// Commands of the README run by something other than this test, and what runs them.
const RUN_ELSEWHERE: &[(&str, &str)] = &[
    ("docker compose up --build", "scripts/compose-smoke"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318 docker compose --profile tracing up --build",
        "scripts/compose-smoke (validated only: Jaeger's image is not built on a machine that \
         cannot pull it)",
    ),
    ("scripts/test", ".ci/run"),
    (
        "export DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'",
        "scripts/test, which sets DATABASE_URL before every build (the queries are checked \
         offline whatever it says)",
    ),
    (
        "cargo run --release -p e2e --bin bench",
        "scripts/test runs the same binary with --smoke",
    ),
    (
        "cargo run --release -p e2e --bin bench -- --markdown BENCHMARKS.md docs/bench/*.json",
        "scripts/test runs the same binary's --markdown on its smoke run's results, and \
         e2e/tests/benchmarks.rs the same function on docs/bench/",
    ),
    (
        "cargo run --release -p e2e --bin bench -- --smoke",
        "scripts/test (from the test build, with the release services)",
    ),
];

/// The commands of the README's `sh` blocks: continued lines joined, comments dropped.
fn readme_commands() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_block = line == "```sh";
            continue;
        }
        if !in_block {
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
            commands.push(std::mem::take(&mut pending));
        }
    }
    commands
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
fn every_readme_command_is_run_somewhere() {
    let commands = readme_commands();
    assert!(commands.iter().any(|c| c.starts_with("curl")));
    for command in commands.iter().filter(|c| !c.starts_with("curl")) {
        assert!(
            RUN_ELSEWHERE.iter().any(|(known, _)| known == command),
            "the README shows `{command}`, which nothing runs: run it in a test or script and \
             list it in RUN_ELSEWHERE"
        );
    }
}

#[tokio::test]
async fn the_quick_start_works_as_written() {
    let stack = Stack::start().await;
    let at = |url: &str| {
        url.trim_start_matches("http://")
            .replace("127.0.0.1", "localhost")
    };
    let (orders, billing) = (at(&stack.orders.url), at(&stack.billing.url));
    let curls: Vec<String> = readme_commands()
        .into_iter()
        .filter(|c| c.starts_with("curl"))
        .map(|c| {
            c.replace("localhost:8080", &orders)
                .replace("localhost:8081", &billing)
        })
        .collect();
    let (last, before) = curls.split_last().expect("quick start commands");

    let placed = sh(&before[0]).await;
    assert!(placed.starts_with("HTTP/1.1 201"), "{placed}");
    for command in &before[1..] {
        assert!(
            sh(command).await.contains(r#""status":"paid""#),
            "{command}"
        );
    }
    // The invoice follows the events, a few milliseconds behind the order.
    let invoices = eventually("one paid invoice", Duration::from_secs(20), || async {
        let page: serde_json::Value = serde_json::from_str(&sh(last).await).ok()?;
        let items = page["items"].as_array()?.clone();
        (items.len() == 1 && items[0]["status"] == "paid").then_some(items)
    })
    .await;
    assert_eq!(invoices[0]["totalMinor"], 1999);
    stack.stop().await;
}
