//! NVRTC, bound to the library file [`crate::libs`] found (cudarc's own loader searches only
//! the dynamic loader's path, and would not honour `REINFORGE_CUDA_LIB_DIRS`); its types come
//! from cudarc.

use crate::error::{CudaError, Result};
use crate::libs::{self, CudaLib};
use cudarc::nvrtc::sys::{nvrtcProgram, nvrtcResult};
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

type CreateFn = unsafe extern "C" fn(*mut nvrtcProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> nvrtcResult;
type CompileFn = unsafe extern "C" fn(nvrtcProgram, c_int, *const *const c_char) -> nvrtcResult;
type DestroyFn = unsafe extern "C" fn(*mut nvrtcProgram) -> nvrtcResult;
type SizeFn = unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult;
type GetFn = unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> nvrtcResult;
type ErrStrFn = unsafe extern "C" fn(nvrtcResult) -> *const c_char;

/// The NVRTC entry points we use.
pub struct Nvrtc {
    _lib: libs::Loaded,
    create: CreateFn,
    compile: CompileFn,
    destroy: DestroyFn,
    log_size: SizeFn,
    log: GetFn,
    ptx_size: SizeFn,
    ptx: GetFn,
    cubin_size: SizeFn,
    cubin: GetFn,
    version: VersionFn,
    err_str: ErrStrFn,
    /// Where it was loaded from (for messages).
    pub path: String,
}

/// What a compile produces.
pub enum Output {
    /// PTX text (for a virtual architecture, `compute_XY`).
    Ptx(String),
    /// A cubin (for a real architecture, `sm_XY`).
    Cubin(Vec<u8>),
}

/// A program being compiled; destroyed on drop.
struct Program<'a> {
    api: &'a Nvrtc,
    prog: nvrtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once.
        unsafe { (self.api.destroy)(&mut self.prog) };
    }
}

impl Nvrtc {
    /// Loads NVRTC once per process.
    pub fn get() -> Result<&'static Nvrtc> {
        static API: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        API.get_or_init(|| Self::load().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|msg| CudaError::Request(msg.clone()))
    }

    fn load() -> Result<Nvrtc> {
        let loaded = libs::load(CudaLib::Nvrtc)?;
        let path = loaded.path.as_ref().map_or_else(|| "libnvrtc (loader path)".to_string(), |p| p.display().to_string());
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is NVRTC's public C API with the signature of the field's type.
                let s = unsafe { loaded.lib.get::<_>($name) }.map_err(|e| CudaError::Api {
                    call: String::from_utf8_lossy($name).into(),
                    msg: format!("{path} lacks it ({e}); it is too old or not NVRTC"),
                })?;
                *s
            }};
        }
        Ok(Nvrtc {
            create: sym!(b"nvrtcCreateProgram"),
            compile: sym!(b"nvrtcCompileProgram"),
            destroy: sym!(b"nvrtcDestroyProgram"),
            log_size: sym!(b"nvrtcGetProgramLogSize"),
            log: sym!(b"nvrtcGetProgramLog"),
            ptx_size: sym!(b"nvrtcGetPTXSize"),
            ptx: sym!(b"nvrtcGetPTX"),
            cubin_size: sym!(b"nvrtcGetCUBINSize"),
            cubin: sym!(b"nvrtcGetCUBIN"),
            version: sym!(b"nvrtcVersion"),
            err_str: sym!(b"nvrtcGetErrorString"),
            path,
            _lib: loaded,
        })
    }

    /// NVRTC's version (major, minor), which is the CUDA version it targets.
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out-pointers.
        self.check("nvrtcVersion", unsafe { (self.version)(&mut a, &mut b) })?;
        Ok((a, b))
    }

    fn check(&self, call: &str, r: nvrtcResult) -> Result<()> {
        if r == nvrtcResult::NVRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: NVRTC returns a static string for any result code.
        let msg = unsafe { CStr::from_ptr((self.err_str)(r)) }.to_string_lossy().into_owned();
        Err(CudaError::Api { call: call.into(), msg })
    }

    /// Compiles `src` (named `file`, with `headers` as (name, text)) for `arch`: `sm_XY` gives a
    /// cubin, `compute_XY` PTX.
    pub fn compile(&self, file: &str, src: &str, headers: &[(&str, &str)], arch: &str, extra: &[&str]) -> Result<Output> {
        self.compile_logged(file, src, headers, arch, extra).map(|(out, _)| out)
    }

    /// [`Nvrtc::compile`], with NVRTC's log of a compile that succeeded (ptxas's report among
    /// it when `extra` asks for one; empty if the log cannot be read, which fails no compile).
    pub fn compile_logged(&self, file: &str, src: &str, headers: &[(&str, &str)], arch: &str, extra: &[&str]) -> Result<(Output, String)> {
        let c = |s: &str| CString::new(s).map_err(|_| CudaError::Request(format!("{file}: NUL byte in kernel source")));
        let (csrc, cname) = (c(src)?, c(file)?);
        let hdr_src: Vec<CString> = headers.iter().map(|(_, t)| c(t)).collect::<Result<_>>()?;
        let hdr_name: Vec<CString> = headers.iter().map(|(n, _)| c(n)).collect::<Result<_>>()?;
        let hs: Vec<*const c_char> = hdr_src.iter().map(|s| s.as_ptr()).collect();
        let hn: Vec<*const c_char> = hdr_name.iter().map(|s| s.as_ptr()).collect();
        let mut prog: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and outlive the call; the arrays have
        // `headers.len()` entries.
        self.check("nvrtcCreateProgram", unsafe {
            (self.create)(&mut prog, csrc.as_ptr(), cname.as_ptr(), headers.len() as c_int, hs.as_ptr(), hn.as_ptr())
        })?;
        let prog = Program { api: self, prog };
        let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-default-device".into()];
        opts.extend(extra.iter().map(|s| s.to_string()));
        let copts: Vec<CString> = opts.iter().map(|o| c(o)).collect::<Result<_>>()?;
        let po: Vec<*const c_char> = copts.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: `po` holds `po.len()` valid C strings.
        let r = unsafe { (self.compile)(prog.prog, po.len() as c_int, po.as_ptr()) };
        if r != nvrtcResult::NVRTC_SUCCESS {
            return Err(CudaError::Compile { file: file.into(), arch: arch.into(), log: self.program_log(&prog)? });
        }
        if arch.starts_with("sm_") {
            let mut n = 0usize;
            // SAFETY: valid program and out-pointer.
            self.check("nvrtcGetCUBINSize", unsafe { (self.cubin_size)(prog.prog, &mut n) })?;
            let mut buf = vec![0u8; n];
            // SAFETY: `buf` has the size NVRTC reported.
            self.check("nvrtcGetCUBIN", unsafe { (self.cubin)(prog.prog, buf.as_mut_ptr().cast()) })?;
            Ok((Output::Cubin(buf), self.program_log(&prog).unwrap_or_default()))
        } else {
            let mut n = 0usize;
            // SAFETY: as above.
            self.check("nvrtcGetPTXSize", unsafe { (self.ptx_size)(prog.prog, &mut n) })?;
            let mut buf = vec![0u8; n];
            // SAFETY: as above.
            self.check("nvrtcGetPTX", unsafe { (self.ptx)(prog.prog, buf.as_mut_ptr().cast()) })?;
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            Ok((Output::Ptx(String::from_utf8_lossy(&buf[..end]).into_owned()), self.program_log(&prog).unwrap_or_default()))
        }
    }

    fn program_log(&self, prog: &Program<'_>) -> Result<String> {
        let mut n = 0usize;
        // SAFETY: valid program and out-pointer.
        self.check("nvrtcGetProgramLogSize", unsafe { (self.log_size)(prog.prog, &mut n) })?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` has the size NVRTC reported.
        self.check("nvrtcGetProgramLog", unsafe { (self.log)(prog.prog, buf.as_mut_ptr().cast()) })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_string())
    }
}
