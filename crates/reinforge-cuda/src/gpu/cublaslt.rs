//! cuBLASLt GEMMs, bound to the library file [`crate::libs`] found (as for NVRTC: cudarc's
//! own loader would ignore `REINFORGE_CUDA_LIB_DIRS`); types come from cudarc.
//!
//! Our [`Gemm`]s are row-major; cuBLASLt is column-major. A row-major `D[m, n]` is the
//! column-major `Dᵀ[n, m]`, and `Dᵀ = op(B)ᵀ · op(A)ᵀ`: so B's buffer is cuBLASLt's A and A's
//! buffer its B, each keeping its own transpose flag, and a bias over D's columns is
//! cuBLASLt's bias over its rows. Plans (descriptors, layouts, the chosen algorithm) are made
//! once per shape and reused.

use super::{DType, Gemm};
use crate::error::{CudaError, Result};
use crate::libs::{self, CudaLib};
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t, cublasLtMatmulDesc_t,
    cublasLtMatmulHeuristicResult_t, cublasLtMatmulPreferenceAttributes_t, cublasLtMatmulPreference_t, cublasLtMatrixLayout_t,
    cublasStatus_t, cudaDataType_t, cudaStream_t,
};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

type CreateFn = unsafe extern "C" fn(*mut cublasLtHandle_t) -> cublasStatus_t;
type DescCreateFn = unsafe extern "C" fn(*mut cublasLtMatmulDesc_t, cublasComputeType_t, cudaDataType_t) -> cublasStatus_t;
type DescSetFn = unsafe extern "C" fn(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, *const c_void, usize) -> cublasStatus_t;
type LayoutCreateFn = unsafe extern "C" fn(*mut cublasLtMatrixLayout_t, cudaDataType_t, u64, u64, i64) -> cublasStatus_t;
type PrefCreateFn = unsafe extern "C" fn(*mut cublasLtMatmulPreference_t) -> cublasStatus_t;
type PrefSetFn = unsafe extern "C" fn(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, *const c_void, usize) -> cublasStatus_t;
type PrefDestroyFn = unsafe extern "C" fn(cublasLtMatmulPreference_t) -> cublasStatus_t;
type HeuristicFn = unsafe extern "C" fn(
    cublasLtHandle_t,
    cublasLtMatmulDesc_t,
    cublasLtMatrixLayout_t,
    cublasLtMatrixLayout_t,
    cublasLtMatrixLayout_t,
    cublasLtMatrixLayout_t,
    cublasLtMatmulPreference_t,
    c_int,
    *mut cublasLtMatmulHeuristicResult_t,
    *mut c_int,
) -> cublasStatus_t;
type MatmulFn = unsafe extern "C" fn(
    cublasLtHandle_t,
    cublasLtMatmulDesc_t,
    *const c_void,
    *const c_void,
    cublasLtMatrixLayout_t,
    *const c_void,
    cublasLtMatrixLayout_t,
    *const c_void,
    *const c_void,
    cublasLtMatrixLayout_t,
    *mut c_void,
    cublasLtMatrixLayout_t,
    *const cublasLtMatmulAlgo_t,
    *mut c_void,
    usize,
    cudaStream_t,
) -> cublasStatus_t;
type StatusStrFn = unsafe extern "C" fn(cublasStatus_t) -> *const c_char;
type VersionFn = unsafe extern "C" fn() -> usize;

/// The cuBLASLt entry points we use.
struct Api {
    _lib: libs::Loaded,
    create: CreateFn,
    desc_create: DescCreateFn,
    desc_set: DescSetFn,
    layout_create: LayoutCreateFn,
    pref_create: PrefCreateFn,
    pref_set: PrefSetFn,
    pref_destroy: PrefDestroyFn,
    heuristic: HeuristicFn,
    matmul: MatmulFn,
    status_str: StatusStrFn,
    version: VersionFn,
}

/// cuBLASLt's version number (e.g. 130001), from the library the engine loads (`cuda info`).
pub fn version() -> Result<usize> {
    let api = api()?;
    // SAFETY: no arguments.
    Ok(unsafe { (api.version)() })
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load().map_err(|e| e.to_string())).as_ref().map_err(|m| CudaError::Request(m.clone()))
}

fn load() -> Result<Api> {
    let loaded = libs::load(CudaLib::CublasLt)?;
    let path = loaded.path.as_ref().map_or_else(|| "libcublasLt".to_string(), |p| p.display().to_string());
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: cuBLASLt's public C API, with the signature of the field's type.
            let s = unsafe { loaded.lib.get::<_>($name) }
                .map_err(|e| CudaError::Api { call: String::from_utf8_lossy($name).into(), msg: format!("{path} lacks it ({e})") })?;
            *s
        }};
    }
    Ok(Api {
        create: sym!(b"cublasLtCreate"),
        desc_create: sym!(b"cublasLtMatmulDescCreate"),
        desc_set: sym!(b"cublasLtMatmulDescSetAttribute"),
        layout_create: sym!(b"cublasLtMatrixLayoutCreate"),
        pref_create: sym!(b"cublasLtMatmulPreferenceCreate"),
        pref_set: sym!(b"cublasLtMatmulPreferenceSetAttribute"),
        pref_destroy: sym!(b"cublasLtMatmulPreferenceDestroy"),
        heuristic: sym!(b"cublasLtMatmulAlgoGetHeuristic"),
        matmul: sym!(b"cublasLtMatmul"),
        status_str: sym!(b"cublasLtGetStatusString"),
        version: sym!(b"cublasLtGetVersion"),
        _lib: loaded,
    })
}

fn check(api: &Api, call: &str, s: cublasStatus_t) -> Result<()> {
    if s == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cuBLASLt returns a static string for every status.
    let msg = unsafe { CStr::from_ptr((api.status_str)(s)) }.to_string_lossy().into_owned();
    Err(CudaError::Api { call: call.into(), msg: format!("{s:?}: {msg}") })
}

fn data_type(d: DType) -> cudaDataType_t {
    match d {
        DType::F32 => cudaDataType_t::CUDA_R_32F,
        DType::Bf16 => cudaDataType_t::CUDA_R_16BF,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldd: usize,
    trans_a: bool,
    trans_b: bool,
    ab: DType,
    d: DType,
    bias: bool,
    /// Byte alignment (≤ 256) of cuBLASLt's A, B, C and D pointers: the algorithm chosen may
    /// rely on it, and cuBLASLt assumes 256 unless told (our activations at a row offset are
    /// often only 16-byte aligned).
    align: [u32; 4],
}

/// The largest power of two ≤ 256 that divides `p`.
fn alignment(p: u64) -> u32 {
    1u32 << p.trailing_zeros().min(8)
}

/// Descriptors and the algorithm for one GEMM shape. Never destroyed: a handful per model,
/// for the life of the process.
struct Plan {
    desc: cublasLtMatmulDesc_t,
    a: cublasLtMatrixLayout_t,
    b: cublasLtMatrixLayout_t,
    c: cublasLtMatrixLayout_t,
    algo: cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are only used under the `Lt::plans` mutex.
unsafe impl Send for Plan {}

/// A cuBLASLt handle with its workspace and plans.
pub(super) struct Lt {
    handle: cublasLtHandle_t,
    workspace: u64,
    workspace_bytes: usize,
    plans: Mutex<HashMap<Key, Plan>>,
}

// SAFETY: the handle is used from whichever thread has the context current; plans are behind a mutex.
unsafe impl Send for Lt {}
// SAFETY: as above.
unsafe impl Sync for Lt {}

impl Lt {
    /// A handle; `workspace` is device memory of `workspace_bytes` the caller keeps alive.
    pub(super) fn new(workspace: u64, workspace_bytes: usize) -> Result<Lt> {
        let api = api()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(api, "cublasLtCreate", unsafe { (api.create)(&mut handle) })?;
        Ok(Lt { handle, workspace, workspace_bytes, plans: Mutex::new(HashMap::new()) })
    }


    fn plan(&self, api: &Api, key: Key) -> Result<Plan> {
        let mut desc = std::ptr::null_mut();
        // SAFETY: valid out-pointer; 32F compute with f32 scales for both input types.
        check(api, "cublasLtMatmulDescCreate", unsafe {
            (api.desc_create)(&mut desc, cublasComputeType_t::CUBLAS_COMPUTE_32F, cudaDataType_t::CUDA_R_32F)
        })?;
        let set = |attr: cublasLtMatmulDescAttributes_t, v: *const c_void, size: usize, what: &str| {
            // SAFETY: `v` points at `size` bytes of the attribute's type.
            check(api, what, unsafe { (api.desc_set)(desc, attr, v, size) })
        };
        // cublasOperation_t (cuBLAS's header, not cuBLASLt's): CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| -> i32 { i32::from(t) };
        // cuBLASLt's A is our B, its B our A (see the module docs).
        let (ta, tb) = (op(key.trans_b), op(key.trans_a));
        set(cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, (&ta as *const i32).cast(), 4, "set TRANSA")?;
        set(cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, (&tb as *const i32).cast(), 4, "set TRANSB")?;
        if key.bias {
            let epi = cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
            set(cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, (&epi as *const cublasLtEpilogue_t).cast(), std::mem::size_of_val(&epi), "set EPILOGUE")?;
        }
        let layout = |dt: DType, rows: usize, cols: usize, ld: usize| -> Result<cublasLtMatrixLayout_t> {
            let mut l = std::ptr::null_mut();
            // SAFETY: valid out-pointer; column-major by default.
            check(api, "cublasLtMatrixLayoutCreate", unsafe { (api.layout_create)(&mut l, data_type(dt), rows as u64, cols as u64, ld as i64) })?;
            Ok(l)
        };
        let (m, n, k) = (key.n, key.m, key.k); // cuBLASLt's M, N, K
        let a = if key.trans_b { layout(key.ab, k, m, key.ldb)? } else { layout(key.ab, m, k, key.ldb)? };
        let b = if key.trans_a { layout(key.ab, n, k, key.lda)? } else { layout(key.ab, k, n, key.lda)? };
        let c = layout(key.d, m, n, key.ldd)?;
        let mut pref = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(api, "cublasLtMatmulPreferenceCreate", unsafe { (api.pref_create)(&mut pref) })?;
        let ws = self.workspace_bytes as u64;
        // SAFETY: the attribute is a u64.
        check(api, "set MAX_WORKSPACE_BYTES", unsafe {
            (api.pref_set)(pref, cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&ws as *const u64).cast(), 8)
        })?;
        use cublasLtMatmulPreferenceAttributes_t as P;
        for (attr, bytes) in [P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES]
            .into_iter()
            .zip(key.align)
        {
            // SAFETY: the attribute is a u32.
            check(api, "set MIN_ALIGNMENT", unsafe { (api.pref_set)(pref, attr, (&bytes as *const u32).cast(), 4) })?;
        }
        // SAFETY: zeroed is a valid bit pattern for this plain C struct.
        let mut result: cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let mut found: c_int = 0;
        // SAFETY: all descriptors are valid; one result slot.
        let r = unsafe { (api.heuristic)(self.handle, desc, a, b, c, c, pref, 1, &mut result, &mut found) };
        // SAFETY: created above, not used again.
        unsafe { (api.pref_destroy)(pref) };
        check(api, "cublasLtMatmulAlgoGetHeuristic", r)?;
        if found == 0 {
            return Err(CudaError::Api {
                call: "cublasLtMatmulAlgoGetHeuristic".into(),
                msg: format!("no algorithm for a {}×{}×{} GEMM ({:?} → {:?}); this GPU or cuBLASLt lacks it", key.m, key.n, key.k, key.ab, key.d),
            });
        }
        Ok(Plan { desc, a, b, c, algo: result.algo })
    }

    /// Queues `g` on `stream`.
    pub(super) fn gemm(&self, g: &Gemm, stream: cudaStream_t) -> Result<()> {
        let api = api()?;
        let key = Key {
            m: g.m,
            n: g.n,
            k: g.k,
            lda: g.lda,
            ldb: g.ldb,
            ldd: g.ldd,
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            ab: g.ab_type,
            d: g.d_type,
            bias: g.bias.is_some(),
            // cuBLASLt's A is our B, its B our A.
            align: [alignment(g.b.0), alignment(g.a.0), alignment(g.c.unwrap_or(g.d).0), alignment(g.d.0)],
        };
        let mut plans = self.plans.lock().map_err(|_| CudaError::Request("cuBLASLt plan cache poisoned".into()))?;
        if let std::collections::hash_map::Entry::Vacant(e) = plans.entry(key) {
            let p = self.plan(api, key)?;
            e.insert(p);
        }
        let plan = plans.get(&key).ok_or_else(|| CudaError::Request("cuBLASLt plan vanished".into()))?;
        if let Some(bias) = g.bias {
            let p = bias.0;
            // SAFETY: the attribute is a device pointer.
            check(api, "set BIAS_POINTER", unsafe {
                (api.desc_set)(plan.desc, cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, (&p as *const u64).cast(), 8)
            })?;
        }
        let (alpha, beta) = (g.alpha, if g.c.is_some() { g.beta } else { 0.0 });
        let c = g.c.unwrap_or(g.d);
        // SAFETY: every pointer addresses device memory the engine sized for this shape; the
        // layouts match the key; scales are host f32 (the default pointer mode).
        let r = unsafe {
            (api.matmul)(
                self.handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                g.b.0 as *const c_void,
                plan.a,
                g.a.0 as *const c_void,
                plan.b,
                (&beta as *const f32).cast(),
                c.0 as *const c_void,
                plan.c,
                g.d.0 as *mut c_void,
                plan.c,
                &plan.algo,
                self.workspace as *mut c_void,
                self.workspace_bytes,
                stream,
            )
        };
        check(api, "cublasLtMatmul", r)
    }
}
