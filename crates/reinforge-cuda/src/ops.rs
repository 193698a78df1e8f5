//! Typed launchers for the kernels in `kernels/*.cu`: each picks the entry point for the
//! storage type, the grid and block shape and the shared memory, so the model code reads as
//! a list of operations. Sizes are checked to fit the kernels' `int` parameters.

use crate::error::{CudaError, Result};
use crate::gpu::{Arg, DType, DevPtr, Gemm, Gpu};

/// Rows per attention tile of the CUDA-core kernels (`RF_ATT_TILE` in attention.cu).
pub const ATT_TILE: usize = 16;
/// Rows per attention tile of the tensor-core kernels (`TC_ROWS` in attention_tc.cu).
pub const TC_TILE: usize = 64;
/// Head dims the tensor-core attention kernels are built for (`RF_HEAD_DIMS`).
pub const TC_HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
/// Overrides which attention kernels bf16 runs on: `tensor-cores` (the default where the head
/// dim allows) or `cuda-cores` (attention.cu's f32-FMA kernels, for comparison).
pub const ATTENTION_ENV: &str = "REINFORGE_CUDA_ATTENTION";

/// Which kernels compute training, prefill and decode attention in bf16. f32, and head dims the
/// tensor-core kernels are not built for, always use the CUDA-core ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernels {
    /// attention_tc.cu and paged.cu's decode_attn_tc: mma.sync on bf16 operands (p and ds
    /// rounded to bf16), f32 sums.
    TensorCores,
    /// attention.cu and paged.cu's decode_attn: f32 FMAs throughout.
    CudaCores,
}

impl AttentionKernels {
    /// The default, or what `REINFORGE_CUDA_ATTENTION` asks for (read once per process).
    pub fn from_env() -> Result<AttentionKernels> {
        static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        env_choice(&CHOICE, ATTENTION_ENV, &[("tensor-cores", AttentionKernels::TensorCores), ("cuda-cores", AttentionKernels::CudaCores)])
    }
}
/// The value the environment variable `var` names among `choices` (name, value), read once per
/// process into `cell`; the first choice is the default, for an unset or empty variable too.
fn env_choice<T: Copy>(cell: &'static std::sync::OnceLock<Option<String>>, var: &str, choices: &[(&str, T)]) -> Result<T> {
    let default = choices[0].1;
    match cell.get_or_init(|| std::env::var(var).ok()).as_deref() {
        None | Some("") => Ok(default),
        Some(v) => choices.iter().find(|(name, _)| *name == v).map(|&(_, c)| c).ok_or_else(|| {
            let names: Vec<String> = choices.iter().enumerate().map(|(i, (n, _))| if i == 0 { format!("{n} (the default)") } else { n.to_string() }).collect();
            CudaError::Request(format!("{var}={v:?} is not a choice: use {}", names.join(" or ")))
        }),
    }
}

/// Overrides where a decode step rotates its new tokens and stores them in the paged cache:
/// `fused` (the default; inside the tensor-core decode attention kernel) or `separate`
/// (rope_kv_store's launch first, as the CUDA-core kernel always has it), for comparison.
pub const DECODE_ROPE_ENV: &str = "REINFORGE_CUDA_DECODE_ROPE";

/// Where decode attention's new tokens get RoPE and their cache slots (see [`Ops::decode_attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeRope {
    /// In the tensor-core decode kernel (`decode_attn_tc_rope`): one launch a layer fewer.
    Fused,
    /// In `rope_kv_store`, launched before the attention kernel.
    Separate,
}

impl DecodeRope {
    /// The default, or what `REINFORGE_CUDA_DECODE_ROPE` asks for (read once per process).
    pub fn from_env() -> Result<DecodeRope> {
        static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        env_choice(&CHOICE, DECODE_ROPE_ENV, &[("fused", DecodeRope::Fused), ("separate", DecodeRope::Separate)])
    }
}

/// Overrides how a decode step runs its linear layers, for a small model (rows ≤ 64, bf16):
/// `cublas` (the default: the norm kernel, then cuBLASLt, then SwiGLU's kernel; cuBLASLt for
/// o_proj and down) or `fused` (decode_linear.cu: one kernel each for the norm and QKV, and
/// for the norm, gate/up and SwiGLU, at hidden sizes ≤ 1024; o_proj and down with the
/// residual on `linear_rows`, at inputs ≤ 2048), to compare.
pub const DECODE_LINEAR_ENV: &str = "REINFORGE_CUDA_DECODE_LINEAR";

/// How a decode step's norms reach their linear layers (see [`Ops::norm_linear`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeLinear {
    /// The norm kernel, cuBLASLt's GEMM, and SwiGLU's kernel: three launches.
    Cublas,
    /// `norm_linear` / `norm_linear_swiglu` where the shapes allow: one; and `linear_rows`
    /// for o_proj and down.
    Fused,
}

impl DecodeLinear {
    /// The default, or what `REINFORGE_CUDA_DECODE_LINEAR` asks for (read once per process).
    pub fn from_env() -> Result<DecodeLinear> {
        static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        env_choice(&CHOICE, DECODE_LINEAR_ENV, &[("cublas", DecodeLinear::Cublas), ("fused", DecodeLinear::Fused)])
    }
}

/// Overrides how a decode step's layer kernels (decode_linear.cu's and the tensor-core decode
/// attention) are launched on sm_90+ GPUs: `serial` (the default: each after the one before
/// has finished) or `dependent` (programmatic dependent launches: each may start, and stream
/// its weights, while the kernel before it finishes), to compare.
pub const DECODE_LAUNCH_ENV: &str = "REINFORGE_CUDA_DECODE_LAUNCH";

/// How a decode step's layer kernels follow each other (see [`DECODE_LAUNCH_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeLaunch {
    /// Plain launches, in stream order.
    Serial,
    /// Programmatic dependent launches where the GPU has them; the kernels wait in
    /// `grid_wait()` for their inputs.
    Dependent,
}

impl DecodeLaunch {
    /// The default, or what `REINFORGE_CUDA_DECODE_LAUNCH` asks for (read once per process).
    pub fn from_env() -> Result<DecodeLaunch> {
        static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        env_choice(&CHOICE, DECODE_LAUNCH_ENV, &[("serial", DecodeLaunch::Serial), ("dependent", DecodeLaunch::Dependent)])
    }
}

/// Most rows, and widest input, of the fused norm + linear kernels (decode_linear.cu).
const FUSED_LINEAR_ROWS: usize = 64;
const FUSED_LINEAR_WIDTH: usize = 1024;
/// Output columns per block of the fused norm + linear kernels (`RF_DL_COLS`).
const FUSED_LINEAR_COLS: usize = 16;
/// Widest input of the fused few-rows linear (`linear_rows`): beyond it the weights are big
/// enough for cuBLASLt's tiles, and the kernel's re-reads of x (once per 16 outputs) cost more.
const FUSED_ROWS_WIDTH: usize = 2048;
/// Most of k one block of `linear_rows` takes (`RF_DL_SPLIT`).
const FUSED_ROWS_SPLIT: usize = 512;
/// bf16 per row of k columns in decode_linear.cu's shared memory (`dl_lda`): rows g and g + 1
/// 64 bytes apart in the banks.
fn fused_lda(k: usize) -> usize {
    k + 32 + (k & 32)
}
/// Most shared memory the fused kernels' rows may take: within the 99 KB opt-in of the
/// smallest sm_80+ GPUs (L4, L40, A10), with the partial sums' 64 KB under it.
const FUSED_LINEAR_SMEM: usize = 96 * 1024;

/// A decode step's new tokens, which decode attention rotates and stores in the cache before
/// attending (their q, k and v as the QKV projection left them in `qkv`).
#[derive(Debug, Clone, Copy)]
pub struct NewTokens {
    /// RoPE's cosine table ([positions, hd / 2] f32).
    pub cos: DevPtr,
    /// RoPE's sine table.
    pub sin: DevPtr,
    /// Each row's position (i32).
    pub pos: DevPtr,
    /// Each row's cache slot for its new token (i32): its newest position's slot in its block table.
    pub slots: DevPtr,
}

/// bf16 padding per shared-memory row of the tensor-core kernels (`TC_PAD`).
const TC_PAD: usize = 8;
/// Keys per chunk of the tensor-core forward (`TC_KEYS`).
const TC_KEYS: usize = 64;
/// Keys per chunk of the tensor-core dq kernel (`TC_DQ_KEYS`).
const TC_DQ_KEYS: usize = 32;
/// Queries per chunk of the tensor-core dk/dv kernel (`TC_DK_QS`).
const TC_DK_QS: usize = 32;
/// Keys per warp and chunk of the tensor-core decode kernel (`RF_DTC_KEYS`).
const DEC_TC_KEYS: usize = 16;
/// Warps per block of the tensor-core decode kernel (it reads the count from `blockDim`).
const DEC_TC_WARPS: usize = 4;
/// Keys or queries per shared-memory chunk (`RF_ATT_CHUNK`).
const ATT_CHUNK: usize = 32;
/// Largest head dimension the attention kernels hold in registers (`RF_ATT_MAXC` × 32).
pub const MAX_HEAD_DIM: usize = 256;
/// Cached positions each block of the decode attention kernel covers, for contexts up to
/// `max_ctx` positions: about a quarter of the longest context (so even a small batch keeps the
/// GPU's SMs busy), a multiple of the kernel's 32-key chunk, at most 256.
/// `REINFORGE_CUDA_DECODE_SPLIT` (a multiple of 32, without the upper bound) overrides it, to
/// compare.
pub fn decode_split_keys(max_ctx: usize) -> Result<usize> {
    static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    match CHOICE.get_or_init(|| std::env::var(DECODE_SPLIT_ENV).ok()).as_deref() {
        None | Some("") => Ok((max_ctx.div_ceil(4).div_ceil(32) * 32).clamp(32, 256)),
        Some(v) => match v.parse::<usize>() {
            Ok(keys) if keys >= 32 && keys.is_multiple_of(32) => Ok(keys),
            _ => Err(CudaError::Request(format!("{DECODE_SPLIT_ENV}={v:?} is not a key count: use a multiple of 32 (at least 32), or leave it unset"))),
        },
    }
}
/// Overrides the cached positions per block of decode attention ([`decode_split_keys`]).
pub const DECODE_SPLIT_ENV: &str = "REINFORGE_CUDA_DECODE_SPLIT";
/// 16-byte vectors per lane of a row that `rmsnorm_fwd_rows` keeps in registers (`RF_NORM_VECS`).
const NORM_VECS: usize = 16;
/// 16-byte vectors per thread of a row that `rmsnorm_bwd_vec` keeps in registers
/// (`RF_NORM_BWD_VECS`).
const NORM_BWD_VECS: usize = 2;
/// Rows (a warp each) per block of `rmsnorm_fwd_rows`.
const NORM_ROW_WARPS: usize = 4;
/// Threads per block (a row each) of `sample_rows` (`RF_SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;
/// Largest GQA group the decode kernel handles (`RF_DEC_HEADS` × 4 warps).
pub const MAX_GQA_GROUP: usize = 16;
/// Blocks that compute partial sums of squares for the gradient norm: enough 256-thread
/// blocks to fill a large GPU (8 per SM of an H100) while streaming the whole gradient.
const NORM_PARTS: usize = 1024;

/// Launches kernels of one storage type on one device.
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// Storage type of activations and weights.
    pub dt: DType,
    /// Attention kernels for bf16.
    pub attention: AttentionKernels,
    /// Where decode attention rotates and stores its new tokens (tensor-core kernel only).
    pub decode_rope: DecodeRope,
    /// Whether [`Ops::norm_linear`] fuses, where the shapes allow.
    pub decode_linear: DecodeLinear,
    /// How the decode layer kernels follow each other.
    pub decode_launch: DecodeLaunch,
}

fn int(v: usize, what: &str) -> Result<Arg> {
    i32::try_from(v).map(Arg::I32).map_err(|_| CudaError::Request(format!("{what} = {v} exceeds the kernels' 32-bit index range; use smaller micro-batches")))
}

fn grid_stride(n: usize) -> [u32; 3] {
    [n.div_ceil(256).clamp(1, 4096) as u32, 1, 1]
}

/// A row-major GEMM operand: where it is, its row stride, and whether it is stored
/// transposed (`[k, m]` for A, `[n, k]` for B).
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    /// Its first element.
    pub ptr: DevPtr,
    /// Elements between its stored rows.
    pub ld: usize,
    /// Stored transposed.
    pub trans: bool,
}

impl<'a> Ops<'a> {
    /// Launchers for `dt` on `gpu`, with the default attention kernels (those of a model come
    /// from [`crate::DeviceModel::attention`]).
    pub fn new(gpu: &'a Gpu, dt: DType) -> Self {
        Self { gpu, dt, attention: AttentionKernels::TensorCores, decode_rope: DecodeRope::Fused, decode_linear: DecodeLinear::Cublas, decode_launch: DecodeLaunch::Serial }
    }

    fn typed(&self, name: &str) -> String {
        format!("{name}_{}", self.dt.suffix())
    }

    fn launch(&self, name: &str, grid: [u32; 3], block: u32, smem: usize, args: &[Arg]) -> Result<()> {
        self.gpu.launch(name, grid, [block, 1, 1], smem as u32, args)
    }

    /// [`Ops::launch_moving`] of a decode layer kernel, dependent on the kernel before where
    /// [`Ops::decode_launch`] asks for it. Every block of such a kernel must reach
    /// `grid_wait()` before it reads the step's activations, writes anything, or exits: a
    /// kernel then finishes only after the one before it, and so after every earlier one,
    /// which the next dependent kernel relies on.
    fn launch_layer(&self, name: &str, grid: [u32; 3], block: u32, smem: usize, args: &[Arg], bytes: usize) -> Result<()> {
        match self.decode_launch {
            DecodeLaunch::Serial => self.launch_moving(name, grid, block, smem, args, bytes),
            DecodeLaunch::Dependent => self.gpu.launch_after(name, grid, [block, 1, 1], smem as u32, args, bytes as f64),
        }
    }

    /// [`Ops::launch`] of a memory-bound kernel that moves at least `bytes` (for profiles).
    fn launch_moving(&self, name: &str, grid: [u32; 3], block: u32, smem: usize, args: &[Arg], bytes: usize) -> Result<()> {
        self.gpu.launch_moving(name, grid, [block, 1, 1], smem as u32, args, bytes as f64)
    }

    /// Bytes of `n` elements of the storage type.
    fn stored(&self, n: usize) -> usize {
        n * self.dt.size()
    }

    /// `D = X · Wᵀ (+ bias)` for a weight stored `[n, k]`; `residual`: `D = R + X · Wᵀ`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(&self, x: DevPtr, w: DevPtr, bias: Option<DevPtr>, residual: Option<DevPtr>, d: DevPtr, m: usize, n: usize, k: usize) -> Result<()> {
        let mut g = Gemm::linear(x, w, d, m, n, k, self.dt);
        g.bias = bias;
        if let Some(r) = residual {
            g.c = Some(r);
            g.beta = 1.0;
        }
        self.gpu.gemm(&g)
    }

    /// `dX[m, k] (+)= dY[m, n] · W[n, k]` (a linear layer's input gradient).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_dx(&self, dy: DevPtr, w: DevPtr, dx: DevPtr, m: usize, n: usize, k: usize, accumulate: bool) -> Result<()> {
        let dt = self.dt;
        self.gpu.gemm(&Gemm {
            m,
            n: k,
            k: n,
            a: dy,
            lda: n,
            trans_a: false,
            b: w,
            ldb: k,
            trans_b: false,
            ab_type: dt,
            c: accumulate.then_some(dx),
            d: dx,
            ldd: k,
            d_type: dt,
            alpha: 1.0,
            beta: if accumulate { 1.0 } else { 0.0 },
            bias: None,
        })
    }

    /// `dW[n, k] += dY[m, n]ᵀ · X[m, k]` into an f32 gradient (a linear layer's weight gradient,
    /// accumulated across micro-batches).
    pub fn linear_dw(&self, dy: DevPtr, x: DevPtr, dw: DevPtr, m: usize, n: usize, k: usize) -> Result<()> {
        self.gpu.gemm(&Gemm {
            m: n,
            n: k,
            k: m,
            a: dy,
            lda: n,
            trans_a: true,
            b: x,
            ldb: k,
            trans_b: false,
            ab_type: self.dt,
            c: Some(dw),
            d: dw,
            ldd: k,
            d_type: DType::F32,
            alpha: 1.0,
            beta: 1.0,
            bias: None,
        })
    }

    /// `D[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C`, A and B in the storage type,
    /// C (same stride as D) and D in the storage type or, with `f32_out`, f32: the general
    /// GEMM the LoRA factors' thin products need (blocks of a fused output, strided operands).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(&self, a: Operand, b: Operand, c: Option<DevPtr>, d: DevPtr, ldd: usize, (m, n, k): (usize, usize, usize), alpha: f32, beta: f32, f32_out: bool) -> Result<()> {
        self.gpu.gemm(&Gemm {
            m,
            n,
            k,
            a: a.ptr,
            lda: a.ld,
            trans_a: a.trans,
            b: b.ptr,
            ldb: b.ld,
            trans_b: b.trans,
            ab_type: self.dt,
            c: c.filter(|_| beta != 0.0),
            d,
            ldd,
            d_type: if f32_out { DType::F32 } else { self.dt },
            alpha,
            beta,
            bias: None,
        })
    }

    /// `Z[m, n] = X[m, k] · Wᵀ` in f32 (the LM head's logits for a chunk of rows).
    pub fn logits(&self, x: DevPtr, w: DevPtr, z: DevPtr, m: usize, n: usize, k: usize) -> Result<()> {
        let mut g = Gemm::linear(x, w, z, m, n, k, self.dt);
        g.d_type = DType::F32;
        self.gpu.gemm(&g)
    }

    /// `y = rmsnorm(x) · w` over `n` rows of width `h`, saving each row's 1/rms in `rstd`.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(&self, y: DevPtr, rstd: DevPtr, x: DevPtr, w: DevPtr, n: usize, h: usize, eps: f64) -> Result<()> {
        let bytes = self.stored(2 * n * h + h) + 4 * n;
        // A warp per row, the row in registers (rmsnorm.cu): rows of whole 16-byte vectors, at
        // most NORM_VECS per lane, every matrix 16-byte aligned.
        let args = [y.into(), rstd.into(), x.into(), w.into(), int(n, "rows")?, int(h, "hidden")?, Arg::F32(eps as f32)];
        if self.vectors(h, &[y, x, w]).is_some_and(|nv| nv <= 32 * NORM_VECS) {
            return self.launch_moving(&self.typed("rmsnorm_fwd_rows"), [n.div_ceil(NORM_ROW_WARPS) as u32, 1, 1], 32 * NORM_ROW_WARPS as u32, 0, &args, bytes);
        }
        self.launch_moving(&self.typed("rmsnorm_fwd"), [n as u32, 1, 1], 256, 0, &args, bytes)
    }

    /// `y = rmsnorm(x; gamma, eps) · Wᵀ + bias` for `m` rows of width `k` and `n` outputs. With
    /// `swiglu = Some(gu)`, W holds 2n rows (gate, then up) and `y = silu(gate) · up`. One
    /// kernel (decode_linear.cu) where [`DecodeLinear::Fused`] is chosen and the shapes allow
    /// (bf16, m ≤ 64, k ≤ 1024 and a multiple of 32, n a multiple of 16, the normalised rows
    /// within 96 KB of shared memory, 16-byte aligned matrices); otherwise the norm into `hn`
    /// (with `rstd`), the GEMM (into `gu` for SwiGLU), and SwiGLU's kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_linear(
        &self,
        y: DevPtr,
        x: DevPtr,
        (gamma, eps): (DevPtr, f64),
        w: DevPtr,
        bias: Option<DevPtr>,
        (m, n, k): (usize, usize, usize),
        swiglu: Option<DevPtr>,
        (hn, rstd): (DevPtr, DevPtr),
    ) -> Result<()> {
        let n_w = if swiglu.is_some() { 2 * n } else { n };
        let fused = self.decode_linear == DecodeLinear::Fused
            && self.dt == DType::Bf16
            && (1..=FUSED_LINEAR_ROWS).contains(&m)
            && k <= FUSED_LINEAR_WIDTH
            && k.is_multiple_of(32)
            && n.is_multiple_of(FUSED_LINEAR_COLS)
            && m * fused_lda(k) * 2 <= FUSED_LINEAR_SMEM
            && self.vectors(k, &[y, x, gamma, w]).is_some();
        if !fused {
            self.rmsnorm(hn, rstd, x, gamma, m, k, eps)?;
            return match swiglu {
                Some(gu) => {
                    self.linear(hn, w, bias, None, gu, m, n_w, k)?;
                    self.swiglu(y, gu, m, n)
                }
                None => self.linear(hn, w, bias, None, y, m, n, k),
            };
        }
        // The normalised rows (bf16, padded), then over them each block's 8 warps' partial
        // sums: 4 m-tiles × (2 or 4) n-tiles × 32 lanes × 4 f32.
        let n_tiles = if swiglu.is_some() { 4 } else { 2 };
        let smem = (m * fused_lda(k) * 2).max(8 * 4 * n_tiles * 32 * 4 * 4);
        let name = if swiglu.is_some() { "norm_linear_swiglu_bf16" } else { "norm_linear_bf16" };
        let args = [
            y.into(),
            rstd.into(),
            x.into(),
            gamma.into(),
            w.into(),
            bias.unwrap_or(DevPtr(0)).into(),
            int(m, "rows")?,
            int(n, "outputs")?,
            int(k, "inputs")?,
            Arg::F32(eps as f32),
        ];
        self.launch_layer(name, [(n / FUSED_LINEAR_COLS) as u32, 1, 1], 256, smem, &args, self.stored(m * k + n_w * k + m * n + k + n_w))
    }

    /// Splits of k that [`Ops::linear_rows`] takes for `m` rows of `[n, k]` weights (a block
    /// per 16 outputs and split), or `None` where it keeps cuBLASLt: not chosen, not bf16,
    /// more than 64 rows, or k or n off the kernel's steps, or k past [`FUSED_ROWS_WIDTH`].
    /// Enough splits to give each SM a block, and each split at most 512 of k.
    pub fn linear_rows_splits(&self, m: usize, n: usize, k: usize) -> Option<usize> {
        let fits = self.decode_linear == DecodeLinear::Fused
            && self.dt == DType::Bf16
            && (1..=FUSED_LINEAR_ROWS).contains(&m)
            && (32..=FUSED_ROWS_WIDTH).contains(&k)
            && k.is_multiple_of(32)
            && n.is_multiple_of(FUSED_LINEAR_COLS);
        if !fits {
            return None;
        }
        let steps = k / 32;
        let fill = (self.gpu.info.sms.max(1) as usize / (n / FUSED_LINEAR_COLS).max(1)).max(1);
        let per = steps.div_ceil(fill.clamp(steps.div_ceil(FUSED_ROWS_SPLIT / 32), steps));
        Some(steps.div_ceil(per))
    }

    /// Bytes of the f32 partial tiles [`Ops::linear_rows`] needs for up to `rows` rows of each
    /// of these `(n, k)` weight shapes (the most over them; zero where none splits).
    pub fn linear_rows_scratch(&self, rows: usize, shapes: &[(usize, usize)]) -> usize {
        // The splits do not depend on the rows, and more than the kernel's rows never fuse.
        let m = rows.min(FUSED_LINEAR_ROWS);
        let tiles = |&(n, k): &(usize, usize)| self.linear_rows_splits(m, n, k).filter(|&s| s > 1).map_or(0, |s| s * m * n * 4);
        shapes.iter().map(tiles).max().unwrap_or(0)
    }

    /// `D = X · Wᵀ (+ bias) (+ residual)` for a decode step's few rows (o_proj and down): one
    /// launch of decode_linear.cu's `linear_rows` where [`Ops::linear_rows_splits`] takes the
    /// shape, [`Ops::linear`] (cuBLASLt) otherwise. `(part, done)`: scratch of
    /// [`Ops::linear_rows_scratch`] bytes for the splits' partial tiles, and n / 16 counters
    /// that are zero (the kernel leaves them zero). `d` must not overlap `x` or `residual`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_rows(&self, d: DevPtr, x: DevPtr, w: DevPtr, bias: Option<DevPtr>, residual: Option<DevPtr>, (m, n, k): (usize, usize, usize), (part, done): (DevPtr, DevPtr)) -> Result<()> {
        let mut ptrs = vec![d, x, w];
        ptrs.extend(bias.iter().chain(&residual).copied());
        let splits = match self.linear_rows_splits(m, n, k) {
            Some(s) if self.vectors(k, &ptrs).is_some() => s,
            _ => return self.linear(x, w, bias, residual, d, m, n, k),
        };
        let k_split = (k / 32).div_ceil(splits) * 32;
        // This split's columns of x (bf16, padded), then over them the warps' partial sums:
        // 4 m-tiles × 2 n-tiles × 32 lanes × 4 f32 each.
        let smem = (m * fused_lda(k_split) * 2).max(8 * 4 * 2 * 32 * 4 * 4);
        let args = [
            d.into(),
            part.into(),
            done.into(),
            x.into(),
            w.into(),
            bias.unwrap_or(DevPtr(0)).into(),
            residual.unwrap_or(DevPtr(0)).into(),
            int(m, "rows")?,
            int(n, "outputs")?,
            int(k, "inputs")?,
            int(k_split, "split")?,
        ];
        let moved = self.stored(m * k + n * k + m * n * (1 + residual.is_some() as usize) + n * bias.is_some() as usize);
        self.launch_layer("linear_rows_bf16", [(n / FUSED_LINEAR_COLS) as u32, splits as u32, 1], 256, smem, &args, moved)
    }

    /// RMSNorm backward: `dx (+)= ∂/∂x`, and `dw += Σ dy ⊙ x̂` (f32) through `part`
    /// (scratch of [`Self::norm_parts`]`(n) · h` floats); `dw = None`: a frozen weight.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_bwd(&self, dx: DevPtr, dw: Option<DevPtr>, part: DevPtr, dy: DevPtr, x: DevPtr, w: DevPtr, rstd: DevPtr, n: usize, h: usize, accumulate: bool) -> Result<()> {
        let parts = Self::norm_parts(n);
        let bytes = self.stored((3 + accumulate as usize) * n * h + h) + 4 * (n + parts * h);
        // Rows of whole 16-byte vectors that a block's threads hold (rmsnorm.cu), every matrix
        // 16-byte aligned: the vector kernel with a thread per vector, up to 256 threads.
        let (kernel, threads) = match self.vectors(h, &[dx, dy, x, w]).filter(|&nv| nv <= 256 * NORM_BWD_VECS) {
            Some(nv) => ("rmsnorm_bwd_vec", nv.next_multiple_of(32).clamp(32, 256) as u32),
            None => ("rmsnorm_bwd", 256),
        };
        self.launch_moving(
            &self.typed(kernel),
            [parts as u32, 1, 1],
            threads,
            0,
            &[dx.into(), part.into(), dy.into(), x.into(), w.into(), rstd.into(), int(n, "rows")?, int(h, "hidden")?, Arg::I32(accumulate as i32)],
            bytes,
        )?;
        match dw {
            Some(dw) => self.reduce_rows(dw, part, parts, h, true),
            None => Ok(()),
        }
    }

    /// Blocks (and partial-sum rows) the RMSNorm backward uses for `n` rows: up to 512, about
    /// four 256-thread blocks per SM of a large GPU.
    pub fn norm_parts(n: usize) -> usize {
        n.clamp(1, 512)
    }

    /// `out (+)= Σ_p part[p]` over `parts` rows of width `cols`, in a fixed order.
    pub fn reduce_rows(&self, out: DevPtr, part: DevPtr, parts: usize, cols: usize, accumulate: bool) -> Result<()> {
        let bytes = 4 * (parts + 1 + accumulate as usize) * cols;
        self.launch_moving("reduce_rows_f32", [cols.div_ceil(32) as u32, 1, 1], 256, 0, &[out.into(), part.into(), int(parts, "parts")?, int(cols, "cols")?, Arg::I32(accumulate as i32)], bytes)
    }

    /// Rows of the partial buffer [`Self::col_sum`] needs for `n` rows.
    pub fn col_parts(n: usize) -> usize {
        n.div_ceil(64).clamp(1, 64)
    }

    /// `out[j] += Σ_r w[r]·x[r, j]` (w = None: plain column sums) into f32, through `part`
    /// (scratch of [`Self::col_parts`]`(n) · cols` floats).
    #[allow(clippy::too_many_arguments)]
    pub fn col_sum(&self, out: DevPtr, part: DevPtr, x: DevPtr, w: Option<DevPtr>, n: usize, cols: usize, ld: usize) -> Result<()> {
        let parts = Self::col_parts(n);
        self.launch(
            &self.typed("col_sum_part"),
            [cols.div_ceil(256) as u32, parts as u32, 1],
            256,
            0,
            &[part.into(), x.into(), w.unwrap_or_default().into(), int(n, "rows")?, int(cols, "cols")?, int(ld, "ld")?],
        )?;
        self.reduce_rows(out, part, parts, cols, true)
    }

    /// `out[r] = table[ids[r]]`; with `follow` = (`from`, `prev`), rows with `from[r] >= 0` take token `prev[from[r]]`
    /// instead of `ids[r]` (a decode step following one whose tokens the host has not read).
    pub fn embed(&self, out: DevPtr, table: DevPtr, ids: DevPtr, follow: Option<(DevPtr, DevPtr)>, n: usize, h: usize) -> Result<()> {
        let (from, prev) = follow.unwrap_or_default();
        let args = [out.into(), table.into(), ids.into(), from.into(), prev.into(), int(n, "tokens")?, int(h, "hidden")?];
        self.launch_moving(&self.typed("embed_fwd"), [n as u32, 1, 1], 128, 0, &args, self.stored(2 * n * h) + 4 * n)
    }

    /// Embedding gradient through the host-sorted index (see [`crate::model::EmbedIndex`]).
    #[allow(clippy::too_many_arguments)]
    pub fn embed_bwd(&self, dtable: DevPtr, dx: DevPtr, uniq: DevPtr, offs: DevPtr, rows: DevPtr, n_uniq: usize, h: usize) -> Result<()> {
        self.launch(&self.typed("embed_bwd"), [n_uniq as u32, 1, 1], 128, 0, &[dtable.into(), dx.into(), uniq.into(), offs.into(), rows.into(), int(n_uniq, "ids")?, int(h, "hidden")?])
    }

    /// `out[r] = x[idx[r]]` for `n` rows of width `h`.
    pub fn gather_rows(&self, out: DevPtr, x: DevPtr, idx: DevPtr, n: usize, h: usize) -> Result<()> {
        self.launch(&self.typed("gather_rows"), [n as u32, 1, 1], 128, 0, &[out.into(), x.into(), idx.into(), int(n, "rows")?, int(h, "width")?])
    }

    /// `out[idx[r]] (+)= x[r]`.
    pub fn scatter_rows(&self, out: DevPtr, x: DevPtr, idx: DevPtr, n: usize, h: usize, accumulate: bool) -> Result<()> {
        self.launch(&self.typed("scatter_rows"), [n as u32, 1, 1], 128, 0, &[out.into(), x.into(), idx.into(), int(n, "rows")?, int(h, "width")?, Arg::I32(accumulate as i32)])
    }

    /// RoPE on the first `heads` heads of each row (stride `ld`), by the rows' positions.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(&self, x: DevPtr, cos: DevPtr, sin: DevPtr, pos: DevPtr, n: usize, heads: usize, hd: usize, ld: usize, inverse: bool) -> Result<()> {
        // Each head element read and written; a row's cos and sin (hd/2 floats each).
        let bytes = self.stored(2 * n * heads * hd) + 4 * n * (hd + 1);
        self.launch_moving(
            &self.typed("rope"),
            [n as u32, 1, 1],
            128,
            0,
            &[x.into(), cos.into(), sin.into(), pos.into(), int(n, "tokens")?, int(heads, "heads")?, int(hd, "head_dim")?, int(ld, "ld")?, Arg::I32(inverse as i32)],
            bytes,
        )
    }

    /// `out = silu(gate) · up` from `gu` rows `[gate | up]`.
    pub fn swiglu(&self, out: DevPtr, gu: DevPtr, n: usize, inter: usize) -> Result<()> {
        let (grid, threads, vec) = self.swiglu_grid(n, inter, &[out, gu]);
        self.launch_moving(&self.typed("swiglu_fwd"), grid, threads, 0, &[out.into(), gu.into(), int(n, "tokens")?, int(inter, "intermediate")?, vec], self.stored(3 * n * inter))
    }

    /// SwiGLU backward into `dgu` rows `[dgate | dup]`.
    pub fn swiglu_bwd(&self, dgu: DevPtr, gu: DevPtr, dout: DevPtr, n: usize, inter: usize) -> Result<()> {
        let bytes = self.stored(5 * n * inter);
        let (grid, threads, vec) = self.swiglu_grid(n, inter, &[dgu, gu, dout]);
        self.launch_moving(&self.typed("swiglu_bwd"), grid, threads, 0, &[dgu.into(), gu.into(), dout.into(), int(n, "tokens")?, int(inter, "intermediate")?, vec], bytes)
    }

    /// The SwiGLU kernels' grid (a row's 16-byte vectors or elements in x, rows in y), threads
    /// per block (no more warps than a row has columns), and whether they move 16-byte
    /// vectors: rows of whole vectors, every pointer aligned.
    fn swiglu_grid(&self, n: usize, inter: usize, ptrs: &[DevPtr]) -> ([u32; 3], u32, Arg) {
        let vec = self.vectors(inter, ptrs);
        let cols = vec.unwrap_or(inter);
        let threads = cols.next_multiple_of(32).clamp(32, 256);
        // gridDim.y is at most 65535; the kernels stride over the rows past it.
        ([cols.div_ceil(threads).clamp(1, 1024) as u32, n.clamp(1, 65535) as u32, 1], threads as u32, Arg::I32(vec.is_some() as i32))
    }

    /// The 16-byte vectors in a row of `cols` elements, where the vector kernels may take it:
    /// rows of whole vectors and every matrix in `ptrs` 16-byte aligned.
    fn vectors(&self, cols: usize, ptrs: &[DevPtr]) -> Option<usize> {
        let width = 16 / self.dt.size();
        (cols.is_multiple_of(width) && ptrs.iter().all(|p| p.0.is_multiple_of(16))).then_some(cols / width)
    }

    /// Whether attention runs on the tensor-core kernels: chosen, bf16, and a head dim they
    /// are built for.
    pub fn tensor_core_attention(&self, hd: usize) -> bool {
        self.attention == AttentionKernels::TensorCores && self.dt == DType::Bf16 && TC_HEAD_DIMS.contains(&hd)
    }

    /// Whether [`Ops::decode_attention`] rotates and stores the new tokens inside its kernel
    /// (else `rope_kv_store` does it first, rotating q and k in `qkv` in place).
    pub fn rope_inside_attention(&self, hd: usize) -> bool {
        self.tensor_core_attention(hd) && self.decode_rope == DecodeRope::Fused
    }

    /// Rows per tile of the attention kernels that run for head dim `hd`.
    pub fn attention_tile(&self, hd: usize) -> usize {
        if self.tensor_core_attention(hd) {
            TC_TILE
        } else {
            ATT_TILE
        }
    }

    fn att_smem(kind: &str, hd: usize, g: usize) -> usize {
        4 * match kind {
            "fwd" => ATT_TILE * hd + ATT_CHUNK * (hd + 1) + ATT_CHUNK * hd,
            "dq" => 2 * ATT_TILE * hd + 2 * ATT_CHUNK * (hd + 1),
            "dkdv" => 2 * ATT_TILE * hd + 2 * ATT_CHUNK * (hd + 1) + 2 * ATT_CHUNK,
            _ => g * hd + ATT_CHUNK * (hd + 1) + ATT_CHUNK * hd,
        }
    }

    /// Causal attention over packed sequences (`tiles` from [`crate::model::Packed::tiles`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(&self, out: DevPtr, lse: DevPtr, qkv: DevPtr, tiles: DevPtr, n_tiles: usize, n: usize, nh: usize, kvh: usize, hd: usize, ld: usize) -> Result<()> {
        let scale = 1.0 / (hd as f32).sqrt();
        if self.tensor_core_attention(hd) {
            return self.launch(
                &format!("attn_tc_fwd_d{hd}"),
                [n_tiles as u32, nh as u32, 1],
                128,
                // Keys and values, double-buffered.
                4 * TC_KEYS * (hd + TC_PAD) * 2,
                &[out.into(), lse.into(), qkv.into(), tiles.into(), int(n, "tokens")?, int(nh, "heads")?, int(kvh, "kv heads")?, int(ld, "ld")?, Arg::F32(scale)],
            );
        }
        self.launch(
            &self.typed("attn_fwd"),
            [n_tiles as u32, nh as u32, 1],
            128,
            Self::att_smem("fwd", hd, 0),
            &[out.into(), lse.into(), qkv.into(), tiles.into(), int(n, "tokens")?, int(nh, "heads")?, int(kvh, "kv heads")?, int(hd, "head_dim")?, int(ld, "ld")?, Arg::F32(scale)],
        )
    }

    /// Attention backward: `dqkv` (same layout as `qkv`) from `dout`; `delta` is scratch of
    /// `nh · n` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_bwd(
        &self,
        dqkv: DevPtr,
        delta: DevPtr,
        qkv: DevPtr,
        out: DevPtr,
        dout: DevPtr,
        lse: DevPtr,
        tiles: DevPtr,
        n_tiles: usize,
        n: usize,
        nh: usize,
        kvh: usize,
        hd: usize,
        ld: usize,
    ) -> Result<()> {
        let scale = 1.0 / (hd as f32).sqrt();
        let items = n * nh;
        self.launch(&self.typed("attn_bwd_delta"), [items.div_ceil(4) as u32, 1, 1], 128, 0, &[delta.into(), out.into(), dout.into(), int(n, "tokens")?, int(nh, "heads")?, int(hd, "head_dim")?])?;
        if self.tensor_core_attention(hd) {
            let args = [dqkv.into(), qkv.into(), dout.into(), lse.into(), delta.into(), tiles.into(), int(n, "tokens")?, int(nh, "heads")?, int(kvh, "kv heads")?, int(ld, "ld")?, Arg::F32(scale)];
            let row = (hd + TC_PAD) * 2;
            // Keys and values, double-buffered.
            self.launch(&format!("attn_tc_dq_d{hd}"), [n_tiles as u32, nh as u32, 1], 128, 4 * TC_DQ_KEYS * row, &args)?;
            // The key tile, then query chunks double-buffered with their lse and delta.
            return self.launch(&format!("attn_tc_dkdv_d{hd}"), [n_tiles as u32, kvh as u32, 1], 128, (2 * TC_TILE + 4 * TC_DK_QS) * row + 4 * TC_DK_QS * 4, &args);
        }
        let args = [dqkv.into(), qkv.into(), dout.into(), lse.into(), delta.into(), tiles.into(), int(n, "tokens")?, int(nh, "heads")?, int(kvh, "kv heads")?, int(hd, "head_dim")?, int(ld, "ld")?, Arg::F32(scale)];
        self.launch(&self.typed("attn_bwd_dq"), [n_tiles as u32, nh as u32, 1], 128, Self::att_smem("dq", hd, 0), &args)?;
        self.launch(&self.typed("attn_bwd_dkdv"), [n_tiles as u32, kvh as u32, 1], 128, Self::att_smem("dkdv", hd, 0), &args)
    }

    /// Per-row log-prob of the target and entropy from f32 logits `z` `[rows, v]`.
    #[allow(clippy::too_many_arguments)]
    pub fn logits_rows(&self, lp: DevPtr, ent: DevPtr, lse: DevPtr, z: DevPtr, targets: DevPtr, rows: usize, v: usize, inv_t: f32) -> Result<()> {
        let args = [lp.into(), ent.into(), lse.into(), z.into(), targets.into(), int(rows, "rows")?, int(v, "vocab")?, Arg::F32(inv_t)];
        self.launch_moving("logits_fwd", [rows as u32, 1, 1], 512, 0, &args, 4 * rows * v)
    }

    /// Gradient of the rows' log-probs and entropies (weighted by `g_lp`, `g_ent`) with respect
    /// to the logits, into `dz` (storage type).
    #[allow(clippy::too_many_arguments)]
    pub fn logits_rows_bwd(&self, dz: DevPtr, z: DevPtr, targets: DevPtr, lse: DevPtr, ent: DevPtr, g_lp: DevPtr, g_ent: DevPtr, rows: usize, v: usize, inv_t: f32) -> Result<()> {
        self.launch_moving(
            &self.typed("logits_bwd"),
            [rows as u32, 1, 1],
            512,
            0,
            &[dz.into(), z.into(), targets.into(), lse.into(), ent.into(), g_lp.into(), g_ent.into(), int(rows, "rows")?, int(v, "vocab")?, Arg::F32(inv_t)],
            4 * rows * v + self.stored(rows * v),
        )
    }

    /// `values[r] = h[r] · w` (f32 out).
    pub fn value_head(&self, values: DevPtr, h: DevPtr, w: DevPtr, n: usize, hd: usize) -> Result<()> {
        self.launch(&self.typed("value_fwd"), [n.div_ceil(4) as u32, 1, 1], 128, 0, &[values.into(), h.into(), w.into(), int(n, "rows")?, int(hd, "hidden")?])
    }

    /// `dh[r] = g[r] · w`.
    pub fn value_head_bwd(&self, dh: DevPtr, g: DevPtr, w: DevPtr, n: usize, hd: usize) -> Result<()> {
        self.launch(&self.typed("value_bwd"), [n as u32, 1, 1], 128, 0, &[dh.into(), g.into(), w.into(), int(n, "rows")?, int(hd, "hidden")?])
    }

    /// Converts f32 to the storage type (`dst` may not alias `src`).
    pub fn cast_from_f32(&self, dst: DevPtr, src: DevPtr, n: usize) -> Result<()> {
        if self.dt == DType::F32 {
            return self.gpu.copy(dst, src, n * 4);
        }
        self.launch_moving(&self.typed("cast_from_f32"), grid_stride(n), 256, 0, &[dst.into(), src.into(), Arg::U64(n as u64)], 4 * n + self.stored(n))
    }

    /// Converts the storage type to f32.
    pub fn cast_to_f32(&self, dst: DevPtr, src: DevPtr, n: usize) -> Result<()> {
        if self.dt == DType::F32 {
            return self.gpu.copy(dst, src, n * 4);
        }
        self.launch_moving(&self.typed("cast_to_f32"), grid_stride(n), 256, 0, &[dst.into(), src.into(), Arg::U64(n as u64)], 4 * n + self.stored(n))
    }

    /// `x *= a` (f32).
    pub fn scale_f32(&self, x: DevPtr, a: f32, n: usize) -> Result<()> {
        self.launch_moving("scale_f32", grid_stride(n), 256, 0, &[x.into(), Arg::F32(a), Arg::U64(n as u64)], 8 * n)
    }

    /// Σ x² of an f32 buffer, deterministic; `part` is scratch of [`NORM_PARTS`] + 1 floats.
    pub fn sum_sq(&self, x: DevPtr, n: usize, part: DevPtr) -> Result<f64> {
        self.launch_moving("sumsq_part", [NORM_PARTS as u32, 1, 1], 256, 0, &[part.into(), x.into(), Arg::U64(n as u64)], 4 * n)?;
        let out = part.add(NORM_PARTS * 4);
        self.launch("sum_final", [1, 1, 1], 256, 0, &[out.into(), part.into(), Arg::I32(NORM_PARTS as i32)])?;
        let mut v = [0f32];
        self.gpu.download(out, &mut v)?;
        Ok(v[0] as f64)
    }

    /// Floats of scratch [`Self::sum_sq`] needs.
    pub const fn sum_sq_scratch() -> usize {
        NORM_PARTS + 1
    }

    /// One AdamW step over `n` parameters (see optim.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw(&self, master: DevPtr, weights: DevPtr, m: DevPtr, v: DevPtr, g: DevPtr, n: usize, lr: f32, b1: f32, b2: f32, eps: f32, wd: f32, step: u64, gscale: f32) -> Result<()> {
        let bc1 = 1.0 - b1.powi(step as i32);
        let bc2 = 1.0 - b2.powi(step as i32);
        // Master, moments and gradient read (f32); master and moments written, and the
        // compute copy unless it is the master itself.
        let bytes = 28 * n + if self.dt == DType::F32 { 0 } else { self.stored(n) };
        self.launch_moving(
            &self.typed("adamw"),
            grid_stride(n),
            256,
            0,
            &[master.into(), weights.into(), m.into(), v.into(), g.into(), Arg::U64(n as u64), lr.into(), b1.into(), b2.into(), eps.into(), wd.into(), bc1.into(), bc2.into(), gscale.into()],
            bytes,
        )
    }

    /// RoPE on the q and k heads of `qkv` rows (as [`Ops::rope`]), and each token's rotated
    /// k and its v into its cache slot, in one launch.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_store(&self, qkv: DevPtr, kc: DevPtr, vc: DevPtr, cos: DevPtr, sin: DevPtr, pos: DevPtr, slots: DevPtr, n: usize, nh: usize, kvh: usize, hd: usize, ld: usize) -> Result<()> {
        // q and k heads read and written, v read, k and v written to the cache.
        let bytes = self.stored(n * hd * (2 * (nh + kvh) + 3 * kvh)) + 4 * n * (hd + 2);
        self.launch_moving(
            &self.typed("rope_kv_store"),
            [n as u32, 1, 1],
            // A batch of 4 pairs per thread covers 1024 pairs (16 heads of 128) in one go.
            256,
            0,
            &[qkv.into(), kc.into(), vc.into(), cos.into(), sin.into(), pos.into(), slots.into(), int(n, "tokens")?, int(nh, "heads")?, int(kvh, "kv heads")?, int(hd, "head_dim")?, int(ld, "ld")?],
            bytes,
        )
    }

    /// Decode attention: one query token per row against its paged cache, split over the
    /// context in `splits` ranges of `split_keys` positions (flash-decoding; see
    /// [`decode_split_keys`]), whose partial results (`part`: rows · nh · splits · (hd + 2)
    /// floats of scratch) the last split of each (row, KV head) merges into `out`, counting in
    /// `done` (rows · kvh u32, zero before the first launch and left zero after each); on the
    /// tensor-core kernel a row whose context fits one split writes `out` directly. Every
    /// row has at least one cached position (`ctx_len` ≥ 1: its own token).
    ///
    /// With `new`, each row's newest position is not yet in the cache and its q, k and v in
    /// `qkv` are not yet rotated: they are rotated and stored (slot `new.slots[r]`) first —
    /// inside the tensor-core kernel ([`DecodeRope::Fused`]) or by `rope_kv_store` — and `qkv`'s
    /// q and k heads are left rotated or not. Without it, q is rotated and the cache is whole.
    ///
    /// Under dependent launches ([`DecodeLaunch::Dependent`]) the tensor-core kernel reads the
    /// cached positions before each row's newest ahead of `grid_wait()`: no kernel queued since
    /// the step's inputs were copied in may write them (this step's kernels write only the
    /// newest position).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention(
        &self,
        out: DevPtr,
        part: DevPtr,
        done: DevPtr,
        qkv: DevPtr,
        kc: DevPtr,
        vc: DevPtr,
        tables: DevPtr,
        ctx_len: DevPtr,
        new: Option<&NewTokens>,
        rows: usize,
        max_blocks: usize,
        block_size: usize,
        (nh, kvh, hd, ld): (usize, usize, usize, usize),
        (split_keys, splits): (usize, usize),
    ) -> Result<()> {
        // Both kernels hold a GQA group's heads in one block (the tensor-core one as the 16 rows
        // of its products); model loading refuses larger groups, this guards direct calls.
        if kvh == 0 || !nh.is_multiple_of(kvh) || nh / kvh > MAX_GQA_GROUP {
            return Err(CudaError::Request(format!("decode attention takes GQA groups of at most {MAX_GQA_GROUP} query heads per KV head, not {nh} heads on {kvh}")));
        }
        // gridDim.z; an override of the keys per split (REINFORGE_CUDA_DECODE_SPLIT) can ask for more.
        if splits > 65_535 {
            return Err(CudaError::Request(format!("decode attention over {splits} splits exceeds the GPU's 65 535: raise {DECODE_SPLIT_ENV} (keys per split)")));
        }
        let tc = self.tensor_core_attention(hd);
        let fused = match new {
            Some(t) if self.rope_inside_attention(hd) => Some(t),
            Some(t) => {
                self.rope_kv_store(qkv, kc, vc, t.cos, t.sin, t.pos, t.slots, rows, nh, kvh, hd, ld)?;
                None
            }
            None => None,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let grid = [rows as u32, kvh as u32, splits as u32];
        let head = [out.into(), part.into(), done.into(), qkv.into(), kc.into(), vc.into(), tables.into(), ctx_len.into()];
        let rope_args: Vec<Arg> = fused.map(|t| vec![t.cos.into(), t.sin.into(), t.pos.into(), t.slots.into()]).unwrap_or_default();
        let tail = [int(max_blocks, "blocks per sequence")?, int(block_size, "block size")?, int(nh, "heads")?, int(kvh, "kv heads")?];
        let last = [int(ld, "ld")?, Arg::F32(scale), int(split_keys, "split")?, int(splits, "splits")?];
        if tc {
            // Each warp's two stages of 16 keys and values, then the warps' states of 16 rows
            // combined (paged.cu).
            let staging = DEC_TC_WARPS * 2 * 2 * DEC_TC_KEYS * (hd + TC_PAD) * 2;
            let combine = (DEC_TC_WARPS * 16 * hd + 2 * DEC_TC_WARPS * 16) * 4;
            let name = if fused.is_some() { format!("decode_attn_tc_rope_d{hd}") } else { format!("decode_attn_tc_d{hd}") };
            let args: Vec<Arg> = head.into_iter().chain(rope_args).chain(tail).chain(last).collect();
            return self.launch_layer(&name, grid, 32 * DEC_TC_WARPS as u32, staging.max(combine), &args, 0);
        }
        let args: Vec<Arg> = head.into_iter().chain(tail).chain([int(hd, "head_dim")?]).chain(last).collect();
        self.launch(&self.typed("decode_attn"), grid, 128, Self::att_smem("decode", hd, nh / kvh), &args)
    }

    /// Copies whole cache blocks `src[i] → dst[i]` within one flat cache range.
    pub fn copy_blocks(&self, cache: DevPtr, src: DevPtr, dst: DevPtr, n: usize, block_elems: usize) -> Result<()> {
        self.launch(&self.typed("copy_blocks"), [n as u32, 1, 1], 256, 0, &[cache.into(), src.into(), dst.into(), int(n, "blocks")?, Arg::U64(block_elems as u64)])
    }

    /// Picks a token per row of f32 logits (see sample.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn sample(&self, tokens: DevPtr, logprobs: DevPtr, z: DevPtr, keys: DevPtr, rows: usize, v: usize, inv_t: f32, greedy: bool, top_k: usize, top_p: f32) -> Result<()> {
        if v == 0 {
            return Err(CudaError::Request("sampling from an empty vocabulary".into()));
        }
        // At least one pass over each row of logits.
        self.launch_moving(
            "sample_rows",
            [rows as u32, 1, 1],
            SAMPLE_THREADS,
            0,
            &[tokens.into(), logprobs.into(), z.into(), keys.into(), int(rows, "rows")?, int(v, "vocab")?, Arg::F32(inv_t), Arg::I32(greedy as i32), int(top_k, "top_k")?, Arg::F32(top_p)],
            4 * rows * v,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{PRELUDE, SOURCES};

    /// The integer that the prelude or a kernel file `#define`s as `name`.
    fn define(name: &str) -> usize {
        let texts = std::iter::once(PRELUDE).chain(SOURCES.iter().map(|s| s.text));
        let values: Vec<usize> = texts
            .flat_map(str::lines)
            .filter_map(|l| {
                let mut w = l.trim_start().strip_prefix("#define ")?.split_whitespace();
                (w.next()? == name).then(|| w.next()?.parse().ok())?
            })
            .collect();
        assert_eq!(values.len(), 1, "#define {name} <integer> appears {} times in the kernel sources", values.len());
        values[0]
    }

    /// The launchers size grids, shared memory and limits with constants the kernels also
    /// define: a change on one side only would launch wrong shapes without any compile error.
    #[test]
    fn host_constants_match_the_kernels_defines() {
        assert_eq!(ATT_TILE, define("RF_ATT_TILE"));
        assert_eq!(ATT_CHUNK, define("RF_ATT_CHUNK"));
        // `att_smem` sizes the f32 decode kernel's chunks with it too.
        assert_eq!(ATT_CHUNK, define("RF_DEC_CHUNK"));
        assert_eq!(TC_TILE, define("TC_ROWS"));
        assert_eq!(TC_PAD, define("TC_PAD"));
        assert_eq!(TC_KEYS, define("TC_KEYS"));
        assert_eq!(TC_DQ_KEYS, define("TC_DQ_KEYS"));
        assert_eq!(TC_DK_QS, define("TC_DK_QS"));
        assert_eq!(DEC_TC_KEYS, define("RF_DTC_KEYS"));
        assert_eq!(MAX_HEAD_DIM, define("RF_ATT_MAXC") * 32);
        assert_eq!(MAX_HEAD_DIM, define("RF_DEC_MAXC") * 32);
        assert_eq!(MAX_GQA_GROUP, define("RF_DEC_HEADS") * define("RF_DEC_WARPS"));
        assert_eq!(FUSED_LINEAR_ROWS, define("RF_DL_MAX_ROWS"));
        assert_eq!(FUSED_LINEAR_WIDTH, define("RF_DL_MAX_WIDTH"));
        assert_eq!(FUSED_LINEAR_COLS, define("RF_DL_COLS"));
        assert_eq!(FUSED_ROWS_SPLIT, define("RF_DL_SPLIT"));
        assert_eq!(NORM_VECS, define("RF_NORM_VECS"));
        assert_eq!(NORM_BWD_VECS, define("RF_NORM_BWD_VECS"));
        assert_eq!(SAMPLE_THREADS as usize, define("RF_SAMPLE_THREADS"));
    }
}
