//! The device the engine runs on: memory, kernel launches, GEMMs, behind one type with two
//! implementations — an NVIDIA GPU through the CUDA driver (`cuda.rs`), and the emulator
//! (`emu.rs`: the same kernel sources compiled for the CPU), so everything above this module
//! is tested on machines without a GPU.
//!
//! Pointers are plain device addresses ([`DevPtr`]); the engine plans its own buffers, so
//! nothing here knows tensors. Work is queued on one stream in order; `download` and `sync`
//! wait for it, and copies through [`Staging`] memory let the host go on meanwhile. Queued work
//! can also be recorded once and replayed ([`Graph`]).

pub mod cublaslt;
mod cuda;
mod emu;
mod graph;
pub mod nvrtc;
mod profile;
mod staging;

pub use graph::Graph;
pub use profile::{OpTotal, Profile};
pub use staging::Staging;

use crate::error::{CudaError, Result};
use graph::{Gate, GraphImp, Recorded, Recording};
use profile::{Cost, Span, Stamp, Totals};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The emulator's thread schedule for the launches that follow, process-wide: even blocks
/// run their threads first-to-last and odd blocks last-to-first, or (`mirrored`) the other
/// way round. A race-free kernel gives the same bits under both; a missing barrier does not
/// (`tests/schedules.rs`). No effect on a GPU.
pub fn set_emulator_schedule_mirrored(mirrored: bool) {
    emu::set_mirrored(mirrored);
}

/// Whether the emulator has kernel `name` (the sources' exported names must all be there).
pub fn emulator_has_kernel(name: &str) -> bool {
    emu::has_kernel(name)
}

/// Storage type of activations and weights (math inside kernels is always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float: the exact mode, used to check kernels tightly against the CPU engine.
    F32,
    /// bfloat16: the fast mode (tensor cores, half the memory traffic).
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }

    /// Kernel name suffix (`rmsnorm_fwd_bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for DType {
    type Err = CudaError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" | "fp32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => Err(CudaError::Request(format!("unknown dtype `{other}`; use `bf16` or `f32`"))),
        }
    }
}

/// A device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `bytes` further on (named as the raw pointers' `add`).
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }
}

/// A kernel argument, passed by value as cuLaunchKernel expects.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    /// A device pointer (any element type).
    Ptr(DevPtr),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// `unsigned long long` / `long long`.
    U64(u64),
}

impl From<DevPtr> for Arg {
    fn from(p: DevPtr) -> Self {
        Arg::Ptr(p)
    }
}
impl From<&Buf> for Arg {
    fn from(b: &Buf) -> Self {
        Arg::Ptr(b.ptr)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}
impl From<usize> for Arg {
    /// Sizes go to kernels as `int`; callers keep them under 2³¹ (checked where they are made).
    fn from(v: usize) -> Self {
        Arg::I32(v as i32)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}
impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::U64(v)
    }
}

/// Plain data that can be copied to and from the device byte for byte.
///
/// # Safety
/// Implementors have no padding, no pointers and every bit pattern valid.
pub unsafe trait Pod: Copy + Default + Send + 'static {}
// SAFETY: primitive numeric types.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: a u16 newtype.
unsafe impl Pod for half::bf16 {}

/// `D[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C[m, n] (+ bias[n] on every row)`,
/// all row-major with leading dimensions in elements. `op(A)` is A stored `[m, k]`, or with
/// `trans_a` A stored `[k, m]` and transposed; likewise B (`[k, n]`, or `[n, k]` with `trans_b`).
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Rows of D.
    pub m: usize,
    /// Columns of D.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// A's address.
    pub a: DevPtr,
    /// A's leading dimension.
    pub lda: usize,
    /// A stored transposed.
    pub trans_a: bool,
    /// B's address.
    pub b: DevPtr,
    /// B's leading dimension.
    pub ldb: usize,
    /// B stored transposed.
    pub trans_b: bool,
    /// Type of A and B.
    pub ab_type: DType,
    /// C (same type and leading dimension as D; may be D itself) when `beta` ≠ 0.
    pub c: Option<DevPtr>,
    /// D's address.
    pub d: DevPtr,
    /// D's leading dimension.
    pub ldd: usize,
    /// Type of C and D.
    pub d_type: DType,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
    /// A bias of D's type added to every row.
    pub bias: Option<DevPtr>,
}

impl Gemm {
    /// Its shape for a profile: `gemm M×N×K` with the transposes (N: as stored, T:
    /// transposed), types, and what is added.
    fn label(&self) -> String {
        let t = |x: bool| if x { 'T' } else { 'N' };
        let mut s = format!("gemm {}×{}×{} {}{} {}→{}", self.m, self.n, self.k, t(self.trans_a), t(self.trans_b), self.ab_type.suffix(), self.d_type.suffix());
        if self.c.is_some() && self.beta != 0.0 {
            s.push_str(" +C");
        }
        if self.bias.is_some() {
            s.push_str(" +bias");
        }
        s
    }

    /// 2·M·N·K FLOPs; A, B and D moved once (C too when added).
    fn cost(&self) -> Cost {
        let (m, n, k) = (self.m as f64, self.n as f64, self.k as f64);
        let c = if self.c.is_some() && self.beta != 0.0 { 2.0 } else { 1.0 };
        Cost { flops: 2.0 * m * n * k, bytes: (m * k + k * n) * self.ab_type.size() as f64 + c * m * n * self.d_type.size() as f64 }
    }

    /// `D[m, n] = X[m, k] · Wᵀ` for a weight stored `[n, k]` (a linear layer's forward).
    pub fn linear(x: DevPtr, w: DevPtr, d: DevPtr, m: usize, n: usize, k: usize, dt: DType) -> Gemm {
        Gemm { m, n, k, a: x, lda: k, trans_a: false, b: w, ldb: k, trans_b: true, ab_type: dt, c: None, d, ldd: n, d_type: dt, alpha: 1.0, beta: 0.0, bias: None }
    }
}

/// What the device is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    /// Marketing name (`NVIDIA H100 80GB HBM3`), or `emulator`.
    pub name: String,
    /// Index among the visible GPUs.
    pub ordinal: usize,
    /// Compute capability.
    pub sm: (i32, i32),
    /// Streaming multiprocessors.
    pub sms: i32,
    /// Bytes of device memory.
    pub total_mem: u64,
    /// Whether this is the CPU emulator.
    pub emulated: bool,
    /// The CUDA version the driver supports (e.g. 13000), 0 on the emulator.
    pub driver_version: i32,
}

impl DeviceInfo {
    /// Whether kernels can be launched as programmatic dependent launches here (sm_90+; the
    /// emulator runs every launch after the one before).
    pub fn dependent_launches(&self) -> bool {
        !self.emulated && self.sm.0 >= 9
    }

    /// The datasheet's (HBM bytes/s, dense bf16 tensor FLOP/s) for this GPU, by its name:
    /// the denominators of the benches' roofline fraction and of MFU (`None`: unknown GPU, or
    /// the emulator).
    pub fn peaks(&self) -> Option<(f64, f64)> {
        let n = self.name.to_ascii_uppercase();
        if self.emulated {
            None
        } else if n.contains("GH200") {
            // Grace Hopper comes with 96 GB of HBM3 (4.0 TB/s) or 144 GB of HBM3e (4.9 TB/s)
            // under one name pattern: no figure rather than a wrong one.
            None
        } else if n.contains("H200") {
            Some((4.8e12, 989e12))
        } else if n.contains("H100") && n.contains("NVL") {
            Some((3.9e12, 835e12))
        } else if n.contains("H100") && n.contains("PCIE") {
            Some((2.0e12, 756e12))
        } else if n.contains("H100") {
            Some((3.35e12, 989e12))
        } else if n.contains("A100") {
            Some((2.0e12, 312e12))
        } else {
            None
        }
    }
}

/// Which device to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKind {
    /// The NVIDIA GPU with this index (among `CUDA_VISIBLE_DEVICES`).
    Cuda(usize),
    /// The kernels on the CPU (tests, and machines without a GPU).
    Emulated,
}

// One per process: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Imp {
    Cuda(cuda::Cuda),
    Emu(emu::Emu),
}

/// An open device.
pub struct Gpu {
    imp: Imp,
    /// What it is.
    pub info: DeviceInfo,
    /// The graph being recorded, if any, and the device work other threads have in flight.
    gate: Mutex<Gate>,
    /// Signalled when a recording ends or in-flight work finishes.
    gate_changed: Condvar,
    /// Whether ops are being timed ([`Gpu::profile`]); checked before anything else is done
    /// for the profile, so an unprofiled launch pays one relaxed load.
    profiling: AtomicBool,
    /// The profile being taken.
    prof: Mutex<ProfState>,
}

/// A profile in progress: ops timed since the last fold, the sums so far, and events to reuse.
#[derive(Default)]
struct ProfState {
    spans: Vec<Span>,
    totals: Totals,
    free: Vec<profile::EventHandle>,
    /// The first error reading the events (the profile then fails).
    failed: Option<CudaError>,
}

/// Ops timed between folds: a profile of a long rollout holds at most twice this many events.
const PROFILE_FOLD: usize = 4096;

/// A device operation in progress (see [`Gpu::enter`]).
struct Entered<'a> {
    gpu: &'a Gpu,
    /// Counted among the work in flight (not part of a recording).
    counted: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let me = std::thread::current().id();
        if let Ok(mut g) = self.gpu.gate.lock() {
            if let Some(i) = g.in_flight.iter().position(|t| *t == me) {
                g.in_flight.swap_remove(i);
            }
        }
        self.gpu.gate_changed.notify_all();
    }
}

/// Device memory, freed on drop.
pub struct Buf {
    gpu: Arc<Gpu>,
    /// Its address.
    pub ptr: DevPtr,
    /// Its size in bytes.
    pub bytes: usize,
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.gpu.free(self.ptr);
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({:#x}, {} bytes)", self.ptr.0, self.bytes)
    }
}

impl Buf {
    /// The device it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The address `elems` elements of `dt` into the buffer.
    pub fn at(&self, elems: usize, dt: DType) -> DevPtr {
        self.ptr.add(elems * dt.size())
    }
}

fn poisoned() -> CudaError {
    CudaError::Request("graph recording state poisoned".into())
}

impl Gpu {
    /// Opens a device. A machine without a GPU, a bad index or a missing library is an error
    /// saying which and what to do, never a panic.
    pub fn open(kind: GpuKind) -> Result<Arc<Gpu>> {
        let (imp, info) = match kind {
            GpuKind::Cuda(i) => {
                let (c, info) = cuda::Cuda::open(i)?;
                (Imp::Cuda(c), info)
            }
            GpuKind::Emulated => {
                let (e, info) = emu::Emu::open()?;
                (Imp::Emu(e), info)
            }
        };
        Ok(Arc::new(Gpu { imp, info, gate: Mutex::new(Gate::default()), gate_changed: Condvar::new(), profiling: AtomicBool::new(false), prof: Mutex::new(ProfState::default()) }))
    }

    /// Hands memory that freed buffers left in the allocator's pool back to the driver, for
    /// allocations outside the pool (NCCL's buffers, other processes). Waits for queued work.
    pub fn release_cached(&self) -> Result<()> {
        let _op = self.enter(Some("returning cached memory"))?;
        match &self.imp {
            Imp::Cuda(c) => c.trim(),
            Imp::Emu(_) => Ok(()),
        }
    }

    /// Records the device work `f` queues — kernels, GEMMs, device copies and fills, on memory
    /// that exists already — without running it, for [`Gpu::replay`]. Allocating or freeing
    /// device memory, host copies and waiting are refused while recording (a replay could not
    /// repeat them), and so is a second recording on the same thread. Other threads' device
    /// work waits while the recording lasts (a GPU's stream capture would take it in), and the
    /// recording waits for their work in flight. Every kernel and GEMM shape `f` queues should
    /// have run once before: a first use loads a module or plans a GEMM, which drivers before
    /// CUDA 12.3 cannot do inside a stream capture (the rollout records a decode step only
    /// after running it eagerly).
    pub fn capture(self: &Arc<Self>, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let me = std::thread::current().id();
        {
            let mut g = self.gate()?;
            if g.recording.as_ref().is_some_and(|(t, _)| *t == me) {
                return Err(CudaError::Request("a CUDA graph is already being recorded on this device".into()));
            }
            while g.recording.is_some() || g.in_flight.iter().any(|t| *t != me) {
                g = self.gate_changed.wait(g).map_err(|_| poisoned())?;
            }
            g.recording = Some((me, Recording::default()));
        }
        if let Imp::Cuda(c) = &self.imp {
            if let Err(e) = c.begin_capture() {
                self.end_recording();
                return Err(e);
            }
        }
        // Should `f` panic, the guard still ends the capture and the recording, so the device
        // stays usable for whoever catches the panic.
        struct Ending<'a>(&'a Gpu, bool);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                if self.1 {
                    return;
                }
                if let Imp::Cuda(c) = &self.0.imp {
                    if let Ok(exec) = c.end_capture() {
                        c.destroy_graph(exec);
                    }
                }
                self.0.end_recording();
            }
        }
        let mut ending = Ending(self, false);
        let ran = f();
        ending.1 = true;
        // A poisoned gate still holds the recording: the capture below must end either way.
        let rec = self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recording.as_mut().map(|(_, r)| std::mem::take(r)).unwrap_or_default();
        let Recording { ops, refused, deferred_frees, deferred_staging } = rec;
        // The capture always ends, so the stream is usable whatever happened; only then may
        // other threads queue work again.
        let ended = match &self.imp {
            Imp::Cuda(c) => c.end_capture().map(GraphImp::Cuda),
            Imp::Emu(_) => Ok(GraphImp::Emu(ops)),
        };
        self.end_recording();
        for p in deferred_frees {
            self.free(p);
        }
        drop(deferred_staging);
        let graph = ended.map(|imp| Graph { gpu: Arc::clone(self), imp });
        ran?;
        if let Some(what) = refused {
            return Err(CudaError::Request(format!("{what} while recording a CUDA graph: the recorded work must only launch kernels and copy between existing buffers")));
        }
        graph
    }

    /// Clears the recording and wakes the threads waiting for it.
    fn end_recording(&self) {
        if let Ok(mut g) = self.gate.lock() {
            // Dropped outside the lock: what it still defers (staging memory) takes it again.
            let left = g.recording.take();
            drop(g);
            drop(left);
        }
        self.gate_changed.notify_all();
    }

    /// Runs a recorded graph's work again, in order, on the stream.
    pub fn replay(&self, g: &Graph) -> Result<()> {
        let _op = self.enter(Some("replaying a graph"))?;
        self.profiled(|| "graph replay".to_string(), Cost::default(), || match (&self.imp, &g.imp) {
            (Imp::Cuda(c), GraphImp::Cuda(exec)) => c.replay(*exec),
            (Imp::Emu(e), GraphImp::Emu(ops)) => {
                for op in ops {
                    match op {
                        Recorded::Launch { name, grid, block, smem, args } => e.launch(name, *grid, *block, *smem, args)?,
                        Recorded::Gemm(g) => e.gemm(g)?,
                        Recorded::Copy { dst, src, bytes } => e.copy(*dst, *src, *bytes)?,
                        Recorded::Zero { dst, bytes } => e.zero(*dst, *bytes)?,
                    }
                }
                Ok(())
            }
            _ => Err(CudaError::Request("a graph recorded on another kind of device".into())),
        })
    }

    fn destroy_graph(&self, exec: cudarc::driver::sys::CUgraphExec) {
        if let Imp::Cuda(c) = &self.imp {
            c.destroy_graph(exec);
        }
    }

    fn gate(&self) -> Result<MutexGuard<'_, Gate>> {
        self.gate.lock().map_err(|_| poisoned())
    }

    /// Begins a device operation: waits while another thread records a graph, and counts it
    /// in flight until the returned guard drops. On the recording thread the operation is part
    /// of the recording — unless it is `refuse`, something a replay cannot repeat: then it is
    /// refused, and noted so that the recording fails.
    fn enter(&self, refuse: Option<&str>) -> Result<Entered<'_>> {
        let me = std::thread::current().id();
        let mut g = self.gate()?;
        while g.recording.as_ref().is_some_and(|(t, _)| *t != me) {
            g = self.gate_changed.wait(g).map_err(|_| poisoned())?;
        }
        if let Some((_, rec)) = g.recording.as_mut() {
            if let Some(what) = refuse {
                rec.refused.get_or_insert_with(|| what.to_string());
                return Err(CudaError::Request(format!("{what} while recording a CUDA graph")));
            }
            return Ok(Entered { gpu: self, counted: false });
        }
        g.in_flight.push(me);
        Ok(Entered { gpu: self, counted: true })
    }

    /// Records `op` when this thread is recording on the emulator (a GPU's stream capture
    /// records by itself); true when recorded, so the caller does not run it. Call within
    /// [`Gpu::enter`], so a recording seen here is this thread's.
    fn record(&self, op: impl FnOnce() -> Recorded) -> bool {
        if !matches!(self.imp, Imp::Emu(_)) {
            return false;
        }
        match self.gate.lock() {
            Ok(mut g) => match g.recording.as_mut() {
                Some((_, rec)) => {
                    rec.ops.push(op());
                    true
                }
                None => false,
            },
            Err(_) => false,
        }
    }

    /// Allocates `bytes` (zeroed). `what` and `fix` go into the out-of-memory error.
    pub fn alloc(self: &Arc<Self>, bytes: usize, what: &str, fix: &str) -> Result<Buf> {
        let _op = self.enter(Some("allocating device memory"))?;
        let bytes = bytes.max(1);
        let ptr = match &self.imp {
            Imp::Cuda(c) => c.alloc(bytes).map_err(|e| self.oom(e, bytes, what, fix))?,
            Imp::Emu(e) => e.alloc(bytes)?,
        };
        Ok(Buf { gpu: Arc::clone(self), ptr, bytes })
    }

    /// Allocates and fills a buffer with `data`.
    pub fn upload_new<T: Pod>(self: &Arc<Self>, data: &[T], what: &str) -> Result<Buf> {
        self.upload_new_or(data, what, "lower the batch size")
    }

    /// [`Gpu::upload_new`] whose out-of-memory error names `fix`.
    pub fn upload_new_or<T: Pod>(self: &Arc<Self>, data: &[T], what: &str, fix: &str) -> Result<Buf> {
        let b = self.alloc(std::mem::size_of_val(data), what, fix)?;
        self.upload(b.ptr, data)?;
        Ok(b)
    }

    fn oom(&self, e: CudaError, bytes: usize, what: &str, fix: &str) -> CudaError {
        match e {
            CudaError::Api { ref msg, .. } if msg.contains("OUT_OF_MEMORY") => {
                let (free, total) = self.mem_info().unwrap_or((0, 0));
                CudaError::OutOfMemory {
                    what: what.into(),
                    need_mib: (bytes as u64).div_ceil(1 << 20),
                    free_mib: free >> 20,
                    total_mib: total >> 20,
                    fix: fix.into(),
                }
            }
            other => other,
        }
    }

    /// Keeps `keep()` (staging memory being dropped) until this thread's recording ends, and
    /// notes that the recording freed memory its copies may use; false (nothing taken) when
    /// this thread is not recording.
    fn defer_while_recording(&self, keep: impl FnOnce() -> Staging) -> bool {
        let me = std::thread::current().id();
        let Ok(mut g) = self.gate.lock() else { return false };
        match g.recording.as_mut() {
            Some((t, rec)) if *t == me => {
                rec.refused.get_or_insert_with(|| "freeing staging memory".to_string());
                rec.deferred_staging.push(keep());
                true
            }
            _ => false,
        }
    }

    fn free(&self, p: DevPtr) {
        // A poisoned gate still lets the memory go.
        let _op = self.enter(None);
        if let Ok(mut g) = self.gate.lock() {
            if let Some((_, rec)) = g.recording.as_mut() {
                rec.refused.get_or_insert_with(|| "freeing device memory".to_string());
                rec.deferred_frees.push(p);
                return;
            }
        }
        match &self.imp {
            Imp::Cuda(c) => c.free(p),
            Imp::Emu(e) => e.free(p),
        }
    }

    /// Copies host data to the device.
    pub fn upload<T: Pod>(&self, dst: DevPtr, src: &[T]) -> Result<()> {
        // SAFETY: T is plain data, so its bytes are initialised.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src)) };
        let _op = self.enter(Some("copying host data to the device"))?;
        self.profiled(|| "copy host → device".into(), Cost { flops: 0.0, bytes: bytes.len() as f64 }, || match &self.imp {
            Imp::Cuda(c) => c.upload(dst, bytes),
            Imp::Emu(e) => e.upload(dst, bytes),
        })
    }

    /// Copies device data to the host (waits for queued work first).
    pub fn download<T: Pod>(&self, src: DevPtr, dst: &mut [T]) -> Result<()> {
        // SAFETY: T is plain data: any bytes written into it form valid values.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(dst)) };
        let _op = self.enter(Some("copying device data to the host"))?;
        let cost = Cost { flops: 0.0, bytes: bytes.len() as f64 };
        self.profiled(|| "copy device → host".into(), cost, || match &self.imp {
            Imp::Cuda(c) => c.download(src, bytes),
            Imp::Emu(e) => e.download(src, bytes),
        })
    }

    /// `n` elements of type `T` from the device into a new vector.
    pub fn to_vec<T: Pod>(&self, src: DevPtr, n: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); n];
        self.download(src, &mut v)?;
        Ok(v)
    }

    /// Device-to-device copy.
    pub fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        let _op = self.enter(None)?;
        if bytes == 0 || self.record(|| Recorded::Copy { dst, src, bytes }) {
            return Ok(());
        }
        // Read and written.
        self.profiled(|| "copy device → device".into(), Cost { flops: 0.0, bytes: 2.0 * bytes as f64 }, || match &self.imp {
            Imp::Cuda(c) => c.copy(dst, src, bytes),
            Imp::Emu(e) => e.copy(dst, src, bytes),
        })
    }

    /// Sets `bytes` bytes to zero.
    pub fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        let _op = self.enter(None)?;
        if bytes == 0 || self.record(|| Recorded::Zero { dst, bytes }) {
            return Ok(());
        }
        self.profiled(|| "memset".into(), Cost { flops: 0.0, bytes: bytes as f64 }, || match &self.imp {
            Imp::Cuda(c) => c.zero(dst, bytes),
            Imp::Emu(e) => e.zero(dst, bytes),
        })
    }

    /// Queues kernel `name` (as exported by a source in [`crate::kernels`]).
    pub fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg]) -> Result<()> {
        self.launch_moving(name, grid, block, smem, args, 0.0)
    }

    /// [`Gpu::launch`] of a kernel that must move at least `bytes` to or from device memory
    /// (its achieved bandwidth in a profile).
    pub(crate) fn launch_moving(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg], bytes: f64) -> Result<()> {
        self.launch_as(name, grid, block, smem, args, bytes, false)
    }

    /// [`Gpu::launch_moving`] as a programmatic dependent launch where the GPU has them (sm_90+):
    /// the kernel may start while the one before it runs, so it must call `grid_wait()`
    /// (prelude.cuh) before it reads anything the step wrote or writes anything. The emulator
    /// runs it as any launch.
    pub(crate) fn launch_after(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg], bytes: f64) -> Result<()> {
        self.launch_as(name, grid, block, smem, args, bytes, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_as(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg], bytes: f64, dependent: bool) -> Result<()> {
        if grid.contains(&0) {
            return Ok(()); // nothing to do (an empty batch), as a GPU would
        }
        let _op = self.enter(None)?;
        if self.record(|| Recorded::Launch { name: name.to_string(), grid, block, smem, args: args.to_vec() }) {
            return Ok(());
        }
        self.profiled(|| name.to_string(), Cost { flops: 0.0, bytes }, || match &self.imp {
            Imp::Cuda(c) => c.launch(name, grid, block, smem, args, dependent),
            Imp::Emu(e) => e.launch(name, grid, block, smem, args),
        })
    }

    /// Runs `f` with this GPU's context current on the calling thread, passing its stream, on
    /// which libraries such as NCCL queue their work (in order with everything else). The
    /// emulator has no stream: an error.
    pub fn on_stream<R>(&self, f: impl FnOnce(*mut std::ffi::c_void) -> Result<R>) -> Result<R> {
        let _op = self.enter(Some("an NCCL call"))?;
        match &self.imp {
            Imp::Cuda(c) => self.profiled(|| "NCCL call".into(), Cost::default(), || c.on_stream(f)),
            Imp::Emu(_) => Err(CudaError::Request("NCCL needs a GPU; the emulator has none (its data-parallel ranks all-reduce through the host)".into())),
        }
    }

    /// Queues a GEMM.
    pub fn gemm(&self, g: &Gemm) -> Result<()> {
        let _op = self.enter(None)?;
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        // cuBLASLt takes no empty shared dimension (a layout with a leading dimension of 0);
        // refused here alike, so the emulator does not accept what a GPU would not.
        if g.k == 0 {
            return Err(CudaError::Request(format!("a GEMM of {}×{} with an empty shared dimension (k = 0)", g.m, g.n)));
        }
        if self.record(|| Recorded::Gemm(*g)) {
            return Ok(());
        }
        self.profiled(|| g.label(), g.cost(), || match &self.imp {
            Imp::Cuda(c) => c.gemm(g),
            Imp::Emu(e) => e.gemm(g),
        })
    }

    /// Waits for all queued work.
    pub fn sync(&self) -> Result<()> {
        let _op = self.enter(Some("waiting for the device"))?;
        match &self.imp {
            Imp::Cuda(c) => c.sync(),
            Imp::Emu(_) => Ok(()),
        }
    }

    /// Bytes of device memory in use now (all processes, as nvidia-smi shows it; 0 when the
    /// driver cannot say).
    pub fn used_bytes(&self) -> u64 {
        self.mem_info().map(|(free, total)| total.saturating_sub(free)).unwrap_or(0)
    }

    /// (free, total) bytes of device memory.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        match &self.imp {
            Imp::Cuda(c) => c.mem_info(),
            Imp::Emu(e) => Ok(e.mem_info()),
        }
    }

    /// The most device memory allocated at once since the last reset (bytes).
    pub fn peak_allocated(&self) -> u64 {
        match &self.imp {
            Imp::Cuda(c) => c.peak(),
            Imp::Emu(e) => e.peak(),
        }
    }

    /// Starts a new peak measurement.
    pub fn reset_peak(&self) {
        match &self.imp {
            Imp::Cuda(c) => c.reset_peak(),
            Imp::Emu(e) => e.reset_peak(),
        }
    }

    /// Bytes allocated now.
    pub fn allocated(&self) -> u64 {
        match &self.imp {
            Imp::Cuda(c) => c.allocated(),
            Imp::Emu(e) => e.allocated(),
        }
    }

    /// Seconds of GPU time between now and when `f` has finished its work (GPU events; on the
    /// emulator, wall time).
    pub fn timed<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(R, f64)> {
        let _op = self.enter(Some("timing device work"))?;
        match &self.imp {
            Imp::Cuda(c) => c.timed(f),
            Imp::Emu(_) => {
                let t = std::time::Instant::now();
                let r = f()?;
                Ok((r, t.elapsed().as_secs_f64()))
            }
        }
    }

    /// Runs `f` and times every op it queues ([`Profile`]): waits for queued work first, and
    /// for `f`'s at the end. Other threads' ops on this device in the meantime are timed too
    /// (their spans may then overlap `f`'s: profile one thread's work). An op in a graph being
    /// recorded is not timed (its replay is one op).
    pub fn profile<R, E: From<CudaError>>(&self, f: impl FnOnce() -> std::result::Result<R, E>) -> std::result::Result<(R, Profile), E> {
        self.sync()?;
        if self.profiling.swap(true, Ordering::SeqCst) {
            return Err(CudaError::Request("a profile of this device is already being taken".into()).into());
        }
        // Ends the profile whatever `f` does (a panic included): no op is timed after it, and
        // its events are freed.
        struct Ending<'a>(&'a Gpu);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                self.0.profiling.store(false, Ordering::SeqCst);
                let st = std::mem::take(&mut *self.0.prof_state());
                for s in st.spans {
                    self.0.drop_stamp(s.start);
                    self.0.drop_stamp(s.end);
                }
                for e in st.free {
                    self.0.drop_stamp(Stamp::Event(e));
                }
            }
        }
        let ending = Ending(self);
        let ran = f();
        self.profiling.store(false, Ordering::SeqCst);
        // Ops other threads began while profiling was on finish (and add their spans) first;
        // the last fold then runs as a device operation of its own, so it cannot sync the
        // stream under another thread's graph recording.
        let finished = self.quiesce().and_then(|()| {
            let _op = self.enter(Some("ending a profile"))?;
            let mut st = self.prof_state();
            self.fold(&mut st)?;
            Ok((std::mem::take(&mut st.totals), st.failed.take()))
        });
        drop(ending);
        let r = ran?;
        let (totals, failed) = finished?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        Ok((r, totals.finish(&self.info.name)))
    }

    /// Waits until no other thread has device work in flight or is recording a graph.
    fn quiesce(&self) -> Result<()> {
        let me = std::thread::current().id();
        let mut g = self.gate()?;
        while g.recording.is_some() || g.in_flight.iter().any(|t| *t != me) {
            g = self.gate_changed.wait(g).map_err(|_| poisoned())?;
        }
        Ok(())
    }

    fn prof_state(&self) -> MutexGuard<'_, ProfState> {
        self.prof.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the timed ops, adds their times to the totals and keeps their events for reuse.
    fn fold(&self, st: &mut ProfState) -> Result<()> {
        if st.spans.is_empty() {
            return Ok(());
        }
        let synced = match &self.imp {
            Imp::Cuda(c) => c.sync(),
            Imp::Emu(_) => Ok(()),
        };
        let spans = std::mem::take(&mut st.spans);
        let mut failed = None;
        st.totals.add(&spans, |a, b| match (&self.imp, a, b) {
            (Imp::Cuda(c), Stamp::Event(a), Stamp::Event(b)) => c.seconds_between(a, b).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                0.0
            }),
            (_, Stamp::Wall(a), Stamp::Wall(b)) => b.saturating_duration_since(*a).as_secs_f64(),
            _ => 0.0,
        });
        if let Some(e) = failed {
            st.failed.get_or_insert(e);
        }
        for s in spans {
            for stamp in [s.start, s.end] {
                if let Stamp::Event(e) = stamp {
                    st.free.push(e);
                }
            }
        }
        synced
    }

    /// Runs one op, `f`, timed when a profile is being taken (see [`Gpu::profile`]).
    fn profiled<R>(&self, label: impl FnOnce() -> String, cost: Cost, f: impl FnOnce() -> Result<R>) -> Result<R> {
        if !self.profiling.load(Ordering::Relaxed) {
            return f();
        }
        // An op being recorded into a graph is not timed: on a GPU its events would be
        // captured as graph nodes, never recorded on the stream (the replay is timed instead).
        if self.gate()?.recording.is_some() {
            return f();
        }
        let start = self.stamp()?;
        // A failed op is not timed, and nothing more is queued after it (a timed-out NCCL
        // call may still be queuing its kernel from NCCL's thread).
        let r = match f() {
            Ok(r) => r,
            Err(e) => {
                self.drop_stamp(start);
                return Err(e);
            }
        };
        let end = match self.stamp() {
            Ok(e) => e,
            Err(e) => {
                self.drop_stamp(start);
                return Err(e);
            }
        };
        let mut st = self.prof_state();
        st.spans.push(Span { label: label(), cost, start, end });
        if st.spans.len() >= PROFILE_FOLD {
            self.fold(&mut st)?;
        }
        Ok(r)
    }

    /// A timestamp on the stream now (a reused event where one is free).
    fn stamp(&self) -> Result<Stamp> {
        match &self.imp {
            Imp::Cuda(c) => {
                let free = self.prof_state().free.pop();
                match free {
                    Some(e) => c.record(e).map(Stamp::Event),
                    None => c.stamp().map(Stamp::Event),
                }
            }
            Imp::Emu(_) => Ok(Stamp::Wall(std::time::Instant::now())),
        }
    }

    fn drop_stamp(&self, s: Stamp) {
        if let (Imp::Cuda(c), Stamp::Event(e)) = (&self.imp, s) {
            c.destroy_event(e);
        }
    }
}

/// Tracks allocated bytes and their peak (what `perf/max_memory_allocated_gb` reports).
#[derive(Default)]
pub(crate) struct MemCounter {
    now: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
    sizes: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
}

impl MemCounter {
    pub(crate) fn add(&self, p: DevPtr, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Ok(mut s) = self.sizes.lock() {
            s.insert(p.0, bytes as u64);
        }
        let now = self.now.fetch_add(bytes as u64, Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Relaxed);
    }
    pub(crate) fn remove(&self, p: DevPtr) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let b = self.sizes.lock().ok()?.remove(&p.0)?;
        self.now.fetch_sub(b, Relaxed);
        Some(b)
    }
    pub(crate) fn now(&self) -> u64 {
        self.now.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub(crate) fn reset_peak(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.peak.store(self.now.load(Relaxed), Relaxed);
    }
}

#[cfg(test)]
mod peak_tests {
    use super::DeviceInfo;

    fn info(name: &str, emulated: bool) -> DeviceInfo {
        DeviceInfo { name: name.into(), ordinal: 0, sm: (9, 0), sms: 132, total_mem: 80 << 30, emulated, driver_version: 13000 }
    }

    #[test]
    fn datasheet_peaks_by_name() {
        assert_eq!(info("NVIDIA H100 80GB HBM3", false).peaks(), Some((3.35e12, 989e12)));
        assert_eq!(info("NVIDIA H100 PCIe", false).peaks().map(|p| p.0), Some(2.0e12));
        assert_eq!(info("NVIDIA H200", false).peaks().map(|p| p.0), Some(4.8e12));
        assert_eq!(info("NVIDIA H100 NVL", false).peaks(), Some((3.9e12, 835e12)));
        assert_eq!(info("NVIDIA GH200 480GB", false).peaks(), None);
        assert_eq!(info("emulator", true).peaks(), None);
    }
}
