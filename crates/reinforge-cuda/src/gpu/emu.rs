//! The emulated device: host memory, the kernel sources compiled for the CPU by build.rs
//! (see `emu/emu.h`), and a reference GEMM with cuBLASLt's semantics (f32 accumulation).
//! Slow, exact enough to check the kernels against the CPU engine, and always available.

use super::{Arg, DType, DevPtr, DeviceInfo, Gemm, MemCounter};
use crate::error::{CudaError, Result};
use std::ffi::{c_char, c_uint, c_void, CString};

extern "C" {
    fn rf_emu_launch(
        name: *const c_char,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        smem: c_uint,
        args: *mut *mut c_void,
        max_threads: c_uint,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn rf_emu_set_mirrored(on: c_uint);
    fn rf_emu_find(name: *const c_char) -> *const c_void;
    fn rf_emu_alloc(bytes: usize) -> *mut c_void;
    fn rf_emu_free(p: *mut c_void, bytes: usize);
}

/// Whether the emulator's registry has kernel `name` (false on a CPU it cannot run on).
pub(super) fn has_kernel(name: &str) -> bool {
    if cpu_supported().is_err() {
        return false;
    }
    // SAFETY: a NUL-terminated name; the registry only reads it.
    CString::new(name).is_ok_and(|c| !unsafe { rf_emu_find(c.as_ptr()) }.is_null())
}

/// Swaps which blocks run their threads first-to-last and which last-to-first (emu.h).
pub(super) fn set_mirrored(on: bool) {
    // SAFETY: stores one atomic flag.
    unsafe { rf_emu_set_mirrored(on as c_uint) }
}

/// The kernels are built for FMA and AVX on x86-64 (build.rs): on a CPU without them they would
/// stop the process at their first AVX instruction, so nothing of theirs may run there.
fn cpu_supported() -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("fma") {
        return Err(CudaError::Device {
            requested: "cuda-emu".into(),
            msg: "the CUDA emulator's kernels use FMA instructions, as a GPU's do, and this CPU has none; use `cpu`, or a CPU with AVX2 and FMA".into(),
        });
    }
    Ok(())
}

/// Streaming multiprocessors the emulator reports.
const EMU_SMS: i32 = 132;

/// Memory the emulator pretends to have (for `gpu_memory_utilization` budgets).
const EMU_MEMORY: u64 = 8 << 30;

pub(super) struct Emu {
    mem: MemCounter,
    threads: u32,
}

impl Emu {
    pub(super) fn open() -> Result<(Emu, DeviceInfo)> {
        cpu_supported()?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let info = DeviceInfo {
            name: "emulator (CUDA kernels on the CPU)".into(),
            ordinal: 0,
            sm: (9, 0),
            // An H100's: the host sizes some launches by the SM count (linear_rows' splits of
            // k), and the emulator should run the shapes a GPU runs. Its own parallelism is
            // `threads`.
            sms: EMU_SMS,
            total_mem: EMU_MEMORY,
            emulated: true,
            driver_version: 0,
        };
        Ok((Emu { mem: MemCounter::default(), threads }, info))
    }

    pub(super) fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        if self.mem.now() + bytes as u64 > EMU_MEMORY {
            return Err(CudaError::Api { call: "emulator alloc".into(), msg: "CUDA_ERROR_OUT_OF_MEMORY".into() });
        }
        // Mapped with a guard page after it (emu.cpp), so a kernel that reads or writes past a
        // buffer's end stops with a report naming the kernel, as a GPU would stop it.
        // SAFETY: plain allocation; the result is checked for null.
        let p = unsafe { rf_emu_alloc(bytes) };
        if p.is_null() {
            return Err(CudaError::Api { call: "emulator alloc".into(), msg: "CUDA_ERROR_OUT_OF_MEMORY (host mapping failed)".into() });
        }
        let ptr = DevPtr(p as u64);
        self.mem.add(ptr, bytes);
        Ok(ptr)
    }

    pub(super) fn free(&self, p: DevPtr) {
        if let Some(bytes) = self.mem.remove(p) {
            // SAFETY: `p` came from `rf_emu_alloc(bytes)` and is freed once (MemCounter::remove
            // returns its size only the first time).
            unsafe { rf_emu_free(p.0 as *mut c_void, bytes as usize) };
        }
    }

    pub(super) fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        // SAFETY: `dst` addresses an allocation of ours at least `src.len()` long (the
        // engine's buffers are sized for what it copies), and does not overlap `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) };
        Ok(())
    }

    pub(super) fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as in `upload`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    pub(super) fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        // SAFETY: both address allocations of ours; `copy` allows overlap.
        unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
        Ok(())
    }

    pub(super) fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        // SAFETY: `dst` addresses at least `bytes` bytes of ours.
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0, bytes) };
        Ok(())
    }

    pub(super) fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg]) -> Result<()> {
        let cname = CString::new(name).map_err(|_| CudaError::Request(format!("kernel name {name:?}")))?;
        let mut vals: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p.0,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::U64(v) => v,
            })
            .collect();
        // Each value sits at the start of its own 8 bytes: little-endian, so an `int` or
        // `float` parameter reads its 4 bytes from there, as from cuLaunchKernel's array.
        let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| (v as *mut u64).cast::<c_void>()).collect();
        let mut err = [0 as c_char; 512];
        // SAFETY: `ptrs` points at one value per kernel parameter (the engine passes what each
        // kernel's signature declares), alive for the duration of this synchronous call.
        let rc = unsafe {
            rf_emu_launch(cname.as_ptr(), grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, ptrs.as_mut_ptr(), self.threads, err.as_mut_ptr(), err.len())
        };
        if rc != 0 {
            // SAFETY: the emulator wrote a NUL-terminated message into `err`.
            let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
            return Err(CudaError::Emulator { kernel: name.into(), msg });
        }
        Ok(())
    }

    pub(super) fn gemm(&self, g: &Gemm) -> Result<()> {
        // Operands are read into f32 first; sums accumulate in f32 like cuBLASLt's 32F compute.
        let read = |p: DevPtr, idx: usize, dt: DType| -> f32 {
            // SAFETY: `idx` is inside the operand (the engine's shapes and leading dimensions).
            unsafe {
                match dt {
                    DType::F32 => *(p.0 as *const f32).add(idx),
                    DType::Bf16 => half::bf16::from_bits(*(p.0 as *const u16).add(idx)).to_f32(),
                }
            }
        };
        let (m, n, k) = (g.m, g.n, g.k);
        let a: Vec<f32> = (0..m * k)
            .map(|i| {
                let (r, c) = (i / k, i % k);
                read(g.a, if g.trans_a { c * g.lda + r } else { r * g.lda + c }, g.ab_type)
            })
            .collect();
        let bt: Vec<f32> = (0..n * k)
            .map(|i| {
                let (col, kk) = (i / k, i % k);
                read(g.b, if g.trans_b { col * g.ldb + kk } else { kk * g.ldb + col }, g.ab_type)
            })
            .collect();
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            let ar = &a[r * k..(r + 1) * k];
            for c in 0..n {
                let bc = &bt[c * k..(c + 1) * k];
                let mut s = 0f32;
                for (x, y) in ar.iter().zip(bc) {
                    s += x * y;
                }
                let mut v = g.alpha * s;
                if let Some(cp) = g.c {
                    if g.beta != 0.0 {
                        v += g.beta * read(cp, r * g.ldd + c, g.d_type);
                    }
                }
                if let Some(bp) = g.bias {
                    v += read(bp, c, g.d_type);
                }
                out[r * n + c] = v;
            }
        }
        for r in 0..m {
            for c in 0..n {
                let idx = r * g.ldd + c;
                let v = out[r * n + c];
                // SAFETY: D holds m rows of ldd elements.
                unsafe {
                    match g.d_type {
                        DType::F32 => *(g.d.0 as *mut f32).add(idx) = v,
                        DType::Bf16 => *(g.d.0 as *mut u16).add(idx) = half::bf16::from_f32(v).to_bits(),
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn mem_info(&self) -> (u64, u64) {
        (EMU_MEMORY - self.mem.now(), EMU_MEMORY)
    }
    pub(super) fn peak(&self) -> u64 {
        self.mem.peak()
    }
    pub(super) fn reset_peak(&self) {
        self.mem.reset_peak()
    }
    pub(super) fn allocated(&self) -> u64 {
        self.mem.now()
    }
}
