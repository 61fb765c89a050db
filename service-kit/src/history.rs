//! The last hour of a service's own metrics, for the charts of `/ops`: no Prometheus needed.
//!
//! A background task renders the service's metrics every interval (after the service has
//! brought its gauges up to date) and keeps, per line of each chart, one value: a gauge's
//! value, a counter's rate over the interval, or a quantile of what a histogram recorded in
//! the interval. An hour of samples is kept in a ring, a fixed cost whatever the load.
//! `GET /ops/history` serves them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

/// How long the charts look back.
pub const SPAN: Duration = Duration::from_secs(3600);

/// One chart of `/ops`: lines sharing a unit.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    /// Its title.
    pub title: &'static str,
    /// The unit of its values: `/s`, `s`, or empty for a count.
    pub unit: &'static str,
    /// Its lines.
    pub lines: &'static [Line],
}

/// One line of a chart: which metric, and how it is read.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// Its key in the samples.
    pub key: &'static str,
    /// Its legend.
    pub label: &'static str,
    /// The metric family.
    #[serde(skip)]
    pub metric: &'static str,
    /// Label pairs a series must carry to count (`route="/orders"`); all series when empty.
    #[serde(skip)]
    pub labels: &'static [&'static str],
    /// How the metric is read.
    #[serde(skip)]
    pub read: Read,
}

/// How a line reads its metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Read {
    /// A gauge's value (summed over its matching series).
    Gauge,
    /// A counter's increase per second over the interval.
    Rate,
    /// This quantile (0 to 1) of what the histogram recorded in the interval.
    Quantile(f64),
}

/// The samples `GET /ops/history` serves.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Samples {
    /// Seconds between two samples.
    pub interval_seconds: f64,
    /// When each sample was taken, oldest first.
    pub at: Vec<DateTime<Utc>>,
    /// Per line key, its value at each time (`null`: nothing to read then).
    pub values: HashMap<&'static str, Vec<Option<f64>>>,
}

/// Brings the service's gauges up to date before a sample (they are computed on demand).
#[derive(Clone)]
pub struct Refresh(Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>);

impl Refresh {
    /// Calls `refresh` before each sample.
    pub fn new(refresh: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static) -> Self {
        Self(Arc::new(refresh))
    }
}

impl std::fmt::Debug for Refresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refresh")
    }
}

/// The ring of samples of one service.
#[derive(Clone)]
pub struct History {
    charts: &'static [Chart],
    interval: Duration,
    ring: Arc<Mutex<Ring>>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Ring {
    at: VecDeque<DateTime<Utc>>,
    values: HashMap<&'static str, VecDeque<Option<f64>>>,
    /// The metrics at the previous sample, for rates and quantiles.
    previous: Option<Parsed>,
}

impl History {
    /// Samples for `charts`, one every `interval`.
    pub fn new(charts: &'static [Chart], interval: Duration) -> Self {
        Self {
            charts,
            interval: interval.max(Duration::from_millis(100)),
            ring: Arc::default(),
        }
    }

    /// How many samples the ring keeps: an hour's.
    fn capacity(&self) -> usize {
        usize::try_from(SPAN.as_millis() / self.interval.as_millis().max(1))
            .unwrap_or(1)
            .max(2)
    }

    /// The samples so far.
    pub fn samples(&self) -> Samples {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        Samples {
            interval_seconds: self.interval.as_secs_f64(),
            at: ring.at.iter().copied().collect(),
            values: ring
                .values
                .iter()
                .map(|(key, values)| (*key, values.iter().copied().collect()))
                .collect(),
        }
    }

    /// Takes a sample of `metrics` (the Prometheus text), `elapsed` after the previous one.
    pub fn sample(&self, metrics: &str, elapsed: Duration) {
        let now = parse(metrics);
        let capacity = self.capacity();
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = ring.previous.take();
        for line in self.charts.iter().flat_map(|chart| chart.lines) {
            let value = read(line, &now, previous.as_ref(), elapsed);
            let values = ring.values.entry(line.key).or_default();
            values.push_back(value);
            if values.len() > capacity {
                values.pop_front();
            }
        }
        ring.at.push_back(Utc::now());
        if ring.at.len() > capacity {
            ring.at.pop_front();
        }
        ring.previous = Some(now);
    }

    /// Samples every interval until `stop`, calling `refresh` first each time.
    pub async fn run(self, refresh: Refresh, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            (refresh.0)().await;
            let now = tokio::time::Instant::now();
            self.sample(&crate::metrics::render(), now - last);
            last = now;
        }
    }
}

/// The series of a Prometheus text: per family name, its samples' labels and values.
type Parsed = HashMap<String, Vec<(String, f64)>>;

fn parse(text: &str) -> Parsed {
    let mut parsed: Parsed = HashMap::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        parsed
            .entry(name.to_owned())
            .or_default()
            .push((labels.to_owned(), value));
    }
    parsed
}

/// The sum of `metric`'s series carrying every pair of `labels` (and, for buckets, `le`).
fn sum(parsed: &Parsed, metric: &str, labels: &[&str], le: Option<&str>) -> Option<f64> {
    let series = parsed.get(metric)?;
    let le = le.map(|le| format!("le=\"{le}\""));
    let matching: Vec<f64> = series
        .iter()
        .filter(|(set, _)| labels.iter().all(|pair| set.split(',').any(|p| p == *pair)))
        .filter(|(set, _)| le.as_ref().is_none_or(|le| set.split(',').any(|p| p == le)))
        .map(|(_, value)| *value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn read(line: &Line, now: &Parsed, previous: Option<&Parsed>, elapsed: Duration) -> Option<f64> {
    match line.read {
        Read::Gauge => sum(now, line.metric, line.labels, None),
        Read::Rate => {
            let now = sum(now, line.metric, line.labels, None).unwrap_or(0.0);
            let before = sum(previous?, line.metric, line.labels, None).unwrap_or(0.0);
            let seconds = elapsed.as_secs_f64();
            (seconds > 0.0).then(|| ((now - before) / seconds).max(0.0))
        }
        Read::Quantile(q) => quantile(line, now, previous?, q),
    }
}

/// Quantile `q` of what histogram `line.metric` recorded between `previous` and `now`, by
/// linear interpolation within its bucket (as Prometheus' `histogram_quantile`); `None` when
/// nothing was recorded.
fn quantile(line: &Line, now: &Parsed, previous: &Parsed, q: f64) -> Option<f64> {
    let buckets = format!("{}_bucket", line.metric);
    let mut bounds: Vec<(f64, String)> = now
        .get(&buckets)?
        .iter()
        .filter_map(|(set, _)| {
            let le = set.split(',').find_map(|p| p.strip_prefix("le=\""))?;
            let le = le.trim_end_matches('"');
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, le.to_owned()))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    bounds.dedup_by(|a, b| a.1 == b.1);
    let counts: Vec<(f64, f64)> = bounds
        .iter()
        .map(|(bound, le)| {
            let after = sum(now, &buckets, line.labels, Some(le)).unwrap_or(0.0);
            let before = sum(previous, &buckets, line.labels, Some(le)).unwrap_or(0.0);
            (*bound, (after - before).max(0.0))
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in &counts {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let within = count - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * share);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &[Line] = &[
        Line {
            key: "accepted",
            label: "accepted",
            metric: "http_server_requests_total",
            labels: &["route=\"/orders\"", "status=\"201\""],
            read: Read::Rate,
        },
        Line {
            key: "backlog",
            label: "backlog",
            metric: "outbox_pending_events",
            labels: &[],
            read: Read::Gauge,
        },
        Line {
            key: "p50",
            label: "p50",
            metric: "lag_seconds",
            labels: &[],
            read: Read::Quantile(0.5),
        },
    ];
    const CHARTS: &[Chart] = &[Chart {
        title: "t",
        unit: "",
        lines: LINES,
    }];

    fn text(accepted: u32, refused: u32, backlog: u32, buckets: [u32; 3]) -> String {
        format!(
            "# TYPE http_server_requests_total counter\n\
             http_server_requests_total{{method=\"POST\",route=\"/orders\",status=\"201\"}} {accepted}\n\
             http_server_requests_total{{method=\"POST\",route=\"/orders\",status=\"422\"}} {refused}\n\
             outbox_pending_events {backlog}\n\
             lag_seconds_bucket{{le=\"0.1\"}} {}\n\
             lag_seconds_bucket{{le=\"1\"}} {}\n\
             lag_seconds_bucket{{le=\"+Inf\"}} {}\n",
            buckets[0], buckets[1], buckets[2]
        )
    }

    #[test]
    fn counters_become_rates_gauges_values_histograms_quantiles() {
        let history = History::new(CHARTS, Duration::from_secs(10));
        history.sample(&text(100, 7, 5, [0, 0, 0]), Duration::from_secs(10));
        // In ten seconds: 50 accepted (the refusals do not count), and of 40 lags 20 under
        // 0.1 s and 20 between 0.1 and 1 s.
        history.sample(&text(150, 9, 8, [20, 40, 40]), Duration::from_secs(10));
        let samples = history.samples();
        assert_eq!(samples.at.len(), 2);
        assert_eq!(samples.values["accepted"], [None, Some(5.0)]);
        assert_eq!(samples.values["backlog"], [Some(5.0), Some(8.0)]);
        assert_eq!(samples.values["p50"], [None, Some(0.1)]);
    }

    #[test]
    fn the_ring_keeps_an_hour() {
        let history = History::new(CHARTS, Duration::from_secs(60));
        for n in 0..100 {
            history.sample(&text(n, 0, n, [0, 0, 0]), Duration::from_secs(60));
        }
        let samples = history.samples();
        assert_eq!(samples.at.len(), 60);
        assert_eq!(samples.values["backlog"].first(), Some(&Some(40.0)));
    }

    #[test]
    fn a_quantile_interpolates_within_its_bucket() {
        let previous = parse(&text(0, 0, 0, [0, 0, 0]));
        let now = parse(&text(0, 0, 0, [10, 20, 20]));
        let line = &LINES[2];
        assert_eq!(quantile(line, &now, &previous, 0.25), Some(0.05));
        assert_eq!(quantile(line, &now, &previous, 0.75), Some(0.55));
        assert_eq!(quantile(line, &previous, &previous, 0.5), None);
    }
}
