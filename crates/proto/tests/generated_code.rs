//! Guards the checked-in prost code against drift from `proto/konnectivity.proto`.
//!
//! The build never needs protoc: this test compiles the proto with the pure-Rust `protox`
//! and renders it with `prost-build`. Set `TETHER_REGENERATE=1` to rewrite the checked-in file.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn generated_code_matches_proto() {
    let root = workspace_root();
    let fds =
        protox::compile(["konnectivity.proto"], [root.join("proto")]).expect("proto compiles");
    let out = tempfile::tempdir().expect("tempdir");
    prost_build::Config::new()
        .bytes(["."])
        .out_dir(out.path())
        .compile_fds(fds)
        .expect("prost-build renders the descriptor set");
    // A package-less proto renders into `_.rs`.
    let fresh = std::fs::read_to_string(out.path().join("_.rs")).expect("generated file");
    let checked_in_path = root.join("crates/proto/src/gen/konnectivity.rs");
    if std::env::var_os("TETHER_REGENERATE").is_some() {
        std::fs::write(&checked_in_path, &fresh).expect("write generated code");
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "crates/proto/src/gen/konnectivity.rs is stale; rerun with TETHER_REGENERATE=1"
    );
}
