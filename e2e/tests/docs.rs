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
