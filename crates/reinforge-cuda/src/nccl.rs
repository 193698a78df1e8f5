//! NCCL: collectives between the GPUs of data-parallel ranks (the gradient all-reduce, weight
//! broadcasts), device memory to device memory on each GPU's stream.
//!
//! Bound by hand over `libloading` rather than through cudarc: cudarc's NCCL loader looks for
//! `libnccl.so.<CUDA major>`, while NCCL's wheel (`nvidia-nccl-cu13`) and system packages ship
//! `libnccl.so.2`; and these are the ten calls we make. The library is found like every
//! other CUDA library ([`crate::libs`]). A communicator is made from a unique id that one rank
//! creates and the others receive through the controller's own channel (as PyTorch passes it
//! through its store), so nothing here knows how ranks talk.
//!
//! Joining a communicator waits for every rank, and a rank that fails before joining would
//! leave the others waiting forever: with NCCL 2.14 or newer the communicator is made
//! non-blocking (`ncclCommInitRankConfig`) and polled against a deadline, after which it is
//! aborted and the join fails with what to check.

use crate::error::{CudaError, Result};
use crate::gpu::{DType, DevPtr, Gpu};
use crate::libs::{self, CudaLib};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
type CommInitRankConfigFn = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int, *mut Config) -> c_int;
type CommGetAsyncErrorFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;
type GetErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// `ncclDataType_t` values (nccl.h).
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t`'s `ncclSum`.
const NCCL_SUM: c_int = 0;
/// `ncclResult_t`'s `ncclInvalidArgument` and `ncclInProgress`.
const NCCL_INVALID_ARGUMENT: c_int = 4;
const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclConfig_t` as NCCL 2.14 laid it out (every later version appends fields and reads a
/// config by its `size` and `version`, taking its defaults for the rest), with the one field
/// we set. `_cga_cluster_size` fills the struct's tail padding, which NCCL copies too.
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    _cga_cluster_size: c_int,
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.14 with `blocking = 0`.
    fn non_blocking() -> Config {
        const UNDEF_INT: c_int = c_int::MIN;
        Config { size: std::mem::size_of::<Config>(), magic: 0xcafe_beef, version: 21400, blocking: 0, _cga_cluster_size: UNDEF_INT }
    }
}

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
    /// NCCL 2.14+: a communicator that does not block (with the next two, its polling and abort).
    non_blocking: Option<NonBlocking>,
}

/// The calls of a non-blocking communicator.
#[derive(Clone, Copy)]
struct NonBlocking {
    init: CommInitRankConfigFn,
    async_error: CommGetAsyncErrorFn,
    finalize: CommDestroyFn,
    abort: CommDestroyFn,
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
    macro_rules! opt_sym {
        ($name:literal) => {{
            // SAFETY: as above.
            unsafe { loaded.lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|s| *s)
        }};
    }
    let non_blocking = match (opt_sym!("ncclCommInitRankConfig"), opt_sym!("ncclCommGetAsyncError"), opt_sym!("ncclCommFinalize"), opt_sym!("ncclCommAbort")) {
        (Some(init), Some(async_error), Some(finalize), Some(abort)) => Some(NonBlocking { init, async_error, finalize, abort }),
        _ => None,
    };
    let api = Api {
        non_blocking,
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
    Err(nccl_error(api, call, code))
}

fn nccl_error(api: &Api, call: &str, code: c_int) -> CudaError {
    // SAFETY: NCCL returns a static string for every result code.
    let msg = unsafe { CStr::from_ptr((api.error_string)(code)) }.to_string_lossy().into_owned();
    CudaError::Api { call: call.into(), msg: format!("NCCL error {code}: {msg} (NCCL_DEBUG=INFO says more; NCCL_SOCKET_IFNAME picks the network interface)") }
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
    /// How long a call may stay in progress (non-blocking communicators).
    timeout: Duration,
    /// Made non-blocking (NCCL 2.14+), so joins and calls have a deadline.
    non_blocking: bool,
    /// A collective has been queued (NCCL connects, and allocates its buffers, at the first).
    connected: std::sync::atomic::AtomicBool,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time (`&mut`-free
// calls here are still serialised by the single stream they queue on).
unsafe impl Send for Comm {}

impl Comm {
    /// Joins the communicator of `world` ranks made from `id`, as `rank`, on `gpu`. Every rank
    /// must call this together: it returns once all have joined, or fails after `timeout`
    /// (NCCL 2.14+; older ones wait as long as it takes).
    pub fn init(gpu: &Arc<Gpu>, id: &UniqueId, rank: usize, world: usize, timeout: Duration) -> Result<Comm> {
        let api = api()?;
        if rank >= world {
            return Err(CudaError::Request(format!("NCCL rank {rank} is outside a world of {world}")));
        }
        // NCCL's buffers are allocated outside our memory pool: give it the pool's idle memory.
        gpu.release_cached()?;
        let mut comm = std::ptr::null_mut();
        if let Some(nb) = api.non_blocking {
            let mut cfg = Config::non_blocking();
            // NCCL uses the CUDA device current on this thread: the GPU's context, made current here.
            // SAFETY: valid out-pointer and config; the id is passed by value as nccl.h declares.
            let code = gpu.on_stream(|_| Ok(unsafe { (nb.init)(&mut comm, world as c_int, *id, rank as c_int, &mut cfg) }))?;
            if code == NCCL_INVALID_ARGUMENT && comm.is_null() {
                // A config this NCCL does not take: join the blocking way.
                tracing::warn!("NCCL refused a non-blocking communicator config; joining without a deadline");
            } else {
                let joined = Comm { gpu: Arc::clone(gpu), comm, rank, world, timeout, non_blocking: true, connected: Default::default() };
                if code != 0 && code != NCCL_IN_PROGRESS {
                    joined.abort();
                    return Err(nccl_error(api, "ncclCommInitRankConfig", code));
                }
                if let Err(e) = gpu.on_stream(|_| joined.wait("joining the communicator")) {
                    joined.abort();
                    return Err(e);
                }
                return Ok(joined);
            }
        }
        gpu.on_stream(|_| {
            // SAFETY: valid out-pointer; the id is passed by value as nccl.h declares.
            check(api, "ncclCommInitRank", unsafe { (api.comm_init_rank)(&mut comm, world as c_int, *id, rank as c_int) })
        })?;
        Ok(Comm { gpu: Arc::clone(gpu), comm, rank, world, timeout, non_blocking: false, connected: Default::default() })
    }

    /// Whether joins and calls have a deadline (a non-blocking communicator, NCCL 2.14+).
    pub fn has_deadline(&self) -> bool {
        self.non_blocking
    }

    /// Polls a non-blocking communicator until its last call is done: an error if it failed
    /// or is still in progress after the timeout (a rank that never joined, or a network NCCL
    /// cannot cross). Called inside [`Gpu::on_stream`]: NCCL may still be queuing the call's
    /// kernel on our stream from its own thread, which no other device work (nor a graph
    /// recording) may interleave with.
    fn wait(&self, what: &str) -> Result<()> {
        let api = api()?;
        let Some(nb) = api.non_blocking.filter(|_| self.non_blocking) else { return Ok(()) };
        // No deadline when the timeout is beyond what a clock can hold.
        let deadline = Instant::now().checked_add(self.timeout);
        for polls in 0u64.. {
            let mut state: c_int = NCCL_IN_PROGRESS;
            // SAFETY: a communicator made by ncclCommInitRankConfig; valid out-pointer.
            check(api, "ncclCommGetAsyncError", unsafe { (nb.async_error)(self.comm, &mut state) })?;
            match state {
                0 => return Ok(()),
                // A collective's enqueue finishes in microseconds: spin briefly before sleeping.
                NCCL_IN_PROGRESS if deadline.is_none_or(|d| Instant::now() < d) => {
                    if polls < 1000 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                NCCL_IN_PROGRESS => {
                    return Err(CudaError::Api {
                        call: format!("NCCL {what}"),
                        msg: format!(
                            "rank {} of {} still waiting after {} s: another rank failed before joining (see its log) or the nodes cannot reach each other on the network NCCL chose (NCCL_SOCKET_IFNAME picks the interface, NCCL_DEBUG=INFO shows it); cluster.nccl_timeout_s sets this limit",
                            self.rank,
                            self.world,
                            self.timeout.as_secs()
                        ),
                    })
                }
                code => return check(api, &format!("NCCL {what}"), code),
            }
        }
        Ok(())
    }

    /// Ends the communicator without waiting for other ranks (after an error or a timeout).
    fn abort(mut self) {
        if let (Ok(api), false) = (api(), self.comm.is_null()) {
            if let Some(nb) = api.non_blocking {
                // SAFETY: made by ncclCommInitRankConfig, ended once: Drop sees the null below.
                let _ = unsafe { (nb.abort)(self.comm) };
            }
        }
        self.comm = std::ptr::null_mut();
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
        self.before_first_collective()?;
        self.gpu.on_stream(|stream| {
            let buf = p.0 as *mut c_void;
            // SAFETY: `p` holds `n` elements of `dt` on this GPU; in place is allowed.
            let code = unsafe { (api.all_reduce)(buf, buf, n, nccl_type(dt), NCCL_SUM, self.comm, stream) };
            self.queued(api, "ncclAllReduce", code)
        })
    }

    /// Copies `n` elements of type `dt` at `p` on rank `root` to `p` on every other rank.
    pub fn broadcast(&self, p: DevPtr, n: usize, dt: DType, root: usize) -> Result<()> {
        let api = api()?;
        self.before_first_collective()?;
        self.gpu.on_stream(|stream| {
            let buf = p.0 as *mut c_void;
            // SAFETY: `p` holds `n` elements of `dt` on this GPU; in place is allowed.
            let code = unsafe { (api.broadcast)(buf, buf, n, nccl_type(dt), root as c_int, self.comm, stream) };
            self.queued(api, "ncclBroadcast", code)
        })
    }

    /// NCCL 2.22+ connects ranks and allocates its buffers, outside our memory pool, at the
    /// first collective rather than when joining (`NCCL_RUNTIME_CONNECT`): the pool's idle
    /// memory goes back to the driver once more before it.
    fn before_first_collective(&self) -> Result<()> {
        if !self.connected.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.gpu.release_cached()?;
        }
        Ok(())
    }

    /// The result of queuing a collective: a non-blocking communicator may answer "in
    /// progress" while it enqueues, and takes no other call until that is done (waited for
    /// inside the caller's [`Gpu::on_stream`]).
    fn queued(&self, api: &Api, call: &str, code: c_int) -> Result<()> {
        if code == NCCL_IN_PROGRESS {
            return self.wait(call);
        }
        check(api, call, code)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let Ok(api) = api() else { return };
        if self.comm.is_null() {
            return;
        }
        // Destroying waits for the communicator's queued work; the context must be current. A
        // non-blocking communicator is finalized first and polled (within the timeout, else
        // aborted), as NCCL asks.
        let _ = self.gpu.on_stream(|_| {
            if let Some(nb) = api.non_blocking.filter(|_| self.non_blocking) {
                // SAFETY: a live communicator made by ncclCommInitRankConfig.
                let code = unsafe { (nb.finalize)(self.comm) };
                let done = if code == NCCL_IN_PROGRESS { self.wait("finalizing") } else { check(api, "ncclCommFinalize", code) };
                if let Err(e) = done {
                    tracing::warn!("{e}: aborting the NCCL communicator");
                    // SAFETY: as above; not used again.
                    let _ = unsafe { (nb.abort)(self.comm) };
                    return Ok(());
                }
            }
            // SAFETY: made by ncclCommInitRank(Config), destroyed once.
            check(api, "ncclCommDestroy", unsafe { (api.comm_destroy)(self.comm) })
        });
    }
}

#[cfg(test)]
mod tests {
    /// NCCL 2.14's `ncclConfig_t` (size_t size; unsigned magic, version; int blocking), padded
    /// to 8 bytes: what NCCL reads from the config we pass.
    #[test]
    fn config_has_nccl_2_14_layout() {
        let c = super::Config::non_blocking();
        assert_eq!(std::mem::size_of::<super::Config>(), 24);
        assert_eq!(c.size, 24);
        assert_eq!(std::mem::offset_of!(super::Config, blocking), 16);
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21400, 0));
    }

    /// Where NCCL is installed (`REINFORGE_CUDA_LIB_DIRS` or the usual places), the binding
    /// loads every symbol and the two calls that need no GPU answer; elsewhere (CI) it says
    /// so and passes.
    #[test]
    fn binds_nccl_where_it_is_installed() {
        match super::version() {
            Ok((v, path)) => {
                assert!(v >= 20000, "NCCL version {v} from {path}");
                // Every NCCL since 2.14 has the non-blocking calls the join's deadline needs.
                assert_eq!(super::api().expect("loaded").non_blocking.is_some(), v >= 21400, "NCCL {v}");
                let a = super::unique_id().expect("ncclGetUniqueId needs no GPU");
                let b = super::unique_id().expect("ncclGetUniqueId needs no GPU");
                assert!(a.internal != b.internal, "two unique ids are the same");
            }
            Err(e) => eprintln!("NCCL not found, binding not exercised: {e}"),
        }
    }
}
