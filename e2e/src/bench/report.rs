//! The benchmark's outputs: a printed table with each figure's reference, ratio and bar,
//! BENCHMARKS.md's table, `results.json`, and the two SVG charts (drawn in `charts`).

use std::path::Path;

use super::Results;

/// A figure, what it is compared with, and whether it meets its bar.
struct Line {
    figure: &'static str,
    value: String,
    reference: String,
    bar: &'static str,
    met: bool,
}

fn lines(r: &Results) -> Vec<Line> {
    // A run of the sync or the WAL phase alone holds nothing else.
    if r.plain_tx_per_sec == 0.0 {
        let mut lines = sync_lines(r);
        lines.extend(wal_lines(r));
        return lines;
    }
    let mut lines = bars(r);
    let base = r.scale.first().map_or(f64::NAN, |s| s.invoiced_per_sec);
    lines.extend(r.scale.iter().map(|s| Line {
        figure: "end to end, max rate",
        value: format!(
            "{:.0} invoiced/s ({:.0} accepted/s)",
            s.invoiced_per_sec, s.accepted_per_sec
        ),
        reference: format!(
            "{}+{} instances, {} NATS node(s): {:.0}% of 1+1/1",
            s.replicas,
            s.replicas,
            s.nats_nodes,
            s.invoiced_per_sec / base * 100.0
        ),
        bar: "-",
        met: true,
    }));
    lines.extend(sync_lines(r));
    lines.extend(wal_lines(r));
    lines
}

/// The relay polling against the relay also woken from a replication slot, a line per figure
/// with both modes: polling's first.
fn wal_lines(r: &Results) -> Vec<Line> {
    let Some(wal) = &r.wal else {
        return Vec::new();
    };
    let (p, w) = (&wal.poll, &wal.wal);
    let (pc, wc) = (
        p.steady.cost.clone().unwrap_or_default(),
        w.steady.cost.clone().unwrap_or_default(),
    );
    let postgres = match (pc.postgres_cpu_secs, wc.postgres_cpu_secs) {
        (Some(p), Some(w)) => format!("PostgreSQL {p:.2} / {w:.2} s"),
        _ => "PostgreSQL not read (not this machine's processes)".to_owned(),
    };
    let rate = r.settings.steady_rate;
    let mut lines = rate_lines(wal);
    lines.extend([
        unbarred(
            "poll / WAL wake-up: order -> invoice",
            format!(
                "p50 {:.2} / {:.2} ms",
                p.steady.latency_ms.p50, w.steady.latency_ms.p50
            ),
            format!(
                "p99 {:.2} / {:.2} ms; commit -> relay p50 {:.2} / {:.2}, p99 {:.2} / {:.2}; at \
                 {rate}/s, {} / {} failed",
                p.steady.latency_ms.p99,
                w.steady.latency_ms.p99,
                p.steady.stages_ms.to_relay.p50,
                w.steady.stages_ms.to_relay.p50,
                p.steady.stages_ms.to_relay.p99,
                w.steady.stages_ms.to_relay.p99,
                p.steady.failed,
                w.steady.failed
            ),
        ),
        unbarred(
            "poll / WAL wake-up: SQL commit -> relay",
            format!(
                "p50 {:.2} / {:.2} ms",
                p.elsewhere_ms.p50, w.elsewhere_ms.p50
            ),
            format!(
                "p99 {:.2} / {:.2} ms; another application's outbox_enqueue, {}/s",
                p.elsewhere_ms.p99, w.elsewhere_ms.p99, wal.elsewhere_rate
            ),
        ),
        unbarred(
            "poll / WAL wake-up: CPU per 1000 orders",
            postgres,
            format!(
                "orders-service {:.2} / {:.2} s, billing-service {:.2} / {:.2} s; at {rate}/s",
                pc.orders_cpu_secs, wc.orders_cpu_secs, pc.billing_cpu_secs, wc.billing_cpu_secs
            ),
        ),
        unbarred(
            "poll / WAL wake-up: WAL per order",
            format!("{:.0} / {:.0} B", pc.wal_bytes, wc.wal_bytes),
            format!("the whole server, wal_level = logical in both; at {rate}/s"),
        ),
    ]);
    lines
}

/// The WAL phase's rates at maximum speed, polling's first: the drain, `POST /orders` and,
/// in runs that measured it, the whole pipeline.
fn rate_lines(wal: &super::wal::Wal) -> Vec<Line> {
    let (p, w) = (&wal.poll, &wal.wal);
    let mut lines = vec![
        unbarred(
            "poll / WAL wake-up: drain",
            format!("{:.0} / {:.0} events/s", p.drain_per_sec, w.drain_per_sec),
            format!(
                "{:.1}% / {:.1}% of raw publish ({:.0} msgs/s); 1 relay",
                percent(p.drain_per_sec, wal.raw_publish_per_sec),
                percent(w.drain_per_sec, wal.raw_publish_per_sec),
                wal.raw_publish_per_sec
            ),
        ),
        unbarred(
            "poll / WAL wake-up: POST /orders",
            format!(
                "{:.0} / {:.0} orders/s",
                p.http_orders_per_sec, w.http_orders_per_sec
            ),
            format!(
                "{:.1}% / {:.1}% of the plain transaction ({:.0} tx/s); maximum rate",
                percent(p.http_orders_per_sec, wal.plain_tx_per_sec),
                percent(w.http_orders_per_sec, wal.plain_tx_per_sec),
                wal.plain_tx_per_sec
            ),
        ),
    ];
    if p.pipeline_per_sec > 0.0 {
        lines.push(unbarred(
            "poll / WAL wake-up: whole pipeline",
            format!(
                "{:.0} / {:.0} invoiced/s",
                p.pipeline_per_sec, w.pipeline_per_sec
            ),
            format!(
                "{:.1}% / {:.1}% of the plain transaction ({:.0} tx/s); maximum rate, 1 + 1 \
                 instances",
                percent(p.pipeline_per_sec, wal.plain_tx_per_sec),
                percent(w.pipeline_per_sec, wal.plain_tx_per_sec),
                wal.plain_tx_per_sec
            ),
        ));
    }
    lines
}

/// A line with no bar, for figures compared only with each other.
fn unbarred(figure: &'static str, value: String, reference: String) -> Line {
    Line {
        figure,
        value,
        reference,
        bar: "-",
        met: true,
    }
}

/// `rate` as a percentage of `of`.
fn percent(rate: f64, of: f64) -> f64 {
    rate / of * 100.0
}

/// Raw publishing and the drain with the broker syncing every write, against its default.
fn sync_lines(r: &Results) -> Vec<Line> {
    let Some(sync) = &r.sync else {
        return Vec::new();
    };
    let line = |figure, always: f64, default: f64, unit| Line {
        figure,
        value: format!("{always:.0} {unit}"),
        reference: format!(
            "{:.1}% of the default sync interval ({default:.0} {unit}); {}",
            always / default * 100.0,
            sync.server
        ),
        bar: "-",
        met: true,
    };
    vec![
        line(
            "raw publishing, sync always",
            sync.raw_always_per_sec,
            sync.raw_default_per_sec,
            "msgs/s",
        ),
        line(
            "relay drain, sync always",
            sync.drain_always_per_sec,
            sync.drain_default_per_sec,
            "events/s",
        ),
    ]
}

/// The figures with a bar. A ratio compared with its bar shows a decimal, so that one just
/// short of it (89.96%) does not read as meeting it ("90%").
fn bars(r: &Results) -> Vec<Line> {
    let plain = r.plain_tx_per_sec;
    let drain = |figure, rate: f64| {
        let ratio = rate / r.raw_publish_per_sec;
        Line {
            figure,
            value: format!("{rate:.0} events/s"),
            reference: format!(
                "{:.1}% of raw publish ({:.0} msgs/s)",
                ratio * 100.0,
                r.raw_publish_per_sec
            ),
            bar: ">= 40000/s and >= 25%",
            met: rate >= 40_000.0 && ratio >= 0.25,
        }
    };
    let of_plain = |figure, value: String, rate: f64, bar, least: f64| Line {
        figure,
        value,
        reference: format!(
            "{:.1}% of the plain transaction ({plain:.0} tx/s)",
            rate / plain * 100.0
        ),
        bar,
        met: rate / plain >= least,
    };
    let pipeline = r.scale.first().map_or(f64::NAN, |s| s.invoiced_per_sec);
    let billing_ratio = r.billing_drain_per_sec / r.billing_drain_single_per_sec;
    let mut lines = vec![
        drain("relay drain, 1 relay", r.drain_1_relay_per_sec),
        drain(
            "relay drain, 1 relay, deleting",
            r.drain_1_relay_deleting_per_sec,
        ),
        Line {
            figure: "relay drain, 4 relays",
            value: format!("{:.0} events/s", r.drain_4_relays_per_sec),
            reference: format!(
                "{:.0}% of raw publish",
                r.drain_4_relays_per_sec / r.raw_publish_per_sec * 100.0
            ),
            bar: "-",
            met: true,
        },
        of_plain(
            "order transaction, sqlx",
            format!("{:.0} tx/s", r.order_tx_per_sec),
            r.order_tx_per_sec,
            "-",
            0.0,
        ),
        of_plain(
            "POST /orders, maximum rate",
            format!("{:.0} orders/s", r.http_orders_per_sec),
            r.http_orders_per_sec,
            ">= 70%",
            0.7,
        ),
        of_plain(
            "whole pipeline, maximum rate",
            format!("{pipeline:.0} invoiced/s"),
            pipeline,
            ">= 50%",
            0.5,
        ),
        Line {
            figure: "billing drain, batched",
            value: format!("{:.0} invoices/s", r.billing_drain_per_sec),
            reference: format!(
                "{billing_ratio:.1}x a transaction per message ({:.0}/s)",
                r.billing_drain_single_per_sec
            ),
            bar: ">= 5x",
            met: billing_ratio >= 5.0,
        },
    ];
    for (steady, instances) in [
        (&r.steady, "1 orders-service"),
        (&r.steady_two, "2, relay in 1"),
    ] {
        lines.extend(steady_lines(steady, r.settings.steady_rate, instances));
    }
    lines.extend(r.views.iter().map(view_line));
    lines.extend(growth_lines(&r.growth));
    let s = &r.steady;
    lines.push(Line {
        figure: "peak RSS orders / billing",
        value: format!(
            "{:.1} / {:.1} MiB",
            s.orders_peak_rss_mib, s.billing_peak_rss_mib
        ),
        reference: format!("at {} orders/s", r.settings.steady_rate),
        bar: "< 64 MiB each",
        met: s.orders_peak_rss_mib < 64.0 && s.billing_peak_rss_mib < 64.0,
    });
    lines
}

/// The growth phase: each phase on filled tables against the same on empty ones.
fn growth_lines(g: &super::growth::Growth) -> Vec<Line> {
    let rows = format!("{} rows", g.rows);
    let of_empty = |figure, value: String, ratio: f64, empty: String, runs: String| Line {
        figure,
        value,
        reference: format!("{:.1}% of empty ({empty}); {rows}{runs}", ratio * 100.0),
        bar: ">= 90%",
        met: ratio >= 0.9,
    };
    // Each run's figure, filled then empty, where each side ran more than once.
    let runs = |filled: &[f64], empty: &[f64], digits: usize| {
        let list = |values: &[f64]| {
            let shown: Vec<String> = values.iter().map(|v| format!("{v:.digits$}")).collect();
            shown.join(" / ")
        };
        if filled.len() > 1 {
            format!("; runs {} against {}", list(filled), list(empty))
        } else {
            String::new()
        }
    };
    let (e, f) = (&g.empty, &g.filled);
    let (full, empty) = (&f.steady.latency_ms, &e.steady.latency_ms);
    let c = &g.cleanup;
    let mut lines = vec![
        Line {
            figure: "growth: bytes per event",
            value: format!(
                "{:.0} / {:.0} B",
                g.outbox_bytes_per_event, g.inbox_bytes_per_record
            ),
            reference: format!("outbox / inbox, indexes included; {rows}"),
            bar: "-",
            met: true,
        },
        of_empty(
            "growth: relay drain, 1 relay",
            format!("{:.0} events/s", f.drain_1_relay_per_sec),
            f.drain_1_relay_per_sec / e.drain_1_relay_per_sec,
            format!("{:.0}/s", e.drain_1_relay_per_sec),
            runs(&f.drain_runs_per_sec, &e.drain_runs_per_sec, 0),
        ),
        of_empty(
            "growth: POST /orders, max rate",
            format!("{:.0} orders/s", f.http_orders_per_sec),
            f.http_orders_per_sec / e.http_orders_per_sec,
            format!("{:.0}/s", e.http_orders_per_sec),
            runs(&f.http_runs_per_sec, &e.http_runs_per_sec, 0),
        ),
        Line {
            figure: "growth: ageing-out",
            value: format!(
                "{:.0} / {:.0} rows/s",
                c.outbox.per_sec(),
                c.inbox.per_sec()
            ),
            reference: format!(
                "outbox ({}) / inbox (a partition emptied), VACUUM included ({:.0}/{:.0} s \
                 of {:.0}/{:.1} s), while {:.0} orders/s are inserted",
                if c.outbox.partitions == Some(true) {
                    "partitions emptied"
                } else {
                    "deleted"
                },
                c.outbox.vacuum_secs,
                c.inbox.vacuum_secs,
                c.outbox.delete_secs + c.outbox.vacuum_secs,
                c.inbox.delete_secs + c.inbox.vacuum_secs,
                c.inserted_per_sec
            ),
            bar: ">= insert rate",
            met: c.outbox.per_sec() >= c.inserted_per_sec
                && c.inbox.per_sec() >= c.inserted_per_sec,
        },
    ];
    // Latency: the empty figure over the filled one ("% of empty" as a speed, so that higher
    // is better as above).
    for (figure, full, empty, each) in [
        ("growth: latency p50", full.p50, empty.p50, String::new()),
        (
            "growth: latency p99",
            full.p99,
            empty.p99,
            runs(&f.steady_runs_p99_ms, &e.steady_runs_p99_ms, 1),
        ),
    ] {
        lines.push(of_empty(
            figure,
            format!("{full:.2} ms"),
            empty / full,
            format!("{empty:.2} ms"),
            each,
        ));
    }
    lines
}

/// The operator views' medians with one outbox size.
fn view_line(v: &super::views::Views) -> Line {
    Line {
        figure: "operator views, medians",
        value: format!(
            "{:.1} / {:.1} / {:.1} ms",
            v.stats_ms, v.metrics_ms, v.ops_ms
        ),
        reference: format!("/outbox/stats, /metrics, /ops; {} pending", v.pending),
        bar: "<= 10 ms each",
        met: v.stats_ms <= 10.0 && v.metrics_ms <= 10.0 && v.ops_ms <= 10.0,
    }
}

/// Prints the lines of a steady phase.
pub fn print_steady(s: &super::http::Steady, rate: u32, instances: &str) {
    print_lines(&steady_lines(s, rate, instances));
}

/// The latency and throughput lines of one steady phase.
fn steady_lines(s: &super::http::Steady, rate: u32, instances: &str) -> Vec<Line> {
    vec![
        Line {
            figure: "order -> invoice latency, p50",
            value: format!("{:.2} ms", s.latency_ms.p50),
            reference: format!("at {rate} orders/s, {instances}"),
            bar: "<= 5 ms",
            met: s.latency_ms.p50 <= 5.0,
        },
        Line {
            figure: "order -> invoice latency, p99",
            value: format!("{:.2} ms", s.latency_ms.p99),
            reference: format!(
                "p90 {:.2}, p99.9 {:.2}, max {:.2} ms",
                s.latency_ms.p90, s.latency_ms.p999, s.latency_ms.max
            ),
            bar: "<= 20 ms",
            met: s.latency_ms.p99 <= 20.0,
        },
        Line {
            figure: "latency by stage, p50",
            value: format!(
                "{:.2} / {:.2} / {:.2} ms",
                s.stages_ms.to_relay.p50,
                s.stages_ms.relay_to_billing.p50,
                s.stages_ms.in_billing.p50
            ),
            reference: format!(
                "to relay / to billing / in billing; p99 {:.1} / {:.1} / {:.1}",
                s.stages_ms.to_relay.p99,
                s.stages_ms.relay_to_billing.p99,
                s.stages_ms.in_billing.p99
            ),
            bar: "-",
            met: true,
        },
        Line {
            figure: "steady throughput",
            value: format!(
                "{:.0} / {:.0} / {:.0} per s",
                s.accepted_per_sec, s.relayed_per_sec, s.invoiced_per_sec
            ),
            reference: format!("accepted / relayed / invoiced; {} failed", s.failed),
            bar: "no failures",
            met: s.failed == 0,
        },
    ]
}

/// Prints every figure with its reference, ratio and bar.
pub fn print(results: &Results) {
    println!(
        "\nPostgreSQL connections {} TLS (sslmode in DATABASE_URL)",
        if results.postgres_tls {
            "use"
        } else {
            "do not use"
        }
    );
    print_lines(&lines(results));
}

/// Prints `lines` as a table.
fn print_lines(lines: &[Line]) {
    println!(
        "\n{:<32} {:<24} {:<44} {:<24} bar met",
        "figure", "value", "reference", "bar"
    );
    for line in lines {
        println!(
            "{:<32} {:<24} {:<44} {:<24} {}",
            line.figure,
            line.value,
            line.reference,
            line.bar,
            if line.met { "yes" } else { "NO" }
        );
    }
}

/// Prints the growth phase's lines.
pub fn print_growth(growth: &super::growth::Growth) {
    print_lines(&growth_lines(growth));
}

/// `BENCHMARKS.md` from the results of one or more runs: their settings, then every figure
/// with its reference and bar, a column per run, and in how many runs it met its bar.
pub fn markdown(runs: &[Results]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# Benchmark figures\n\n\
         Written by the benchmark from the `results.json` of its runs, kept in `docs/bench/` \
         (`cargo run --release -p e2e --bin bench -- --markdown BENCHMARKS.md \
         docs/bench/*.json`), not by hand; a test checks that it is. What each phase measures, its \
         reference and its bar, and where the time goes: \
         [docs/performance.md](docs/performance.md). Compare ratios across machines, not \
         rates.\n\n| run | started (UTC) | PostgreSQL over TLS | sizes |\n| --- | --- | --- | --- |\n",
    );
    for (i, r) in runs.iter().enumerate() {
        let s = &r.settings;
        // A run of one phase alone (no reference of the whole run) had no growth phase.
        let growth = if r.plain_tx_per_sec == 0.0 {
            format!(
                "{} phase alone",
                if r.wal.is_some() { "WAL" } else { "sync" }
            )
        } else {
            format!(
                "growth phase on {} rows, each side {} time(s)",
                s.growth_rows, s.growth_runs
            )
        };
        let _ = writeln!(
            out,
            "| {} | {}{} | {} | {} events drained; {} connections for {} s at maximum rate; \
             {}/s for {} s steady; {growth} |",
            i + 1,
            r.started_at,
            r.revision
                .as_ref()
                .map_or_else(String::new, |commit| format!(", commit {commit}")),
            if r.postgres_tls { "yes" } else { "no" },
            s.drain_events,
            s.connections,
            s.max_rate_secs,
            s.steady_rate,
            s.steady_secs,
        );
    }
    // Rows by figure (a figure may have several, numbered in order), in the order they first
    // appear: a run of some phases alone leaves the others' rows empty.
    let tables: Vec<Vec<((&'static str, usize), Line)>> = runs
        .iter()
        .map(|run| {
            let mut seen: Vec<&str> = Vec::new();
            lines(run)
                .into_iter()
                .map(|line| {
                    let nth = seen.iter().filter(|f| **f == line.figure).count();
                    seen.push(line.figure);
                    ((line.figure, nth), line)
                })
                .collect()
        })
        .collect();
    let mut keys: Vec<(&'static str, usize)> = Vec::new();
    for table in &tables {
        for (key, _) in table {
            if !keys.contains(key) {
                keys.push(*key);
            }
        }
    }
    let _ = write!(out, "\n| figure |");
    for i in 1..=runs.len() {
        let _ = write!(out, " run {i} |");
    }
    out.push_str(" bar | met |\n| --- |");
    out.push_str(&" --- |".repeat(runs.len() + 2));
    out.push('\n');
    for key in keys {
        let _ = write!(out, "| {} |", key.0);
        let (mut met, mut measured, mut bar) = (0, 0, "-");
        for table in &tables {
            match table.iter().find(|(k, _)| *k == key) {
                Some((_, line)) => {
                    met += usize::from(line.met);
                    measured += 1;
                    bar = line.bar;
                    let _ = write!(out, " {}<br>{} |", line.value, line.reference);
                }
                None => out.push_str(" — |"),
            }
        }
        if bar == "-" {
            out.push_str(" — | — |\n");
        } else {
            let _ = writeln!(out, " {bar} | {met} of {measured} |");
        }
    }
    out
}

/// Writes `results.json`, `latency.svg` and `throughput.svg` into `dir`.
pub fn write(results: &Results, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(results)?,
    )?;
    super::charts::latency_histogram(results, &dir.join("latency.svg"))?;
    super::charts::throughput_chart(results, &dir.join("throughput.svg"))?;
    super::progress(&format!("results in {}", dir.display()));
    Ok(())
}
