//! The kernel sources (CUDA C, embedded in the binary), which kernels each file exports, and
//! their compilation by NVRTC at first use, cached on disk.
//!
//! The cache key is the SHA-256 of the sources, the architecture, NVRTC's version and the
//! options, so an upgraded binary or toolkit never runs a stale kernel.

use crate::error::{CudaError, Result};
use crate::gpu::nvrtc::{Nvrtc, Output};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// One `.cu` file.
pub struct Source {
    /// File name, as NVRTC reports it in errors.
    pub file: &'static str,
    /// Its text.
    pub text: &'static str,
}

/// Included by every kernel file.
pub const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

macro_rules! sources {
    ($($f:literal),* $(,)?) => { &[$(Source { file: $f, text: include_str!(concat!("../kernels/", $f)) }),*] };
}

/// Every kernel file (build.rs compiles the same list for the emulator).
pub const SOURCES: &[Source] = sources!["rmsnorm.cu", "elementwise.cu", "attention.cu", "attention_tc.cu", "head.cu", "optim.cu", "paged.cu", "sample.cu"];

/// NVRTC options beyond the architecture (part of the cache key).
const OPTIONS: &[&str] = &["-lineinfo", "-DRF_CUDA"];

/// The `extern "C"` kernels a source exports: `name_f32` and `name_bf16` for each
/// `RF_TYPED(name, …)`, `name_d16` … `name_d128` for each `RF_HEAD_DIMS(name, …)`, and
/// `name` for each `RF_KERNEL void name(…)` (or `RF_KERNEL void __launch_bounds__(…) name(…)`).
pub fn exported(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let line = line.trim_start();
        if line.starts_with("#define") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("RF_TYPED(") {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.push(format!("{name}_f32"));
            out.push(format!("{name}_bf16"));
        } else if let Some(rest) = line.strip_prefix("RF_HEAD_DIMS(") {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.extend(crate::ops::TC_HEAD_DIMS.iter().map(|d| format!("{name}_d{d}")));
        } else if let Some(rest) = line.strip_prefix("RF_KERNEL void ") {
            // `RF_KERNEL void __launch_bounds__(…) name(…)`: the name follows the bounds.
            let rest = match rest.strip_prefix("__launch_bounds__(") {
                Some(b) => b.split_once(')').map_or("", |(_, after)| after.trim_start()),
                None => rest,
            };
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.push(name);
        }
    }
    out
}

/// The source that exports `kernel`.
pub fn source_of(kernel: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| exported(s.text).iter().any(|k| k == kernel))
}

fn cache_dir() -> Option<PathBuf> {
    reinforge_assets::registry::default_cache_root().ok().map(|r| r.join("cuda-kernels"))
}

/// A cubin of `src` for `arch` (`sm_90`, ...), from the disk cache or compiled now.
pub fn cubin(src: &Source, arch: &str) -> Result<Vec<u8>> {
    let nvrtc = Nvrtc::get()?;
    let (major, minor) = nvrtc.version()?;
    let mut h = Sha256::new();
    for part in [PRELUDE, src.text, arch, &format!("nvrtc {major}.{minor}"), &OPTIONS.join(" ")] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let path = cache_dir().map(|d| d.join(format!("{}-{arch}-{}.cubin", src.file.trim_end_matches(".cu"), &key[..16])));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let started = std::time::Instant::now();
    let Output::Cubin(bytes) = nvrtc.compile(src.file, src.text, &[("prelude.cuh", PRELUDE)], arch, OPTIONS)? else {
        return Err(CudaError::Request(format!("NVRTC gave PTX for {arch}, expected a cubin")));
    };
    tracing::debug!("compiled {} for {arch} in {:.1}s", src.file, started.elapsed().as_secs_f64());
    if let Some(path) = path {
        // A cache that cannot be written costs a recompile next time, nothing more.
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!("cannot cache compiled kernels at {}: {e}", path.display());
        }
    }
    Ok(bytes)
}

/// One file's compile check: output size and the entry points found in it.
#[derive(Debug)]
pub struct Checked {
    /// The `.cu` file.
    pub file: &'static str,
    /// Bytes of PTX (a virtual architecture) or of cubin (a real one).
    pub bytes: usize,
    /// Kernels exported.
    pub kernels: usize,
}

/// Compiles every source for `arch` and checks that each exported kernel is in the output:
/// to PTX for a virtual architecture (`compute_80`, ...; the check CI runs), or to cubins for
/// a real one (`sm_90`, ...), written to the disk cache the engine loads them from, so a GPU
/// node whose cache directory was filled beforehand compiles nothing at start. Needs NVRTC,
/// not a GPU.
pub fn check_all(arch: &str) -> Result<Vec<Checked>> {
    let nvrtc = Nvrtc::get()?;
    SOURCES
        .iter()
        .map(|src| {
            // How each output names a kernel: PTX declares its entries; a cubin is an ELF file,
            // whose symbol names are NUL-terminated strings in it.
            let (bytes, what, named): (Vec<u8>, &str, fn(&str) -> String) = if arch.starts_with("sm_") {
                (cubin(src, arch)?, "cubin", |k| format!("{k}\0"))
            } else {
                let Output::Ptx(ptx) = nvrtc.compile(src.file, src.text, &[("prelude.cuh", PRELUDE)], arch, OPTIONS)? else {
                    return Err(CudaError::Request(format!("NVRTC gave a cubin for {arch}, expected PTX")));
                };
                (ptx.into_bytes(), "PTX", |k| format!(".entry {k}("))
            };
            let kernels = exported(src.text);
            let missing = kernels.iter().find(|k| {
                let name = named(k);
                !bytes.windows(name.len()).any(|w| w == name.as_bytes())
            });
            if let Some(k) = missing {
                return Err(CudaError::Compile { file: src.file.into(), arch: arch.into(), log: format!("kernel {k} is missing from the {what}") });
            }
            Ok(Checked { file: src.file, bytes: bytes.len(), kernels: kernels.len() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exported_kernel_is_found_and_in_the_emulator() {
        let mut n = 0;
        for src in SOURCES {
            for k in exported(src.text) {
                assert!(k.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) && !k.starts_with("__"), "{}: parsed `{k}` as a kernel name", src.file);
                assert!(crate::gpu::emulator_has_kernel(&k), "{}: `{k}` is not in the emulator's registry", src.file);
                assert_eq!(source_of(&k).map(|s| s.file), Some(src.file));
                n += 1;
            }
        }
        assert!(source_of("sample_rows").is_some(), "a kernel with launch bounds");
        assert!(n >= 66, "{n} kernels");
    }
}
