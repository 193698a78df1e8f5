//! NCCL: collectives between the GPUs of data-parallel ranks (the gradient all-reduce, weight
//! broadcasts), device memory to device memory on each GPU's stream.
//!
//! Bound by hand over `libloading` rather than through cudarc: cudarc's NCCL loader looks for
//! `libnccl.so.<CUDA major>`, while NCCL's wheel (`nvidia-nccl-cu13`) and system packages ship
//! `libnccl.so.2`; and these are the seven calls we make. The library is found like every
//! other CUDA library ([`crate::libs`]). A communicator is made from a unique id that one rank
//! creates and the others receive through the controller's own channel (as PyTorch passes it
//! through its store), so nothing here knows how ranks talk.

use crate::error::{CudaError, Result};
use crate::gpu::{DType, DevPtr, Gpu};
use crate::libs::{self, CudaLib};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};

/// `ncclUniqueId`: what every rank passes to make the same communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// NCCL's opaque bytes.
    pub internal: [u8; 128],
}

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRankFn = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int;
type CollectiveFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
type CommDestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// `ncclDataType_t` values (nccl.h).
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t`'s `ncclSum`.
const NCCL_SUM: c_int = 0;

struct Api {
    _lib: libloading::Library,
    path: String,
    get_version: GetVersionFn,
    get_unique_id: GetUniqueIdFn,
    comm_init_rank: CommInitRankFn,
    all_reduce: CollectiveFn,
    broadcast: CollectiveFn,
    comm_destroy: CommDestroyFn,
    error_string: GetErrorStringFn,
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load().map_err(|e| e.to_string())).as_ref().map_err(|m| CudaError::Request(m.clone()))
}

fn load() -> Result<Api> {
    let loaded = libs::load(CudaLib::Nccl)?;
    let path = loaded.path.as_ref().map_or_else(|| "libnccl.so.2".to_string(), |p| p.display().to_string());
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: NCCL's public C API, with the signature of the field's type (nccl.h).
            *unsafe { loaded.lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| CudaError::Request(format!("{path} has no {}: {e}", $name)))?
        }};
    }
    let api = Api {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        comm_destroy: sym!("ncclCommDestroy"),
        error_string: sym!("ncclGetErrorString"),
        path: path.clone(),
        _lib: loaded.lib,
    };
    Ok(api)
}

fn check(api: &Api, call: &str, code: c_int) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every result code.
    let msg = unsafe { CStr::from_ptr((api.error_string)(code)) }.to_string_lossy().into_owned();
    Err(CudaError::Api { call: call.into(), msg: format!("NCCL error {code}: {msg} (NCCL_DEBUG=INFO says more; NCCL_SOCKET_IFNAME picks the network interface)") })
}

/// NCCL's version (e.g. 22703 for 2.27.3) and the file it was loaded from.
pub fn version() -> Result<(i32, String)> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok((v, api.path.clone()))
}

/// Whether this process can take part in NCCL collectives on `gpu`: a real GPU (not the
/// emulator) and an NCCL that loads (why not is logged).
pub fn usable_on(gpu: &Gpu) -> bool {
    !gpu.info.emulated && version().map_err(|e| tracing::warn!("NCCL: {e}")).is_ok()
}

/// A new unique id (one rank makes it; every rank of the communicator uses it).
pub fn unique_id() -> Result<UniqueId> {
    let api = api()?;
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    check(api, "ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    Ok(id)
}

fn nccl_type(dt: DType) -> c_int {
    match dt {
        DType::F32 => NCCL_FLOAT32,
        DType::Bf16 => NCCL_BFLOAT16,
    }
}

/// One rank's NCCL communicator on its GPU.
pub struct Comm {
    gpu: Arc<Gpu>,
    comm: *mut c_void,
    rank: usize,
    world: usize,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time (`&mut`-free
// calls here are still serialised by the single stream they queue on).
unsafe impl Send for Comm {}

impl Comm {
    /// Joins the communicator of `world` ranks made from `id`, as `rank`, on `gpu`. Every rank
    /// must call this together: it returns once all have joined.
    pub fn init(gpu: &Arc<Gpu>, id: &UniqueId, rank: usize, world: usize) -> Result<Comm> {
        let api = api()?;
        if rank >= world {
            return Err(CudaError::Request(format!("NCCL rank {rank} is outside a world of {world}")));
        }
        // NCCL's buffers are allocated outside our memory pool: give it the pool's idle memory.
        gpu.release_cached()?;
        let mut comm = std::ptr::null_mut();
        // NCCL uses the CUDA device current on this thread: the GPU's context, made current here.
        gpu.on_stream(|_| {
            // SAFETY: valid out-pointer; the id is passed by value as nccl.h declares.
            check(api, "ncclCommInitRank", unsafe { (api.comm_init_rank)(&mut comm, world as c_int, *id, rank as c_int) })
        })?;
        Ok(Comm { gpu: Arc::clone(gpu), comm, rank, world })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Replaces `n` elements of type `dt` at `p` on every rank with their sum over ranks
    /// (queued on the GPU's stream, in order with the rest of its work).
    pub fn all_reduce_sum(&self, p: DevPtr, n: usize, dt: DType) -> Result<()> {
        let api = api()?;
        self.gpu.on_stream(|stream| {
            let buf = p.0 as *mut c_void;
            // SAFETY: `p` holds `n` elements of `dt` on this GPU; in place is allowed.
            check(api, "ncclAllReduce", unsafe { (api.all_reduce)(buf, buf, n, nccl_type(dt), NCCL_SUM, self.comm, stream) })
        })
    }

    /// Copies `n` elements of type `dt` at `p` on rank `root` to `p` on every other rank.
    pub fn broadcast(&self, p: DevPtr, n: usize, dt: DType, root: usize) -> Result<()> {
        let api = api()?;
        self.gpu.on_stream(|stream| {
            let buf = p.0 as *mut c_void;
            // SAFETY: `p` holds `n` elements of `dt` on this GPU; in place is allowed.
            check(api, "ncclBroadcast", unsafe { (api.broadcast)(buf, buf, n, nccl_type(dt), root as c_int, self.comm, stream) })
        })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // Destroying waits for the communicator's queued work; the context must be current.
            let _ = self.gpu.on_stream(|_| {
                // SAFETY: made by ncclCommInitRank, destroyed once.
                check(api, "ncclCommDestroy", unsafe { (api.comm_destroy)(self.comm) })
            });
        }
    }
}

#[cfg(test)]
mod tests {
    /// Where NCCL is installed (`REINFORGE_CUDA_LIB_DIRS` or the usual places), the binding
    /// loads every symbol and the two calls that need no GPU answer; elsewhere (CI) it says
    /// so and passes.
    #[test]
    fn binds_nccl_where_it_is_installed() {
        match super::version() {
            Ok((v, path)) => {
                assert!(v >= 20000, "NCCL version {v} from {path}");
                let a = super::unique_id().expect("ncclGetUniqueId needs no GPU");
                let b = super::unique_id().expect("ncclGetUniqueId needs no GPU");
                assert!(a.internal != b.internal, "two unique ids are the same");
            }
            Err(e) => eprintln!("NCCL not found, binding not exercised: {e}"),
        }
    }
}
