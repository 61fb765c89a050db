//! Documents generated from the code they describe, so that they cannot drift: the
//! configuration reference, from both services' own setting definitions (which `--help`
//! prints too). `cargo run -p e2e --bin docs` writes them; `e2e/tests/docs.rs` checks they are
//! what it writes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The path of the configuration reference, from the workspace's root.
pub const CONFIGURATION: &str = "docs/configuration.md";

/// One setting as a service defines it.
struct Setting {
    heading: String,
    help: String,
    orders: Option<String>,
    billing: Option<String>,
}

/// Every setting of `command` read from the environment: (variable, heading, help, default).
fn settings(command: &clap::Command) -> Vec<(String, String, String, String)> {
    command
        .get_arguments()
        .filter_map(|arg| {
            let env = arg.get_env()?.to_string_lossy().into_owned();
            let default = arg
                .get_default_values()
                .iter()
                .map(|value| value.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ");
            let help = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            let heading = arg.get_help_heading().unwrap_or("General").to_owned();
            Some((env, heading, help.replace('\n', " "), default))
        })
        .collect()
}

/// `docs/configuration.md`, as the services define their settings today.
pub fn configuration() -> String {
    let mut by_variable: BTreeMap<String, Setting> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for (service, command) in [
        (0, orders_service::config::command()),
        (1, billing_service::config::command()),
    ] {
        for (env, heading, help, default) in settings(&command) {
            let setting = by_variable.entry(env.clone()).or_insert_with(|| {
                order.push(env.clone());
                Setting {
                    heading,
                    help,
                    orders: None,
                    billing: None,
                }
            });
            let shown = Some(if default.is_empty() {
                "unset".to_owned()
            } else {
                format!("`{default}`")
            });
            if service == 0 {
                setting.orders = shown;
            } else {
                setting.billing = shown;
            }
        }
    }
    let mut headings: Vec<String> = Vec::new();
    for env in &order {
        let heading = &by_variable[env].heading;
        if !headings.contains(heading) {
            headings.push(heading.clone());
        }
    }
    let mut text = String::from(
        "# Configuration\n\n\
         Both services read their settings from the environment (each variable is also a flag of \
         the same name, e.g. `--database-url`); `orders-service --help` and `billing-service \
         --help` list them with their defaults and start nothing. A bad value stops start-up \
         with an error naming the variable. What the settings mean in operation: \
         [operations.md](operations.md). The defaults below are the binaries'; the demo \
         image (`Dockerfile`) sets `LOG_FORMAT=json`. Left out, as no setting: \
         `FAILPOINT_CRASH_AFTER_COMMITS`, a crash point of billing-service's end-to-end tests \
         (leave it unset; a process started with it warns that it will abort). \
         `opsctl` reads `OPS_URL` and `OPS_TOKEN` \
         (`opsctl --help`).\n\n\
         Generated from the services' own definitions by `cargo run -p e2e --bin docs`; \
         `e2e/tests/docs.rs` fails when this page differs from what it writes.\n",
    );
    for heading in headings {
        let _ = write!(
            text,
            "\n## {heading}\n\n| variable | orders-service | billing-service | meaning |\n\
             | --- | --- | --- | --- |\n"
        );
        for env in order
            .iter()
            .filter(|env| by_variable[*env].heading == heading)
        {
            let setting = &by_variable[env];
            let cell = |value: &Option<String>| value.clone().unwrap_or_else(|| "—".to_owned());
            let _ = writeln!(
                text,
                "| `{env}` | {} | {} | {} |",
                cell(&setting.orders),
                cell(&setting.billing),
                setting.help.replace('|', "\\|")
            );
        }
    }
    text
}
