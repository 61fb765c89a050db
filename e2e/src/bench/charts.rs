//! The benchmark's two SVG charts: order → invoice latency, and throughput.

use std::path::Path;

use plotters::prelude::*;

use super::Results;

/// Order → invoice latency, in 0.25 ms buckets up to the 99.9th percentile.
pub(super) fn latency_histogram(results: &Results, path: &Path) -> anyhow::Result<()> {
    const BUCKET: f64 = 0.25;
    let latencies = &results.steady.latencies_ms;
    let top = (results.steady.latency_ms.p999 / BUCKET).ceil().max(4.0);
    let last = top as usize;
    let mut counts = vec![0_u32; last + 1];
    for ms in latencies {
        counts[((ms / BUCKET) as usize).min(last)] += 1;
    }
    let highest = f64::from(counts.iter().copied().max().unwrap_or(1).max(1));

    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "order commit -> invoice commit at {} orders/s (p50 {:.2} ms, p99 {:.2} ms)",
                results.settings.steady_rate,
                results.steady.latency_ms.p50,
                results.steady.latency_ms.p99
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..(top + 1.0) * BUCKET, 0.0..highest * 1.05)
        .map_err(chart_error)?;
    chart
        .configure_mesh()
        .x_desc("milliseconds (last bucket: everything above p99.9)")
        .y_desc("orders")
        .draw()
        .map_err(chart_error)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &n)| {
            let x = i as f64 * BUCKET;
            Rectangle::new([(x, 0.0), (x + BUCKET, f64::from(n))], BLUE.filled())
        }))
        .map_err(chart_error)?;
    root.present().map_err(chart_error)?;
    Ok(())
}

/// Accepted, relayed and invoiced per second over the steady phase.
pub(super) fn throughput_chart(results: &Results, path: &Path) -> anyhow::Result<()> {
    let timeline = &results.steady.timeline;
    let highest = timeline
        .iter()
        .map(|s| s.accepted.max(s.relayed).max(s.invoiced))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "throughput at a steady {} orders/s",
                results.settings.steady_rate
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..timeline.len().max(1) as f64, 0.0..highest * 1.2)
        .map_err(chart_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("per second")
        .draw()
        .map_err(chart_error)?;
    let series: [(&str, RGBColor, Field); 3] = [
        ("orders accepted", BLUE, |s| s.accepted),
        ("events relayed", GREEN, |s| s.relayed),
        ("invoices", RED, |s| s.invoiced),
    ];
    for (label, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                timeline.iter().map(|s| (s.t as f64, value(s) as f64)),
                color.stroke_width(2),
            ))
            .map_err(chart_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(chart_error)?;
    root.present().map_err(chart_error)?;
    Ok(())
}

/// Reads one count of a second of the timeline.
type Field = fn(&super::http::Second) -> u64;

fn chart_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart: {error}")
}
