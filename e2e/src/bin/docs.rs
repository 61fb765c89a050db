//! Writes the documents generated from the code (see `e2e::docs`), from the workspace's root.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::write(
        root.join(e2e::docs::CONFIGURATION),
        e2e::docs::configuration(),
    )
}
