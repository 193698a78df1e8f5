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

/// Values of `dt` as stored (bf16 rounds), and their bytes.
pub fn stored(dt: reinforge_cuda::DType, v: &[f32]) -> (Vec<f32>, Vec<u8>) {
    match dt {
        reinforge_cuda::DType::F32 => (v.to_vec(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        reinforge_cuda::DType::Bf16 => {
            let b: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            (b.iter().map(|x| x.to_f32()).collect(), b.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect())
        }
    }
}

/// `n` values of `dt` at `p`, as f32.
pub fn download(gpu: &reinforge_cuda::Gpu, dt: reinforge_cuda::DType, p: reinforge_cuda::DevPtr, n: usize) -> Vec<f32> {
    match dt {
        reinforge_cuda::DType::F32 => gpu.to_vec::<f32>(p, n).expect("download"),
        reinforge_cuda::DType::Bf16 => gpu.to_vec::<u16>(p, n).expect("download").into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
    }
}
