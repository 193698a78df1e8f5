//! Finding CUDA's shared libraries at run time, on a node with a system toolkit or one whose
//! CUDA comes from pip wheels (`site-packages/nvidia/*/lib`, where PyTorch and Ray's GPU
//! images put it).
//!
//! Nothing CUDA is linked at build time. The driver (`libcuda.so.1`) comes with the GPU
//! driver and is found by the dynamic loader; cuBLASLt, NVRTC and NCCL are found here, in
//! this order:
//! 1. `REINFORGE_CUDA_LIB_DIRS` (colon-separated), when set, and nothing else;
//! 2. `$CUDA_HOME`/`$CUDA_PATH`, `/usr/local/cuda`;
//! 3. `nvidia/*/lib` in the site-packages of the Python that owns Ray (`REINFORGE_RAY`, `ray`
//!    on `PATH`), of `$VIRTUAL_ENV`, `$CONDA_PREFIX` and of `python3` on `PATH`;
//! 4. the dynamic loader's own search (`LD_LIBRARY_PATH`, `ldconfig`).
//!
//! Each library is opened by its full path and kept open for the life of the process, so its
//! own dependencies (`libnvrtc-builtins`) resolve against the same directory.

use crate::error::{CudaError, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A CUDA library the engine loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLib {
    /// cuBLASLt: the GEMMs.
    CublasLt,
    /// NVRTC: compiles our kernels at first use.
    Nvrtc,
    /// NCCL: gradient all-reduce and weight broadcast between GPUs.
    Nccl,
}

impl CudaLib {
    /// File names to try, preferred first.
    fn file_names(self) -> &'static [&'static str] {
        match self {
            Self::CublasLt => &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
            Self::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            Self::Nccl => &["libnccl.so.2", "libnccl.so"],
        }
    }

    /// Whether file `name` is built for a CUDA major version newer than `driver_major`
    /// (`libnvrtc.so.13` on a CUDA 12 driver): such a copy could not run here, and another
    /// further down the search may. NCCL's `.so.2` is its own version, not CUDA's.
    fn newer_than(self, name: &str, driver_major: u32) -> bool {
        let cuda_versioned = matches!(self, Self::CublasLt | Self::Nvrtc);
        let major = name.rsplit_once(".so.").and_then(|(_, v)| v.parse::<u32>().ok());
        cuda_versioned && driver_major > 0 && major.is_some_and(|m| m > driver_major)
    }

    /// The pip package that ships it, for the error message.
    fn wheel(self) -> &'static str {
        match self {
            Self::CublasLt => "nvidia-cublas",
            Self::Nvrtc => "nvidia-cuda-nvrtc",
            Self::Nccl => "nvidia-nccl-cu13",
        }
    }
}

/// A library opened from a known file.
pub struct Loaded {
    /// The file it was loaded from (`None`: found by the dynamic loader's own search).
    pub path: Option<PathBuf>,
    /// The open library.
    pub lib: libloading::Library,
}

/// The CUDA major version the GPU driver supports, once a device is opened (0: not known,
/// e.g. compiling kernels on a machine without a GPU).
static DRIVER_MAJOR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Skips, from now on, library files built for a CUDA major version newer than the driver's.
pub fn limit_to_driver(cuda_major: u32) {
    DRIVER_MAJOR.store(cuda_major, std::sync::atomic::Ordering::Relaxed);
}

/// Directories searched for CUDA libraries, in order, with where each came from.
pub fn search_dirs() -> Vec<PathBuf> {
    if let Some(dirs) = std::env::var_os("REINFORGE_CUDA_LIB_DIRS") {
        return std::env::split_paths(&dirs).filter(|p| !p.as_os_str().is_empty()).collect();
    }
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    for sp in site_packages() {
        if let Ok(rd) = std::fs::read_dir(sp.join("nvidia")) {
            let mut found: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path().join("lib")).filter(|p| p.is_dir()).collect();
            found.sort();
            dirs.extend(found);
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
    dirs
}

/// The site-packages directories of the Pythons a CUDA wheel may be installed in.
fn site_packages() -> Vec<PathBuf> {
    static CACHE: OnceLock<Vec<PathBuf>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let mut pythons: Vec<PathBuf> = Vec::new();
            let mut sibling_python = |bin: &Path| {
                if let Some(dir) = bin.parent() {
                    for name in ["python3", "python"] {
                        let p = dir.join(name);
                        if p.exists() {
                            pythons.push(p);
                            break;
                        }
                    }
                }
            };
            if let Some(ray) = std::env::var_os("REINFORGE_RAY") {
                sibling_python(Path::new(&ray));
            }
            if let Some(ray) = which("ray") {
                sibling_python(&ray);
            }
            for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
                if let Some(root) = std::env::var_os(var) {
                    sibling_python(&PathBuf::from(root).join("bin").join("python3"));
                }
            }
            if let Some(p) = which("python3") {
                pythons.push(p);
            }
            let mut out = Vec::new();
            for py in pythons {
                let script = "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
                if let Ok(o) = std::process::Command::new(&py).args(["-c", script]).stderr(std::process::Stdio::null()).output() {
                    out.extend(String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from));
                }
            }
            let mut seen = std::collections::HashSet::new();
            out.retain(|p| p.is_dir() && seen.insert(p.clone()));
            out
        })
        .clone()
}

/// The first executable called `name` on `PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Opens `lib`: the first of its file names in the first search directory that has one,
/// else through the dynamic loader's search.
pub fn load(lib: CudaLib) -> Result<Loaded> {
    let dirs = search_dirs();
    let driver_major = DRIVER_MAJOR.load(std::sync::atomic::Ordering::Relaxed);
    let mut skipped = Vec::new();
    for dir in &dirs {
        for name in lib.file_names() {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            if lib.newer_than(name, driver_major) {
                skipped.push(path.display().to_string());
                continue;
            }
            if lib == CudaLib::Nvrtc {
                preload_nvrtc_builtins(dir);
            }
            // SAFETY: loading a CUDA library runs its initialisers, which only set up its own state.
            match unsafe { libloading::Library::new(&path) } {
                Ok(l) => return Ok(Loaded { path: Some(path), lib: l }),
                Err(e) => tracing::warn!("cannot load {}: {e}", path.display()),
            }
        }
    }
    let from_env = std::env::var_os("REINFORGE_CUDA_LIB_DIRS").is_some();
    if !from_env {
        for name in lib.file_names().iter().filter(|n| !lib.newer_than(n, driver_major)) {
            // SAFETY: as above.
            if let Ok(l) = unsafe { libloading::Library::new(name) } {
                return Ok(Loaded { path: None, lib: l });
            }
        }
    }
    let mut searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    if from_env {
        searched.insert(0, "REINFORGE_CUDA_LIB_DIRS:".into());
    } else {
        searched.push("the dynamic loader's path (LD_LIBRARY_PATH, ldconfig)".into());
    }
    if !skipped.is_empty() {
        searched.push(format!("skipping {} (built for a CUDA newer than the driver's {driver_major})", skipped.join(", ")));
    }
    Err(CudaError::MissingLibrary {
        lib: lib.file_names()[0].to_string(),
        searched: if searched.is_empty() { "nowhere: REINFORGE_CUDA_LIB_DIRS is empty".into() } else { searched.join(", ") },
        fix: format!(
            "install the CUDA toolkit, or `pip install {}` into the Python that runs Ray, or set \
             REINFORGE_CUDA_LIB_DIRS to the directory that holds it",
            lib.wheel()
        ),
    })
}

/// NVRTC loads `libnvrtc-builtins.so.<ver>` by bare name at its first compile; a pip wheel's
/// copy is not on the loader's path, so it is opened first by full path (and kept open), after
/// which the loader finds it by its soname.
fn preload_nvrtc_builtins(dir: &Path) {
    static KEEP: OnceLock<Vec<libloading::Library>> = OnceLock::new();
    KEEP.get_or_init(|| {
        let mut keep = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.filter_map(|e| e.ok()) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.") {
                    // SAFETY: as in `load`. RTLD_GLOBAL so the soname is visible to later dlopens.
                    let lib = unsafe { libloading::os::unix::Library::open(Some(e.path()), libc_rtld_now_global()) };
                    if let Ok(l) = lib {
                        keep.push(libloading::Library::from(l));
                    }
                }
            }
        }
        keep
    });
}

fn libc_rtld_now_global() -> std::ffi::c_int {
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

/// Whether the CUDA driver library can be opened (probed before cudarc touches it, because
/// cudarc panics when it is missing).
pub fn driver_present() -> bool {
    // SAFETY: only probes whether the library loads.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The CUDA version the installed driver supports, as (major, minor); `None` without a driver.
/// Needs no GPU and no initialisation, so it can say which libraries the engine would pick
/// before a device is opened.
pub fn driver_cuda_version() -> Option<(u32, u32)> {
    if !driver_present() {
        return None;
    }
    let mut v = 0i32;
    // SAFETY: a valid out-pointer; cuDriverGetVersion needs no cuInit.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result().ok()?;
    (v > 0).then_some((v as u32 / 1000, v as u32 % 1000 / 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_for_a_newer_cuda_than_the_driver_are_skipped() {
        assert!(CudaLib::Nvrtc.newer_than("libnvrtc.so.13", 12));
        assert!(!CudaLib::Nvrtc.newer_than("libnvrtc.so.12", 12));
        assert!(!CudaLib::CublasLt.newer_than("libcublasLt.so.13", 13));
        // Unversioned names and an unknown driver keep every file; NCCL's .so.2 is not CUDA's.
        assert!(!CudaLib::CublasLt.newer_than("libcublasLt.so", 12));
        assert!(!CudaLib::Nvrtc.newer_than("libnvrtc.so.13", 0));
        assert!(!CudaLib::Nccl.newer_than("libnccl.so.2", 1));
    }
}
