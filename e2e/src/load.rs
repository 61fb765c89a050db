//! A steady load of orders (and pay/ship calls) whose outcome is always known in the end: a
//! request whose outcome is unknown (connection reset, 5xx) is repeated with the same order id,
//! which the idempotent POST makes safe.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the clients were told: the orders accepted, and how many hostile requests were refused.
#[derive(Debug, Default)]
pub struct Ledger {
    accepted: Mutex<HashMap<String, i64>>,
    /// Requests repeated because their outcome was unknown.
    pub retries: AtomicUsize,
    /// Hostile requests answered with a 4xx.
    pub refused: AtomicUsize,
}

impl Ledger {
    /// Accepted orders and their totals.
    pub fn accepted(&self) -> HashMap<String, i64> {
        self.accepted.lock().expect("ledger").clone()
    }

    /// Records an order placed outside the load (by a scenario itself).
    pub fn accept(&self, id: &str, total: i64) {
        self.accepted
            .lock()
            .expect("ledger")
            .insert(id.to_owned(), total);
    }

    /// How many orders were accepted so far.
    pub fn count(&self) -> usize {
        self.accepted.lock().expect("ledger").len()
    }
}

/// The load's shape.
#[derive(Debug, Clone)]
pub struct Load {
    /// orders-service instances; each request picks one.
    pub orders: Vec<String>,
    /// Concurrent clients.
    pub workers: usize,
    /// Mix malformed and hostile requests into the load, each expected to get a 4xx.
    pub hostile: bool,
    /// Prefix of the order ids of this run.
    pub run: String,
}

impl Load {
    /// Runs until `stop` is cancelled; each client finishes the order in hand first.
    pub async fn run(self, ledger: std::sync::Arc<Ledger>, stop: CancellationToken) {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client");
        let workers: Vec<_> = (0..self.workers)
            .map(|worker| {
                let (load, client, ledger, stop) =
                    (self.clone(), client.clone(), ledger.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0_u64;
                    while !stop.is_cancelled() {
                        n += 1;
                        load.one_order(&client, &ledger, &format!("{}-{worker}-{n}", load.run), n)
                            .await;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("load worker");
        }
    }

    fn pick(&self, n: u64) -> &str {
        &self.orders[(n as usize) % self.orders.len()]
    }

    async fn one_order(&self, client: &reqwest::Client, ledger: &Ledger, id: &str, n: u64) {
        let total = i64::try_from(n % 997 + 1).expect("small") * 100;
        let body = json!({"id": id, "customer": "load", "totalMinor": total});
        let status = self
            .until_known(ledger, n, |base| {
                client.post(format!("{base}/orders")).json(&body)
            })
            .await;
        assert!(
            matches!(status, 200 | 201),
            "POST /orders {id} answered {status}"
        );
        ledger
            .accepted
            .lock()
            .expect("ledger")
            .insert(id.to_owned(), total);

        if n.is_multiple_of(2) {
            let status = self
                .until_known(ledger, n, |base| {
                    client.post(format!("{base}/orders/{id}/pay"))
                })
                .await;
            // 409 after a lost response: the first attempt paid it.
            assert!(matches!(status, 200 | 409), "pay {id} answered {status}");
            if n.is_multiple_of(4) {
                let status = self
                    .until_known(ledger, n, |base| {
                        client.post(format!("{base}/orders/{id}/ship"))
                    })
                    .await;
                assert!(matches!(status, 200 | 409), "ship {id} answered {status}");
            }
        }
        if self.hostile && n.is_multiple_of(5) {
            self.hostile_request(client, ledger, n).await;
        }
    }

    /// Sends the request until its outcome is known: any status but 5xx.
    async fn until_known(
        &self,
        ledger: &Ledger,
        n: u64,
        request: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut attempt = 0;
        loop {
            let base = self.pick(n + attempt);
            match request(base).send().await {
                Ok(response) if !response.status().is_server_error() => {
                    return response.status().as_u16();
                }
                _ => {
                    assert!(
                        Instant::now() < deadline,
                        "a request stayed unanswered for 90 s"
                    );
                    ledger.retries.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn hostile_request(&self, client: &reqwest::Client, ledger: &Ledger, n: u64) {
        let base = self.pick(n);
        let bodies: [(&str, String); 5] = [
            ("application/json", "{".into()),
            (
                "application/json",
                json!({"id": "a.b.>", "customer": "x", "totalMinor": 1}).to_string(),
            ),
            (
                "application/json",
                json!({"customer": "x", "totalMinor": -1}).to_string(),
            ),
            (
                "application/json",
                json!({"customer": "\u{0}", "totalMinor": 1}).to_string(),
            ),
            ("text/plain", "DROP TABLE orders".into()),
        ];
        let (content_type, body) = &bodies[(n as usize / 5) % bodies.len()];
        let sent = client
            .post(format!("{base}/orders"))
            .header("content-type", *content_type)
            .body(body.clone())
            .send()
            .await;
        // A connection error (the service is being killed) tells nothing either way.
        if let Ok(response) = sent {
            let status = response.status();
            assert!(
                status.is_client_error(),
                "hostile input {body:?} answered {status}"
            );
            let problem: Value = response.json().await.unwrap_or_default();
            assert_eq!(problem["status"], status.as_u16(), "problem+json body");
            ledger.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}
