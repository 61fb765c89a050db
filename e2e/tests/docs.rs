//! The generated documents are what the code they describe gives today (`e2e::docs`).

#[test]
fn the_configuration_reference_is_generated_from_the_settings() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(e2e::docs::CONFIGURATION);
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == e2e::docs::configuration(),
        "{} is not what the settings give: run `cargo run -p e2e --bin docs`",
        e2e::docs::CONFIGURATION
    );
}

/// The documents that may not state a figure of their own: BENCHMARKS.md is where figures come
/// from, and the others link to it.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/design.md",
    "docs/development.md",
    "docs/glossary.md",
    "docs/messages.md",
    "docs/operations.md",
    "docs/performance.md",
    "docs/upgrading.md",
    "outbox-core/README.md",
];

/// Units of the figures the benchmark measures.
const RATES: &[&str] = &[
    "tx/s",
    "tps",
    "orders/s",
    "events/s",
    "invoices/s",
    "invoiced/s",
    "msgs/s",
    "messages/s",
    "rows/s",
];

/// The measured figures `text` states: rates, percentages, and latencies in milliseconds, each
/// as written (its number).
fn figures(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let number = |word: &str| {
        let trimmed = word.trim_start_matches(['(', '~', '≈', '*']);
        let digits = trimmed.trim_end_matches(|c: char| !c.is_ascii_digit());
        (!digits.is_empty()
            && digits
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, ',' | '.' | '–' | '-')))
        .then(|| digits.to_owned())
    };
    let mut found = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or_default();
        let unit = next.trim_end_matches(['.', ',', ';', ':', ')', '*']);
        let measured = word
            .trim_end_matches(['.', ',', ';', ':', ')', '*'])
            .ends_with('%')
            || RATES.contains(&unit)
            || (unit == "ms"
                && i > 0
                && words[i - 1]
                    .strip_prefix('p')
                    .is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())));
        if measured && let Some(figure) = number(word) {
            found.push(figure);
        }
    }
    found
}

/// Whether `text` states `figure` as a number of its own (not as the start of a longer one).
fn holds(text: &str, figure: &str) -> bool {
    text.match_indices(figure).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let mut after = text[at + figure.len()..].chars();
        let (next, then) = (after.next(), after.next());
        let longer_before = before.is_some_and(|c| c.is_ascii_digit() || c == '.' || c == ',');
        let longer_after = next.is_some_and(|c| c.is_ascii_digit())
            || (matches!(next, Some('.' | ',')) && then.is_some_and(|c| c.is_ascii_digit()));
        !longer_before && !longer_after
    })
}

#[test]
fn no_document_states_a_figure_benchmarks_md_does_not_hold() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let benchmarks = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap();
    let mut strays = Vec::new();
    for document in DOCUMENTS {
        let text = std::fs::read_to_string(root.join(document)).unwrap();
        for figure in figures(&text) {
            if !holds(&benchmarks, &figure) {
                strays.push(format!("{document}: {figure}"));
            }
        }
    }
    assert!(
        strays.is_empty(),
        "figures that BENCHMARKS.md does not hold (link to it instead):\n{}",
        strays.join("\n")
    );
}

#[test]
fn a_figure_is_held_only_as_a_number_of_its_own() {
    assert!(holds("drain 48% of raw", "48"));
    assert!(!holds("drain 48.5% of raw", "48"));
    assert!(!holds("3,315 tx/s", "315"));
}

#[test]
fn figures_are_found_as_written() {
    assert_eq!(
        figures("ran at 3,315 tx/s (48% of it), p99 4.5 ms; a 500 ms poll"),
        ["3,315", "48", "4.5"]
    );
}
