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
pub const SOURCES: &[Source] = sources!["rmsnorm.cu", "elementwise.cu", "attention.cu", "attention_tc.cu", "head.cu", "optim.cu", "paged.cu", "sample.cu", "decode_linear.cu"];

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

/// Where the disk cache keeps `src`'s cubin for `arch` under this NVRTC (None without a home).
fn cache_path(nvrtc: &Nvrtc, src: &Source, arch: &str) -> Result<Option<PathBuf>> {
    let (major, minor) = nvrtc.version()?;
    let mut h = Sha256::new();
    for part in [PRELUDE, src.text, arch, &format!("nvrtc {major}.{minor}"), &OPTIONS.join(" ")] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(cache_dir().map(|d| d.join(format!("{}-{arch}-{}.cubin", src.file.trim_end_matches(".cu"), &key[..16]))))
}

/// Stores a cubin in the disk cache, written aside and renamed: a cache that cannot be written
/// costs a recompile next time, nothing more.
fn store(path: &std::path::Path, bytes: &[u8]) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        tracing::warn!("cannot cache compiled kernels at {}: {e}", path.display());
    }
}

/// A cubin of `src` for `arch` (`sm_90`, ...), from the disk cache or compiled now.
pub fn cubin(src: &Source, arch: &str) -> Result<Vec<u8>> {
    let nvrtc = Nvrtc::get()?;
    let path = cache_path(nvrtc, src, arch)?;
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let started = std::time::Instant::now();
    let Output::Cubin(bytes) = nvrtc.compile(src.file, src.text, &[("prelude.cuh", PRELUDE)], arch, OPTIONS)? else {
        return Err(CudaError::Request(format!("NVRTC gave PTX for {arch}, expected a cubin")));
    };
    tracing::debug!("compiled {} for {arch} in {:.1}s", src.file, started.elapsed().as_secs_f64());
    if let Some(path) = path {
        store(&path, &bytes);
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

/// A kernel's share of an SM, as ptxas reports it for a real architecture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// The kernel's name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame per thread (local memory: arrays indexed at run time, spills).
    pub stack_bytes: u32,
    /// Bytes of registers spilled to local memory and loaded back, per thread.
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Bytes of static shared memory per block (the attention kernels ask for theirs at
    /// launch, which is not counted here).
    pub smem_bytes: u32,
    /// A device function that was not inlined, not a kernel: ptxas gives its stack and spills
    /// (its callers'), not its registers.
    pub device_function: bool,
}

impl Resources {
    /// Whether registers spill to local memory (slow: it is cached DRAM).
    pub fn spills(&self) -> bool {
        self.spill_store_bytes + self.spill_load_bytes > 0
    }
}

/// Each kernel's resources from ptxas's verbose report (NVRTC's log with
/// `--ptxas-options=-v`): `Compiling entry function 'k'`, then the stack and spill line of
/// `Function properties for k`, then `Used N registers, …, M bytes smem, …`. A device
/// function that was not inlined has a properties block of its own, after its caller's: it is
/// listed too ([`Resources::device_function`]), since its spills are its callers'. A kernel whose
/// stack line or register count is not found is left out (a report in another format then
/// misses kernels, which [`resources`] refuses, rather than reading as no spills).
pub fn parse_ptxas_report(log: &str) -> Vec<Resources> {
    // The number before `what` in a comma-separated list (`N bytes spill stores`).
    fn before(text: &str, what: &str) -> Option<u32> {
        text.split(',').find_map(|part| part.trim().strip_suffix(what)?.trim().parse().ok())
    }
    let mut out = Vec::new();
    // The entry being read, and whether its stack line was; whose properties block this is.
    let (mut entry, mut props_for): (Option<(Resources, bool)>, Option<String>) = (None, None);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            entry = Some((Resources { kernel: name.to_string(), ..Default::default() }, false));
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props_for = Some(rest.trim().to_string());
        } else if line.contains("bytes stack frame") {
            let text = line.trim_start_matches(|c: char| c != ' ').trim_start_matches([' ', '.']);
            let (Some(stack_bytes), Some(spill_store_bytes), Some(spill_load_bytes)) =
                (before(text, "bytes stack frame"), before(text, "bytes spill stores"), before(text, "bytes spill loads"))
            else {
                continue;
            };
            let read = Resources { stack_bytes, spill_store_bytes, spill_load_bytes, ..Default::default() };
            match (entry.as_mut(), props_for.take()) {
                (Some((e, seen)), Some(name)) if name == e.kernel => {
                    // Its `Used` line (registers, shared memory) comes after this one.
                    *e = Resources { kernel: name, ..read };
                    *seen = true;
                }
                (_, Some(name)) => out.push(Resources { kernel: name, device_function: true, ..read }),
                (_, None) => {}
            }
        } else if let Some(rest) = line.split("Used ").nth(1) {
            if let Some((mut e, true)) = entry.take() {
                if let Some(registers) = before(rest, "registers") {
                    e.registers = registers;
                    e.smem_bytes = before(rest, "bytes smem").unwrap_or(0);
                    out.push(e);
                }
            }
        }
    }
    out
}

/// Compiles every source for a real architecture (`sm_90`, ...) with ptxas's report and returns
/// each file's kernels' resources; every exported kernel must be in it. The cubins go to the
/// disk cache, so a [`check_all`] after this compiles nothing again: asking for the report
/// changes nothing in them but the ptxas command line their notes record (`-v` added;
/// checked byte for byte with NVRTC 13.0).
pub fn resources(arch: &str) -> Result<Vec<(&'static str, Vec<Resources>)>> {
    if !arch.starts_with("sm_") {
        return Err(CudaError::Request(format!("--resources needs a real architecture (sm_80, sm_90, ...), not {arch}: ptxas reports registers for the GPU it compiles for")));
    }
    let nvrtc = Nvrtc::get()?;
    let mut opts = OPTIONS.to_vec();
    opts.push("--ptxas-options=-v");
    SOURCES
        .iter()
        .map(|src| {
            let (output, log) = nvrtc.compile_logged(src.file, src.text, &[("prelude.cuh", PRELUDE)], arch, &opts)?;
            if let (Output::Cubin(bytes), Some(path)) = (output, cache_path(nvrtc, src, arch)?) {
                store(&path, &bytes);
            }
            let found = parse_ptxas_report(&log);
            if let Some(k) = exported(src.text).into_iter().find(|k| !found.iter().any(|r| &r.kernel == k && !r.device_function)) {
                return Err(CudaError::Compile { file: src.file.into(), arch: arch.into(), log: format!("ptxas reported no resources for kernel {k}") });
            }
            Ok((src.file, found))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_are_read_per_entry_and_skip_device_functions() {
        // NVRTC 13.0's log for sm_90 (`--ptxas-options=-v`), with a kernel that spills and a
        // device function that was not inlined.
        let log = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'decode_attn_bf16' for 'sm_90'
ptxas info    : Function properties for decode_attn_bf16
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 400 bytes smem
ptxas info    : Function properties for _Z6helperPf
ptxas         .     64 bytes stack frame, 64 bytes spill stores, 64 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 256 bytes cumulative stack size
ptxas info    : Compile time = 73.912 ms";
        let r = parse_ptxas_report(log);
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(r[0], Resources { kernel: "decode_attn_bf16".into(), registers: 128, smem_bytes: 400, ..Default::default() });
        assert!(!r[0].spills());
        let helper = Resources { kernel: "_Z6helperPf".into(), stack_bytes: 64, spill_store_bytes: 64, spill_load_bytes: 64, device_function: true, ..Default::default() };
        assert_eq!(r[1], helper);
        assert!(r[1].spills());
        assert_eq!(r[2], Resources { kernel: "k".into(), registers: 32, stack_bytes: 256, spill_store_bytes: 8, spill_load_bytes: 12, ..Default::default() });
        assert!(r[2].spills());
        // A report whose stack line or register count reads otherwise leaves the kernel out.
        let drifted = log.replace("bytes spill loads", "bytes spilled loads").replace("Used 32 registers", "Used 32 regs");
        let r = parse_ptxas_report(&drifted);
        assert!(r.iter().all(|r| r.kernel != "k" && r.kernel != "decode_attn_bf16"), "{r:?}");
    }

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
