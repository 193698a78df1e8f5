//! The real device: the CUDA driver API through cudarc (loaded at run time), one stream,
//! the stream-ordered allocator (its pool keeps freed memory for reuse, as PyTorch's
//! caching allocator does), kernels compiled by NVRTC for this GPU's architecture and loaded
//! as cubins, and cuBLASLt for GEMMs.

use super::cublaslt::Lt;
use super::profile::EventHandle;
use super::{Arg, DevPtr, DeviceInfo, Gemm, MemCounter};
use crate::error::{CudaError, Result};
use crate::kernels;
use cudarc::driver::result as drv;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// cuBLASLt's workspace (the size PyTorch uses on Hopper).
const WORKSPACE: usize = 32 << 20;

fn api(call: &str) -> impl Fn(drv::DriverError) -> CudaError + '_ {
    move |e| {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
        let what = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let hint = match e.0 {
            sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION | sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU => {
                "; the GPU driver is older than the NVRTC that compiled the kernels: upgrade the driver, or point REINFORGE_CUDA_LIB_DIRS at an NVRTC no newer than the driver's CUDA version"
            }
            _ => "",
        };
        CudaError::Api { call: call.into(), msg: format!("{name}: {what}{hint}") }
    }
}

struct Kernels {
    modules: HashMap<&'static str, sys::CUmodule>,
    functions: HashMap<String, Function>,
}

/// A loaded kernel.
#[derive(Clone, Copy)]
struct Function {
    f: sys::CUfunction,
    /// Its static shared memory (counted in the block's limit with the dynamic part).
    static_smem: u32,
    /// The dynamic shared memory it is allowed so far: the attribute belongs to the function,
    /// so it is only ever raised (two threads launching one kernel with different sizes must
    /// not lower it under each other).
    allowed: u32,
    /// The most threads a block of it may have: 1024, or fewer where its `__launch_bounds__`
    /// say so or its registers per thread (`registers`) would not fit an SM's 64 Ki.
    max_threads: u32,
    registers: u32,
}

pub(super) struct Cuda {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    /// The device's default memory pool, where the driver supports stream-ordered
    /// allocation; `None`: plain cuMemAlloc/cuMemFree.
    pool: Option<sys::CUmemoryPool>,
    lt: Lt,
    arch: String,
    /// The most shared memory a block may use (the opt-in limit: 227 KiB on H100, 99 KiB on
    /// L4/L40).
    smem_limit: u32,
    /// Whether the GPU takes programmatic dependent launches (sm_90+).
    dependent_launches: bool,
    kernels: Mutex<Kernels>,
    mem: MemCounter,
    _workspace: u64,
}

// SAFETY: the context is made current on whichever thread calls in; cudarc's handles are
// plain pointers the driver lets any thread use; the kernel tables are behind a mutex.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

/// The device's default memory pool, set to keep freed memory, once a first allocation from
/// it on `stream` has worked.
fn stream_ordered_pool(dev: sys::CUdevice, stream: sys::CUstream) -> Result<sys::CUmemoryPool> {
    // SAFETY: valid device.
    let pool = unsafe { drv::device::get_default_mem_pool(dev) }.map_err(api("cuDeviceGetDefaultMemPool"))?;
    // Keep freed memory in the pool: with the default threshold (0) every stream sync would
    // hand it back to the driver, and the next step would map it again.
    let mut keep = u64::MAX;
    // SAFETY: the attribute is a u64.
    unsafe { drv::mem_pool::set_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut keep as *mut u64).cast()) }
        .map_err(api("cuMemPoolSetAttribute"))?;
    // SAFETY: context current, valid stream; the probe is freed in stream order and waited for.
    let probe = unsafe { drv::malloc_async(stream, 1 << 20) }.map_err(api("cuMemAllocAsync"))?;
    // SAFETY: as above.
    unsafe { drv::free_async(probe, stream).and_then(|()| drv::stream::synchronize(stream)) }.map_err(api("cuMemFreeAsync"))?;
    Ok(pool)
}

impl Cuda {
    pub(super) fn open(ordinal: usize) -> Result<(Cuda, DeviceInfo)> {
        let requested = format!("cuda:{ordinal}");
        if !crate::libs::driver_present() {
            return Err(CudaError::Device {
                requested,
                msg: "no NVIDIA driver on this machine (libcuda.so.1 not found by the dynamic loader); use `cpu`, or run on a GPU node with the driver installed".into(),
            });
        }
        drv::init().map_err(|e| CudaError::Device { requested: requested.clone(), msg: format!("the CUDA driver did not initialise ({e}); is a GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES)?") })?;
        let count = drv::device::get_count().map_err(api("cuDeviceGetCount"))?;
        if count == 0 {
            return Err(CudaError::Device { requested, msg: "the driver sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES); use `cpu`".into() });
        }
        if ordinal >= count as usize {
            return Err(CudaError::Device {
                requested,
                msg: format!("there {} {count} visible GPU{} (cuda:0..cuda:{}); CUDA_VISIBLE_DEVICES renumbers them from 0", if count == 1 { "is" } else { "are" }, if count == 1 { "" } else { "s" }, count - 1),
            });
        }
        let dev = drv::device::get(ordinal as i32).map_err(api("cuDeviceGet"))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            // SAFETY: `dev` is a valid device handle.
            unsafe { drv::device::get_attribute(dev, a) }.map_err(api("cuDeviceGetAttribute"))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let smem_limit = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(48 * 1024) as u32;
        let name = drv::device::get_name(dev).map_err(api("cuDeviceGetName"))?;
        // SAFETY: valid device handle.
        let total_mem = unsafe { drv::device::total_mem(dev) }.map_err(api("cuDeviceTotalMem"))? as u64;
        let mut driver_version = 0i32;
        // SAFETY: valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(api("cuDriverGetVersion"))?;
        // What the engine calls (stream-ordered allocation, graphs, the CUDA 13 bindings'
        // entry points) is all in CUDA 12 drivers; an older one could lack a symbol, which the
        // bindings would not survive.
        if driver_version < 12000 {
            return Err(CudaError::Device {
                requested,
                msg: format!("the GPU driver supports CUDA {}.{}; the engine needs a driver for CUDA 12.0 or newer (525 or later): upgrade the driver", driver_version / 1000, driver_version % 1000 / 10),
            });
        }
        if major < 8 {
            return Err(CudaError::Device {
                requested,
                msg: format!("{name} has compute capability {major}.{minor}; the engine needs 8.0 or newer (A100, L4, L40, H100, H200, B200) for bf16"),
            });
        }
        crate::libs::limit_to_driver((driver_version / 1000) as u32);
        // The kernels load as cubins (machine code), which CUDA's minor-version compatibility
        // lets an older driver of the same major version run; only PTX would need a driver as
        // new as the compiler. cuBLASLt likewise needs a driver of its major version.
        let nvrtc = crate::gpu::nvrtc::Nvrtc::get()?;
        let (nv_major, nv_minor) = nvrtc.version()?;
        let cublaslt_major = (super::cublaslt::version()? / 10000) as i32;
        let driver_major = driver_version / 1000;
        let too_new = |lib: String, fix: String| CudaError::Device {
            requested: requested.clone(),
            msg: format!("the GPU driver supports CUDA {driver_major}.{} but {lib}; upgrade the driver, or {fix} and point REINFORGE_CUDA_LIB_DIRS at it", driver_version % 1000 / 10),
        };
        if nv_major > driver_major {
            return Err(too_new(format!("NVRTC ({}) is {nv_major}.{nv_minor}: kernels it compiles will not load", nvrtc.path), format!("install an NVRTC for CUDA {driver_major}")));
        }
        if cublaslt_major > driver_major {
            return Err(too_new(
                format!("the cuBLASLt found is from CUDA {cublaslt_major}"),
                format!("install cuBLASLt for CUDA {driver_major} (pip install nvidia-cublas-cu{driver_major})"),
            ));
        }
        // SAFETY: valid device; the primary context is shared with any other CUDA user in
        // this process (PyTorch does the same), and retained for the life of the process.
        let ctx = unsafe { drv::primary_ctx::retain(dev) }.map_err(api("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: a context we just retained.
        unsafe { drv::ctx::set_current(ctx) }.map_err(api("cuCtxSetCurrent"))?;
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(api("cuStreamCreate"))?;
        let pool = match attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? > 0 {
            true => match stream_ordered_pool(dev, stream) {
                Ok(pool) => Some(pool),
                // A GPU behind a virtualisation layer may report the pools and still refuse
                // them: plain allocation works there, and only costs a mapping per buffer.
                Err(e) => {
                    tracing::warn!("the driver reports stream-ordered allocation but refuses it ({e}); allocating with cuMemAlloc instead");
                    None
                }
            },
            false => None,
        };
        // SAFETY: the context is current.
        let workspace = unsafe { drv::malloc_sync(WORKSPACE) }.map_err(api("cuMemAlloc (cuBLASLt workspace)"))?;
        let lt = Lt::new(workspace, WORKSPACE)?;
        let info = DeviceInfo { name, ordinal, sm: (major, minor), sms, total_mem, emulated: false, driver_version };
        let cuda = Cuda {
            ctx,
            stream,
            pool,
            lt,
            arch: format!("sm_{major}{minor}"),
            smem_limit,
            dependent_launches: info.dependent_launches(),
            kernels: Mutex::new(Kernels { modules: HashMap::new(), functions: HashMap::new() }),
            mem: MemCounter::default(),
            _workspace: workspace,
        };
        Ok((cuda, info))
    }

    fn current(&self) -> Result<()> {
        // SAFETY: our retained context.
        unsafe { drv::ctx::set_current(self.ctx) }.map_err(api("cuCtxSetCurrent"))
    }

    pub(super) fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        self.current()?;
        let p = match self.pool {
            // SAFETY: context current, valid stream; zeroed below before any use.
            Some(_) => match unsafe { drv::malloc_async(self.stream, bytes) } {
                Ok(p) => p,
                // Freed memory in the pool may be there in pieces too small for this request:
                // hand it all back to the driver and try once more.
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    self.trim()?;
                    // SAFETY: as above.
                    unsafe { drv::malloc_async(self.stream, bytes) }.map_err(api("cuMemAllocAsync"))?
                }
                Err(e) => return Err(api("cuMemAllocAsync")(e)),
            },
            // SAFETY: context current.
            None => unsafe { drv::malloc_sync(bytes) }.map_err(api("cuMemAlloc"))?,
        };
        // SAFETY: `p` is `bytes` long.
        unsafe { drv::memset_d8_async(p, 0, bytes, self.stream) }.map_err(api("cuMemsetD8Async"))?;
        self.mem.add(DevPtr(p), bytes);
        Ok(DevPtr(p))
    }

    pub(super) fn free(&self, p: DevPtr) {
        if self.mem.remove(p).is_some() && self.current().is_ok() {
            let freed = match self.pool {
                // SAFETY: allocated by `alloc`, freed once, in stream order after its last use.
                Some(_) => unsafe { drv::free_async(p.0, self.stream) },
                // SAFETY: as above; the stream is drained first, since cuMemFree does not wait
                // for work queued on a non-blocking stream.
                None => unsafe { drv::stream::synchronize(self.stream).and_then(|()| drv::free_sync(p.0)) },
            };
            if let Err(e) = freed {
                tracing::warn!("freeing device memory: {e}");
            }
        }
    }

    pub(super) fn upload(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.current()?;
        // SAFETY: `dst` has room for `src` (engine-sized buffers). Pageable host memory is
        // staged before the call returns, so `src` may be freed afterwards.
        unsafe { drv::memcpy_htod_async(dst.0, src, self.stream) }.map_err(api("cuMemcpyHtoDAsync"))
    }

    pub(super) fn download(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        self.current()?;
        // SAFETY: `src` holds at least `dst.len()` bytes; we wait before reading `dst`.
        unsafe { drv::memcpy_dtoh_async(dst, src.0, self.stream) }.map_err(api("cuMemcpyDtoHAsync"))?;
        self.sync()
    }

    /// `bytes` of page-locked host memory: copies from and to it run in stream order without
    /// the driver staging (and possibly waiting) as it may for pageable memory.
    pub(super) fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.current()?;
        // SAFETY: context current; the caller zeroes the memory before any use.
        unsafe { drv::malloc_host(bytes, 0) }.map(|p| p.cast()).map_err(api("cuMemHostAlloc"))
    }

    /// Frees memory from [`Cuda::host_alloc`] (no copy may still use it).
    pub(super) fn host_free(&self, p: *mut u8) {
        if self.current().is_ok() {
            // SAFETY: allocated by host_alloc, freed once, its copies waited for.
            if let Err(e) = unsafe { drv::free_host(p.cast()) } {
                tracing::warn!("freeing page-locked host memory: {e}");
            }
        }
    }

    /// Queues a copy of `len` bytes of page-locked host memory at `src` to `dst`.
    pub(super) fn upload_pinned(&self, dst: DevPtr, src: *const u8, len: usize) -> Result<()> {
        self.current()?;
        // SAFETY: `src` is page-locked memory of ours holding `len` bytes, left untouched
        // until the copy's marker is reached; `dst` has room for them.
        unsafe { drv::memcpy_htod_async(dst.0, std::slice::from_raw_parts(src, len), self.stream) }.map_err(api("cuMemcpyHtoDAsync"))
    }

    /// Queues a copy of `len` bytes at `src` into page-locked host memory at `dst`.
    pub(super) fn download_pinned(&self, dst: *mut u8, src: DevPtr, len: usize) -> Result<()> {
        self.current()?;
        // SAFETY: `dst` is page-locked memory of ours with room for `len` bytes, not read
        // until the copy's marker is reached.
        unsafe { drv::memcpy_dtoh_async(std::slice::from_raw_parts_mut(dst, len), src.0, self.stream) }.map_err(api("cuMemcpyDtoHAsync"))
    }

    /// An event that only marks a point in the stream (no timing: cheaper to record).
    pub(super) fn marker(&self) -> Result<EventHandle> {
        self.current()?;
        drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map(EventHandle).map_err(api("cuEventCreate"))
    }

    /// Records `e` on the stream now.
    pub(super) fn mark(&self, e: &EventHandle) -> Result<()> {
        self.current()?;
        // SAFETY: a valid event and our stream.
        unsafe { drv::event::record(e.0, self.stream) }.map_err(api("cuEventRecord"))
    }

    /// Waits until the stream has passed where `e` was last recorded.
    pub(super) fn wait_for(&self, e: &EventHandle) -> Result<()> {
        self.current()?;
        // SAFETY: a valid event.
        unsafe { drv::event::synchronize(e.0) }.map_err(api("cuEventSynchronize (a kernel or copy queued earlier failed)"))
    }

    pub(super) fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: both hold `bytes` bytes.
        unsafe { drv::memcpy_dtod_async(dst.0, src.0, bytes, self.stream) }.map_err(api("cuMemcpyDtoDAsync"))
    }

    pub(super) fn zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        self.current()?;
        // SAFETY: `dst` holds `bytes` bytes.
        unsafe { drv::memset_d8_async(dst.0, 0, bytes, self.stream) }.map_err(api("cuMemsetD8Async"))
    }

    /// The loaded kernel `name`, allowed `smem` bytes of dynamic shared memory.
    fn function(&self, name: &str, smem: u32) -> Result<Function> {
        let mut k = self.kernels.lock().map_err(|_| CudaError::Request("kernel table poisoned".into()))?;
        if !k.functions.contains_key(name) {
            let src = kernels::source_of(name).ok_or_else(|| CudaError::Request(format!("no kernel source exports `{name}`")))?;
            let module = match k.modules.get(src.file) {
                Some(&m) => m,
                None => {
                    let cubin = kernels::cubin(src, &self.arch)?;
                    // SAFETY: a cubin NVRTC produced for this GPU's architecture.
                    let m = unsafe { drv::module::load_data(cubin.as_ptr().cast()) }.map_err(api("cuModuleLoadData"))?;
                    k.modules.insert(src.file, m);
                    m
                }
            };
            let cname = std::ffi::CString::new(name).map_err(|_| CudaError::Request(format!("kernel name {name:?}")))?;
            // SAFETY: a loaded module.
            let f = unsafe { drv::module::get_function(module, cname) }.map_err(api("cuModuleGetFunction"))?;
            let int_attr = |a: sys::CUfunction_attribute| -> Result<u32> {
                // SAFETY: a loaded function; the attribute is an int.
                Ok(unsafe { drv::function::get_function_attribute(f, a) }.map_err(api("cuFuncGetAttribute"))?.max(0) as u32)
            };
            let static_smem = int_attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
            let max_threads = int_attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
            let registers = int_attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?;
            // Without the attribute, static and dynamic shared memory together get 48 KiB.
            let allowed = (48 * 1024u32).saturating_sub(static_smem);
            k.functions.insert(name.to_string(), Function { f, static_smem, allowed, max_threads, registers });
        }
        let func = k.functions.get_mut(name).ok_or_else(|| CudaError::Request(format!("kernel {name} vanished")))?;
        if func.static_smem + smem > self.smem_limit {
            return Err(CudaError::Request(format!(
                "kernel {name} needs {} bytes of shared memory per block, more than this GPU's {} ({}): use a smaller head dimension or a GPU with more shared memory",
                func.static_smem + smem,
                self.smem_limit,
                self.arch
            )));
        }
        if smem > func.allowed {
            // SAFETY: valid function; the attribute is an int.
            unsafe { drv::function::set_function_attribute(func.f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32) }
                .map_err(api("cuFuncSetAttribute"))?;
            func.allowed = smem;
        }
        Ok(*func)
    }

    /// Launches `name`; `dependent`: as a programmatic dependent launch where the GPU has
    /// them (sm_90+), which lets it start while the kernel before runs, up to its grid_wait().
    pub(super) fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &[Arg], dependent: bool) -> Result<()> {
        self.current()?;
        let Function { f, max_threads, registers, .. } = self.function(name, smem)?;
        // The driver's answer would be CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, naming no cause.
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if threads > max_threads as u64 {
            return Err(CudaError::Request(format!(
                "kernel {name} was launched with {threads} threads per block, but on {} it allows at most {max_threads} (its __launch_bounds__, the GPU's 1024, or its {registers} registers per thread within an SM's 65536): launch smaller blocks, or give the kernel bounds that admit them",
                self.arch
            )));
        }
        let mut vals: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p.0,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::U64(v) => v,
            })
            .collect();
        // Each parameter points at its own 8 bytes; 4-byte parameters read the low half
        // (little-endian), as cuLaunchKernel copies each by its declared size.
        let mut params: Vec<*mut c_void> = vals.iter_mut().map(|v| (v as *mut u64).cast::<c_void>()).collect();
        let launched = if dependent && self.dependent_launches {
            // SAFETY: zeroed is a valid value of this plain-data union; the field set is the
            // one the attribute's id names.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: smem,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; the config and its attribute outlive the call.
            unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }.result().map_err(api("cuLaunchKernelEx"))
        } else {
            // SAFETY: one value per kernel parameter, alive during the call (the driver copies them).
            unsafe { drv::launch_kernel(f, (grid[0], grid[1], grid[2]), (block[0], block[1], block[2]), smem, self.stream, &mut params) }.map_err(api("cuLaunchKernel"))
        };
        launched.map_err(|e| CudaError::Api { call: format!("launching {name}"), msg: e.to_string() })
    }

    pub(super) fn gemm(&self, g: &Gemm) -> Result<()> {
        self.current()?;
        self.lt.gemm(g, self.stream as cudarc::cublaslt::sys::cudaStream_t)
    }

    /// Waits for queued work, then releases the pool's idle memory to the driver.
    pub(super) fn trim(&self) -> Result<()> {
        let Some(pool) = self.pool else { return Ok(()) };
        self.sync()?;
        // SAFETY: the device's default pool; nothing queued uses the idle memory.
        unsafe { drv::mem_pool::trim_to(pool, 0) }.map_err(api("cuMemPoolTrimTo"))
    }

    pub(super) fn on_stream<R>(&self, f: impl FnOnce(*mut c_void) -> Result<R>) -> Result<R> {
        self.current()?;
        f(self.stream.cast())
    }

    pub(super) fn begin_capture(&self) -> Result<()> {
        self.current()?;
        // Relaxed: this thread may still make calls that are unsafe during a global capture
        // (a first-use module load, cuBLASLt's planning); what we refuse is checked by Gpu.
        // SAFETY: our stream.
        unsafe { drv::stream::begin_capture(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) }.map_err(api("cuStreamBeginCapture"))
    }

    pub(super) fn end_capture(&self) -> Result<sys::CUgraphExec> {
        self.current()?;
        // SAFETY: our stream, capturing since begin_capture.
        let graph = unsafe { drv::stream::end_capture(self.stream) }.map_err(api("cuStreamEndCapture"))?;
        // SAFETY: a graph just captured.
        let exec = unsafe { drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }.map_err(api("cuGraphInstantiate"));
        // SAFETY: the executable graph is independent of the graph it came from.
        let _ = unsafe { drv::graph::destroy(graph) };
        exec
    }

    pub(super) fn replay(&self, exec: sys::CUgraphExec) -> Result<()> {
        self.current()?;
        // SAFETY: an instantiated graph of this context; our stream.
        unsafe { drv::graph::launch(exec, self.stream) }.map_err(api("cuGraphLaunch"))
    }

    pub(super) fn destroy_graph(&self, exec: sys::CUgraphExec) {
        if self.current().is_ok() {
            // SAFETY: instantiated by end_capture, destroyed once (by its Graph's drop).
            if let Err(e) = unsafe { drv::graph::exec_destroy(exec) } {
                tracing::warn!("cuGraphExecDestroy: {e}");
            }
        }
    }

    pub(super) fn sync(&self) -> Result<()> {
        self.current()?;
        // SAFETY: our stream.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(api("cuStreamSynchronize (a kernel or copy queued earlier failed)"))
    }

    pub(super) fn mem_info(&self) -> Result<(u64, u64)> {
        self.current()?;
        let (free, total) = drv::mem_get_info().map_err(api("cuMemGetInfo"))?;
        // Memory our pool holds but no buffer uses is free for our next allocations.
        let idle = match self.pool {
            Some(pool) => {
                let attr = |a: sys::CUmemPool_attribute| -> Result<u64> {
                    let mut v = 0u64;
                    // SAFETY: these attributes are u64s.
                    unsafe { drv::mem_pool::get_attribute(pool, a, (&mut v as *mut u64).cast()) }.map_err(api("cuMemPoolGetAttribute"))?;
                    Ok(v)
                };
                let reserved = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
                reserved.saturating_sub(attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?)
            }
            None => 0,
        };
        Ok(((free as u64 + idle).min(total as u64), total as u64))
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

    pub(super) fn timed<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(R, f64)> {
        let a = self.stamp()?;
        let run = || -> Result<(R, f64)> {
            let r = f()?;
            let b = self.stamp()?;
            let out = self.wait_for(&b).and_then(|_| self.seconds_between(&a, &b));
            self.destroy_event(b);
            Ok((r, out?))
        };
        let out = run();
        self.destroy_event(a);
        out
    }

    /// A timing event recorded on the stream now.
    pub(super) fn stamp(&self) -> Result<EventHandle> {
        self.current()?;
        let ev = drv::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(api("cuEventCreate"))?;
        self.record(EventHandle(ev))
    }

    /// Records event `e` (timing enabled) on the stream now; destroys it when that fails.
    pub(super) fn record(&self, e: EventHandle) -> Result<EventHandle> {
        match self.mark(&e) {
            Ok(()) => Ok(e),
            Err(err) => {
                self.destroy_event(e);
                Err(err)
            }
        }
    }

    /// Seconds from event `a` to event `b`, both recorded and complete.
    pub(super) fn seconds_between(&self, a: &EventHandle, b: &EventHandle) -> Result<f64> {
        self.current()?;
        // cuEventElapsedTime, not cudarc's `elapsed`: with CUDA 13 bindings that calls the
        // _v2 symbol, which drivers before 12.8 lack (cudarc panics on a missing symbol).
        type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
        // SAFETY: the driver's C function of this signature, exported by every driver.
        let elapsed = unsafe { sys::culib().get::<ElapsedFn>(b"cuEventElapsedTime\0") }
            .map_err(|e| CudaError::Api { call: "cuEventElapsedTime".into(), msg: e.to_string() })?;
        let mut ms = 0f32;
        // SAFETY: both events recorded and complete; valid out-pointer.
        unsafe { elapsed(&mut ms, a.0, b.0) }.result().map_err(api("cuEventElapsedTime"))?;
        Ok(ms as f64 / 1e3)
    }

    /// Frees an event made by [`Cuda::stamp`].
    pub(super) fn destroy_event(&self, e: EventHandle) {
        if self.current().is_ok() {
            // SAFETY: made by `stamp`, destroyed once (taken by value).
            let _ = unsafe { drv::event::destroy(e.0) };
        }
    }
}
