//! The README's configuration table gives every variable's default: this test reads both
//! services' settings from an empty environment (in a child process of its own, so that the
//! shell's `DATABASE_URL` and the like are not seen) and checks each default the table states
//! against them, and that the table and the settings name the same variables.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// Set in the child process, which prints the settings instead of checking them.
const CHILD: &str = "README_DEFAULTS_CHILD";
/// Marks the child's lines among the test harness's own output.
const LINE: &str = "default\t";

fn ms(duration: Duration) -> String {
    duration.as_millis().to_string()
}

fn or_unset(value: Option<&str>) -> String {
    value.map_or_else(|| "unset".to_owned(), str::to_owned)
}

/// Every variable the services read with the value it has in an empty environment, for
/// orders-service and billing-service (`None` where the service does not read it).
#[allow(clippy::too_many_lines)] // a table: a row per variable
fn settings() -> Vec<(&'static str, Option<String>, Option<String>)> {
    let orders = orders_service::Config::from_env().expect("orders-service's defaults are valid");
    let billing =
        billing_service::Config::from_env().expect("billing-service's defaults are valid");
    let (o, b) = (&orders.common, &billing.common);
    let both = |name, orders: String, billing: String| (name, Some(orders), Some(billing));
    let orders_only = |name, value: String| (name, Some(value), None);
    let billing_only = |name, value: String| (name, None, Some(value));
    let otlp = |common: &service_kit::config::Common| common.otlp.as_ref().map(|_| "set");
    vec![
        both(
            "DATABASE_URL",
            o.database_url.clone(),
            b.database_url.clone(),
        ),
        both(
            "DATABASE_MAX_CONNECTIONS",
            o.database_max_connections.to_string(),
            b.database_max_connections.to_string(),
        ),
        both(
            "DATABASE_MIGRATE",
            o.database_migrate.to_string(),
            b.database_migrate.to_string(),
        ),
        both("NATS_URL", o.nats_url.clone(), b.nats_url.clone()),
        both(
            "NATS_CREDS_FILE",
            or_unset(o.nats_creds_file.as_deref()),
            or_unset(b.nats_creds_file.as_deref()),
        ),
        both(
            "NATS_TLS_CA_FILE",
            or_unset(o.nats_tls_ca_file.as_deref()),
            or_unset(b.nats_tls_ca_file.as_deref()),
        ),
        both("LISTEN_ADDR", o.listen_addr.clone(), b.listen_addr.clone()),
        both("NATS_STREAM", o.stream.clone(), b.stream.clone()),
        both(
            "NATS_SUBJECT_PREFIX",
            o.subject_prefix.clone(),
            b.subject_prefix.clone(),
        ),
        both(
            "NATS_DUPLICATE_WINDOW_MS",
            ms(o.duplicate_window),
            ms(b.duplicate_window),
        ),
        both(
            "NATS_STREAM_REPLICAS",
            o.stream_replicas.to_string(),
            b.stream_replicas.to_string(),
        ),
        both(
            "ADMIN_TOKEN",
            or_unset(o.admin_token.as_deref()),
            or_unset(b.admin_token.as_deref()),
        ),
        both("HTTP_TIMEOUT_MS", ms(o.http_timeout), ms(b.http_timeout)),
        both(
            "HTTP_MAX_CONCURRENCY",
            o.http_max_concurrency.to_string(),
            b.http_max_concurrency.to_string(),
        ),
        both("LOG_FORMAT", o.log_format.clone(), b.log_format.clone()),
        both(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            or_unset(otlp(o)),
            or_unset(otlp(b)),
        ),
        both(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            or_unset(otlp(o)),
            or_unset(otlp(b)),
        ),
        orders_only("RELAY_ENABLED", orders.relay_enabled.to_string()),
        orders_only("RELAY_BATCH_SIZE", orders.relay.batch_size.to_string()),
        orders_only("RELAY_MAX_ATTEMPTS", orders.relay.max_attempts.to_string()),
        orders_only("RELAY_LEASE_MS", ms(orders.relay.lease)),
        orders_only("RELAY_POLL_INTERVAL_MS", ms(orders.relay.poll_interval)),
        orders_only("RELAY_BACKOFF_BASE_MS", ms(orders.relay.backoff.base)),
        orders_only("RELAY_BACKOFF_MAX_MS", ms(orders.relay.backoff.max)),
        orders_only("NATS_PUBLISH_TIMEOUT_MS", ms(orders.publish_timeout)),
        orders_only("OUTBOX_RETENTION_MS", ms(orders.outbox_retention)),
        billing_only("NATS_CONSUMER", billing.consumer.name.clone()),
        billing_only("CONSUMER_ACK_WAIT_MS", ms(billing.consumer.ack_wait)),
        billing_only("CONSUMER_RETRY_DELAY_MS", ms(billing.consumer.retry_delay)),
        billing_only(
            "CONSUMER_MAX_RETRIES",
            billing.consumer.max_retries.to_string(),
        ),
        billing_only("CONSUMER_BATCH", billing.consumer.batch.to_string()),
        billing_only(
            "CONSUMER_CONCURRENCY",
            billing.consumer.concurrency.to_string(),
        ),
        billing_only(
            "CONSUMER_APPLY_BATCH",
            billing.consumer.apply_batch.to_string(),
        ),
        billing_only("INBOX_RETENTION_MS", ms(billing.inbox_retention)),
    ]
}

/// The defaults the README's configuration table states, by variable: the first code span of
/// the default column, or `unset`; a row naming two variables (`A` / `B`) gives one default
/// each, and a default `x` / `…y` gives orders' and billing's (the ellipsis standing for what
/// `x` has before its last `/`).
fn readme_defaults() -> BTreeMap<String, (String, String)> {
    let readme = include_str!("../../README.md");
    let table = readme
        .split("\n## Configuration\n")
        .nth(1)
        .and_then(|rest| rest.split("\n#").next())
        .expect("the README has a Configuration section");
    let code = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let mut defaults = BTreeMap::new();
    for row in table.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let (names, default) = (code(cells[0]), cells[1]);
        let values = if default.trim() == "unset" {
            vec!["unset".to_owned()]
        } else {
            code(default)
        };
        let per_name: Vec<(String, String)> = if names.len() > 1 {
            values.iter().map(|v| (v.clone(), v.clone())).collect()
        } else if let [orders, billing] = values.as_slice() {
            let billing = billing.strip_prefix('…').map_or_else(
                || billing.clone(),
                |tail| format!("{}{tail}", &orders[..orders.rfind('/').unwrap_or(0)]),
            );
            vec![(orders.clone(), billing)]
        } else {
            vec![(values[0].clone(), values[0].clone())]
        };
        for (name, value) in names.into_iter().zip(per_name) {
            defaults.insert(name, value);
        }
    }
    defaults
}

#[test]
fn the_readme_states_every_default_the_services_use() {
    if std::env::var_os(CHILD).is_some() {
        for (name, orders, billing) in settings() {
            let show = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            println!("{LINE}{name}\t{}\t{}", show(orders), show(billing));
        }
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_readme_states_every_default_the_services_use",
            "--nocapture",
        ])
        .env_clear()
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the child failed: {stdout}");
    let readme = readme_defaults();
    let mut wrong = Vec::new();
    let mut read = Vec::new();
    for line in stdout.lines().filter_map(|line| line.strip_prefix(LINE)) {
        let [name, orders, billing] = line.split('\t').collect::<Vec<_>>()[..] else {
            panic!("unexpected line {line:?}");
        };
        read.push(name.to_owned());
        let Some((readme_orders, readme_billing)) = readme.get(name) else {
            wrong.push(format!("{name}: not in the README's table"));
            continue;
        };
        for (service, actual, stated) in [
            ("orders", orders, readme_orders),
            ("billing", billing, readme_billing),
        ] {
            if actual != "-" && actual != stated {
                wrong.push(format!(
                    "{name}: {service}-service uses {actual:?}, the README says {stated:?}"
                ));
            }
        }
    }
    assert!(read.len() > 30, "the child printed too little: {stdout}");
    let unread: Vec<&String> = readme.keys().filter(|name| !read.contains(name)).collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Variables read elsewhere than the two Config types: the OpenTelemetry ones by
    // service-kit's exporter, the failpoint by billing's crash tests.
    let elsewhere = [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "FAILPOINT_CRASH_AFTER_COMMITS",
    ];
    let unread: Vec<&&String> = unread
        .iter()
        .filter(|name| !elsewhere.contains(&name.as_str()))
        .collect();
    assert!(
        unread.is_empty(),
        "in the README's table, read by no setting: {unread:?}"
    );
}
