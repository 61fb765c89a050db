//! The backlog past the count's limit: pending events are estimated from probes of the
//! sequence numbers they span (one at random in each of equal parts of the span), with a 99.9%
//! interval, so that a million waiting events reads as about a million and not as the limit,
//! at the cost of a fixed number of index look-ups.

/// Sequence numbers probed per estimate: within a few percent when the backlog fills a good
/// share of its span, and a bounded cost whatever the backlog.
pub(crate) const PROBES: i64 = 1_000;

/// The normal quantile of the interval the margin spans: 99.9%, so that the truth falls
/// outside it about once in a thousand reads.
const Z: f64 = 3.29;

/// Fewer hits than this leave the estimate too coarse: the caller narrows the span and probes
/// again.
pub(crate) const PRECISE_HITS: i64 = 400;

/// An estimate of a count, and how far from it the truth may be (99.9% interval, half-width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Estimate {
    pub count: i64,
    pub margin: i64,
}

/// The count of pending events in a span of `span` sequence numbers of which `hits` of
/// `probes` draws were pending, knowing there are at least `at_least`: the Wilson interval of
/// the share (as if the draws were independent, which the split into parts only narrows),
/// scaled to the span and held within what is known.
pub(crate) fn estimate(span: i64, probes: i64, hits: i64, at_least: i64) -> Estimate {
    if probes <= 0 || span <= 0 {
        return Estimate {
            count: at_least,
            margin: 0,
        };
    }
    let (n, z) = (probes as f64, Z);
    let share = (hits as f64 / n).clamp(0.0, 1.0);
    let z2 = z * z;
    let centre = (share + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (share * (1.0 - share) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    let (span_f, known) = (span as f64, at_least as f64);
    let (mut low, mut high) = ((centre - half) * span_f, (centre + half) * span_f);
    if high < known {
        // The draws missed what the count found: keep the interval's width above it.
        (low, high) = (known, known + (high - low));
    }
    let low = low.max(known);
    let high = high.min(span_f).max(low);
    let count = (share * span_f).clamp(low, high);
    Estimate {
        count: count.round() as i64,
        margin: (count - low).max(high - count).round() as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_span_is_estimated_closely() {
        let e = estimate(1_000_000, PROBES, PROBES, 10_000);
        assert_eq!(e.count, 1_000_000);
        assert!(e.margin <= 15_000, "{e:?}");
    }

    #[test]
    fn half_a_span_is_estimated_within_ten_percent() {
        let e = estimate(1_000_000, PROBES, PROBES / 2, 10_000);
        assert_eq!(e.count, 500_000);
        assert!(e.margin <= 60_000, "{e:?}");
    }

    #[test]
    fn the_estimate_never_falls_below_what_was_counted() {
        let e = estimate(1_000_000, PROBES, 0, 10_000);
        assert_eq!(e.count, 10_000);
        assert!(e.margin > 0, "a share of no hits is uncertain: {e:?}");
    }

    #[test]
    fn the_estimate_never_exceeds_the_span() {
        let e = estimate(12_000, PROBES, PROBES, 10_000);
        assert!(e.count <= 12_000 && e.count >= 10_000, "{e:?}");
        assert!(e.count + e.margin >= 12_000 - 100, "{e:?}");
    }

    #[test]
    fn nothing_to_probe_gives_what_was_counted() {
        assert_eq!(
            estimate(0, PROBES, 0, 10_000),
            Estimate {
                count: 10_000,
                margin: 0
            }
        );
    }
}
