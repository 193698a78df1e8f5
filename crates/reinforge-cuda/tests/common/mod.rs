//! Shared helpers for the CUDA engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `shared/fixtures`, beside the checkout (overridable for unusual layouts).
pub fn fixtures() -> PathBuf {
    std::env::var_os("REINFORGE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"))
}

pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("int") as u32).collect()
}

pub fn f32s(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("float") as f32).collect()
}
