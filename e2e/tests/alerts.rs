//! The alert rules and the scrape configuration in deploy/prometheus, and the dashboard in
//! deploy/grafana: valid (`promtool check config`, which checks the rules too; the dashboard's
//! queries checked as recording rules), the alerts firing on the troubles they name and quiet
//! otherwise (`promtool test rules`), and all written on metrics the services really serve:
//! each metric a rule or a panel names is a family of one service's `/metrics` after an order
//! went through.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use e2e::{Stack, promtool};
use serde_json::json;

/// Where the rules and their tests are.
const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus");
/// The dashboard.
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/grafana/reliable-orders.json"
);

/// Series Prometheus makes itself, not served by a service.
const PROMETHEUS_OWN: [&str; 1] = ["up"];

#[test]
fn the_rules_are_valid_and_their_tests_pass() {
    let dir = Path::new(DIR);
    for args in [
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let Some(said) = promtool::run(&args, dir, "") else {
            return;
        };
        assert!(said.success, "promtool {}:\n{}", args.join(" "), said.text);
    }
}

#[test]
fn the_dashboards_queries_are_valid() {
    let mut records = String::new();
    for (n, expr) in dashboard_queries().iter().enumerate() {
        writeln!(
            records,
            "      - record: dashboard:query_{n}\n        expr: {expr:?}"
        )
        .unwrap();
    }
    let dir = std::env::temp_dir().join(service_kit::testing::unique("dashboard"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("dashboard.yml"),
        format!("groups:\n  - name: dashboard\n    rules:\n{records}"),
    )
    .unwrap();
    let said = promtool::run(&["check", "rules", "dashboard.yml"], &dir, "");
    std::fs::remove_dir_all(&dir).unwrap();
    let Some(said) = said else {
        return;
    };
    assert!(said.success, "the dashboard's queries:\n{}", said.text);
}

/// Every query of the dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries: Vec<String> = panels
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|target| target["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(queries.len() >= panels.len(), "every panel has a query");
    queries
}

#[tokio::test]
async fn every_metric_a_rule_names_is_served() {
    let rules = std::fs::read_to_string(Path::new(DIR).join("alerts.yml")).unwrap();
    let expressions: Vec<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("expr:"))
        .map(str::to_owned)
        .chain(dashboard_queries())
        .collect();
    let named = metric_names(&expressions);
    assert!(named.len() >= 15, "{named:?}");

    // With a replication slot, so that its lag is served too.
    let slot = service_kit::testing::unique("alerts_wal").to_lowercase();
    let stack = Stack::start_with(|config| config.relay_wal_slot = Some(slot.clone())).await;
    let slot = jetstream_outbox::testing::SlotGuard::new(
        &service_kit::testing::database_url(&stack.names.orders_db)
            .parse()
            .expect("a database URL"),
        &slot,
    );
    let client = reqwest::Client::new();
    let answer = client
        .post(format!("{}/orders", stack.orders.url))
        .json(&json!({"id": "o-alerts-1", "customer": "ada", "totalMinor": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    // The order invoiced is not enough: the relay records commit → PubAck after its pass is
    // committed, which billing may beat. Every named family is waited for, for a bounded time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let missing = loop {
        let mut served = BTreeSet::new();
        for url in [&stack.orders.url, &stack.billing.url] {
            let text = client
                .get(format!("{url}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            served.extend(promtool::families(&text));
        }
        let missing: Vec<&String> = named
            .iter()
            .filter(|name| !served.contains(*name) && !PROMETHEUS_OWN.contains(&name.as_str()))
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        missing.is_empty(),
        "named by a rule, served by no service within 20 s: {missing:?}"
    );
    let Stack {
        names,
        orders,
        billing,
    } = stack;
    orders.stop().await;
    billing.stop().await;
    drop(slot);
    names.clean_up().await;
}

/// The metric families `expressions` name: the words holding an underscore (the services'
/// names all do) but PromQL's own, and `up`; a histogram's series name its family.
fn metric_names(expressions: &[String]) -> BTreeSet<String> {
    const PROMQL: [&str; 1] = ["histogram_quantile"];
    expressions
        .iter()
        .flat_map(|expr| {
            expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.contains('_') || *word == "up")
                .filter(|word| !PROMQL.contains(word))
                .map(|word| {
                    ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|suffix| word.strip_suffix(suffix))
                        .unwrap_or(word)
                        .to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}
