//! `sqlx::migrate!` embeds the migrations when the crate is compiled: compile again when one
//! changes.

fn main() {
    println!("cargo:rerun-if-changed=../migrations/ops");
}
