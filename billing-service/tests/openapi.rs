//! The generated OpenAPI document matches the committed snapshot. After an intended API
//! change, regenerate it with `UPDATE_SNAPSHOTS=1 cargo test -p billing-service --test openapi`.

#[test]
fn openapi_matches_snapshot() {
    let generated = billing_service::startup::openapi()
        .to_pretty_json()
        .unwrap()
        + "\n";
    service_kit::testing::assert_refs_resolve(&generated);
    service_kit::testing::assert_snapshot(
        concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json"),
        &generated,
    );
}
