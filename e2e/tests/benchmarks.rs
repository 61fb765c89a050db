//! BENCHMARKS.md is what the benchmark writes from the runs kept in `docs/bench/`, not a table
//! edited by hand: regenerated here and compared.

use std::path::Path;

use e2e::bench::{Results, report};

#[test]
fn benchmarks_md_is_written_from_the_kept_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<_> = std::fs::read_dir(root.join("docs/bench"))
        .expect("docs/bench/ holds the runs BENCHMARKS.md shows")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    // The order the shell gives docs/bench/*.json.
    files.sort();
    assert!(!files.is_empty(), "no run in docs/bench/");
    let runs: Vec<Results> = files
        .iter()
        .map(|path| {
            let json = std::fs::read(path).unwrap();
            serde_json::from_slice(&json)
                .unwrap_or_else(|e| panic!("{}: not a results.json: {e}", path.display()))
        })
        .collect();
    let written = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap();
    assert!(
        written == report::markdown(&runs),
        "BENCHMARKS.md is not what the benchmark writes from docs/bench/*.json; regenerate it: \
         cargo run --release -p e2e --bin bench -- --markdown BENCHMARKS.md docs/bench/*.json"
    );
}
