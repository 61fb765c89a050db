//! The services' identities on the broker (deploy/nats/accounts.conf), for a test's own stream,
//! prefix and consumer: the same permissions the docs give, with the test's names.

use service_kit::testing;

use crate::Names;

/// The passwords of a test's identities, passed to its nats-server in the environment.
#[derive(Debug, Clone)]
pub struct Identities {
    /// orders-service's password.
    pub orders: String,
    /// billing-service's password.
    pub billing: String,
    /// The operator's password (everything allowed).
    pub operator: String,
    /// The configuration: deploy/nats/accounts.conf with the test's names.
    pub config: String,
}

/// The account file as shipped.
const ACCOUNTS: &str = include_str!("../../deploy/nats/accounts.conf");

impl Identities {
    /// deploy/nats/accounts.conf for `names` (stream, prefix) and billing's `consumer`, with
    /// fresh passwords; lines holding any of `without` are left out (a permission withheld).
    pub fn for_test(names: &Names, consumer: &str, without: &[&str]) -> Self {
        let config = ACCOUNTS
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .filter(|line| !without.iter().any(|dropped| line.contains(dropped)))
            .collect::<Vec<_>>()
            .join("\n")
            .replace("\"orders.>\"", &format!("\"{}.>\"", names.prefix))
            .replace(".ORDERS.billing", &format!(".{}.{consumer}", names.stream))
            .replace(".ORDERS", &format!(".{}", names.stream));
        Self {
            orders: testing::unique("orders"),
            billing: testing::unique("billing"),
            operator: testing::unique("operator"),
            config,
        }
    }

    /// What nats-server's environment holds for the configuration's `$…_PASSWORD`s.
    pub fn server_env(&self) -> Vec<(String, String)> {
        vec![
            ("ORDERS_NATS_PASSWORD".into(), self.orders.clone()),
            ("BILLING_NATS_PASSWORD".into(), self.billing.clone()),
            ("OPERATOR_NATS_PASSWORD".into(), self.operator.clone()),
        ]
    }
}
