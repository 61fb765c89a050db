//! Prometheus metrics: the process-wide recorder, per-route HTTP metrics, and rendering.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Seconds: from 1 ms to an hour. The long ones are for outages: an event that waited out a
/// broker outage is still placed, and the console's charts and Prometheus' quantiles show how
/// long, rather than stopping at the largest bucket.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
    900.0, 3600.0,
];
/// Rows per relay pass.
const BATCH_BUCKETS: &[f64] = &[1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0];

/// The process's recorder, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)
            })
            .expect("bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder is installed; then ours simply records nothing.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    })
}

/// Gives the HTTP metrics and the library's their help text and unit (`# HELP`).
fn describe() {
    metrics::describe_counter!(
        "http_server_requests_total",
        metrics::Unit::Count,
        "HTTP requests answered, by method, route template and status."
    );
    metrics::describe_histogram!(
        "http_server_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time to answer an HTTP request, by method, route template and status."
    );
    jetstream_outbox::metrics::describe();
}

/// Middleware: `http_server_requests_total` and `http_server_request_duration_seconds` per
/// method, route template and status.
pub async fn track_http(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let labels = [
        ("method", method),
        ("route", route),
        ("status", response.status().as_u16().to_string()),
    ];
    metrics::counter!("http_server_requests_total", &labels).increment(1);
    metrics::histogram!("http_server_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

/// The Prometheus text exposition of every metric.
pub fn render() -> String {
    handle().render()
}

/// A value computed at most once per `every`, and shared meanwhile: the gauges of `/metrics`
/// read the database, so however many scrapers there are, the database answers once per
/// interval. Callers that arrive while it is being computed wait for that computation.
#[derive(Debug)]
pub struct Cached<T> {
    every: std::time::Duration,
    last: tokio::sync::Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Cached<T> {
    /// Computes anew once `every` has passed since the last computation.
    pub fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The last value if it is recent, else the value `compute` gives (and an error is not
    /// kept: the next call tries again).
    pub async fn get<E>(
        &self,
        compute: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let mut last = self.last.lock().await;
        if let Some((at, value)) = last.as_ref()
            && at.elapsed() < self.every
        {
            return Ok(value.clone());
        }
        let value = compute.await?;
        *last = Some((Instant::now(), value.clone()));
        Ok(value)
    }
}

/// How often the gauges `/metrics` reads from the database are computed at most.
pub const GAUGE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    /// An event that waited out a two-minute broker outage is counted below five minutes, not
    /// only past the largest bucket, so that its wait can be read from the histogram.
    #[test]
    fn a_wait_of_minutes_has_a_bucket_of_its_own() {
        let handle = super::handle();
        metrics::histogram!("test_outage_wait_seconds").record(120.0);
        let text = handle.render();
        for (bound, count) in [("60", 0), ("300", 1)] {
            let line = format!("test_outage_wait_seconds_bucket{{le=\"{bound}\"}} {count}");
            assert!(text.contains(&line), "no {line:?} in:\n{text}");
        }
    }
}
