//! The generated OpenAPI document matches the committed snapshot. After an intended API
//! change, regenerate it with `UPDATE_SNAPSHOTS=1 cargo test -p billing-service --test openapi`.

#[test]
fn openapi_matches_snapshot() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    let generated = billing_service::startup::openapi()
        .to_pretty_json()
        .unwrap()
        + "\n";
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi.json is out of date; see this test's doc comment"
    );
}
