//! Shared helpers for the integration tests. Tests run on the real weights
//! prepared by `selectinfer prepare-model` (the README's test command does
//! that first); a missing model is a test failure, not a skip.

#![allow(dead_code)]

use std::path::PathBuf;

/// The repository (workspace) root: this file is shared by the tests of
/// the workspace's crates, whose manifests lie below it.
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("package.xml").is_file())
        .unwrap_or(&here)
        .to_path_buf()
}

/// Folder of a prepared model under `models/` (or `$SELECTINFER_MODELS`).
pub fn model_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("SELECTINFER_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"));
    let dir = base.join(name);
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is not prepared: run `cargo run --release -- prepare-model {name}` (the test script does)",
        dir.display()
    );
    dir
}

pub fn fixture(name: &str) -> serde_json::Value {
    let path = repo_root().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
