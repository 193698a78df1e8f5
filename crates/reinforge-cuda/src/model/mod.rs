//! The decoder-only transformer (Llama family, Qwen2) on the device: weights in one flat
//! buffer ([`layout`]), the forward over packed sequences, and its hand-written backward, one
//! layer kind at a time, in reverse.
//!
//! A forward step per block: RMSNorm → one GEMM for q, k, v (+ bias) → RoPE → causal
//! attention → output projection with the residual added in the GEMM → RMSNorm → one GEMM
//! for gate and up → SwiGLU → down projection with the residual. The head works on the rows
//! that are scored only (the positions that predict a response token), in chunks, so
//! neither prompt positions nor `[tokens, vocab]` logits cost anything.
//!
//! The backward mirrors it, accumulating f32 weight gradients (GEMMs with β = 1, column sums
//! and per-block partial sums reduced in a fixed order: the same bits every run).

pub mod layout;
mod lora;
pub mod packed;

use crate::error::{CudaError, Result};
use crate::gpu::{Buf, DType, DevPtr, Gpu};
use crate::ops::{AttentionKernels, DecodeLaunch, DecodeLinear, DecodeRope, Ops, MAX_GQA_GROUP, MAX_HEAD_DIM};
pub use layout::{Group, LayerOffsets, Layout, LoraGroup, LoraLayout, LoraMember, Slot};
pub use packed::{EmbedIndex, Packed, Tiles};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{HostTensor, ModelConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What to do when activations do not fit.
const FIX_ACTIVATIONS: &str = "lower the micro-batch size (actor.ppo_micro_batch_size, critic.ppo_micro_batch_size), shorten data.max_response_length, or set actor.gradient_checkpointing = true";

/// How a rollout's prefill pass needs less memory.
/// (The cache already leaves a pass's room within the budget: a pass that does not fit means
/// the device has less free than the budget assumes, e.g. another process uses it.)
pub(crate) const FIX_PREFILL: &str = "lower rollout.max_num_batched_tokens (prompt tokens per prefill pass), or lower rollout.gpu_memory_utilization if another process uses this GPU";

/// Bytes of f32 logits the head computes at once: a 64th of the device's memory, within
/// 256 MiB and 1 GiB. Each chunk's weight-gradient GEMM reads and writes the whole f32
/// `[vocab, hidden]` gradient (0.9 GB each way for Qwen2.5-1.5B) to add a product of depth
/// `rows`, so small chunks make the head's backward memory-bound: 441 rows (256 MiB of
/// 151 936 logits) spend twice the GEMM's compute time on that traffic, 1766 rows (1 GiB) half.
const HEAD_CHUNK_BYTES: (usize, usize) = (256 << 20, 1 << 30);

/// A model's weights on a device, in the storage type.
pub struct DeviceModel {
    /// The device.
    pub gpu: Arc<Gpu>,
    /// Shapes and numerics.
    pub cfg: ModelConfig,
    /// Storage type of weights and activations.
    pub dt: DType,
    /// Where each weight is.
    pub layout: Layout,
    /// The weights (`layout.total` elements of `dt`).
    pub params: Buf,
    pub(crate) rope_cos: Buf,
    pub(crate) rope_sin: Buf,
    /// The kernels training and prefill attention run on (bf16): tensor cores unless
    /// `REINFORGE_CUDA_ATTENTION=cuda-cores`.
    pub attention: AttentionKernels,
    /// Where decode attention rotates and caches new tokens: inside the tensor-core kernel
    /// unless `REINFORGE_CUDA_DECODE_ROPE=separate`.
    pub decode_rope: DecodeRope,
    /// Whether a decode step fuses its norms into the linear layers after them (small models):
    /// not unless `REINFORGE_CUDA_DECODE_LINEAR=fused`.
    pub decode_linear: DecodeLinear,
    /// How its decode layer kernels follow each other ([`crate::ops::DECODE_LAUNCH_ENV`]).
    pub decode_launch: DecodeLaunch,
    /// Rows of the LM head computed at once (`None`: by the device's memory, see
    /// `HEAD_CHUNK_BYTES`); tests set a few rows to cross chunk edges.
    pub head_chunk_rows: Option<usize>,
}

/// What the head computes for the scored rows.
#[derive(Debug, Clone, Copy)]
pub enum Head<'a> {
    /// Log-probabilities (and entropies) of these target tokens under `logits / temperature`.
    Lm {
        /// One target per scored row.
        targets: &'a [u32],
        /// Softmax temperature (> 0).
        temperature: f64,
    },
    /// The value head's scalar.
    Value,
}

/// The head's outputs for the scored rows (host).
#[derive(Debug, Clone, Default)]
pub struct RowOut {
    /// Log-probabilities (LM head) or values (value head).
    pub value: Vec<f32>,
    /// Entropies (LM head only).
    pub entropy: Vec<f32>,
}

/// Gradients of the loss with respect to the head's outputs, per scored row.
#[derive(Debug, Clone, Default)]
pub struct RowGrads {
    /// ∂L/∂log-prob (or ∂L/∂value).
    pub value: Vec<f32>,
    /// ∂L/∂entropy (LM head; empty means zeros).
    pub entropy: Vec<f32>,
}

/// Where a prefill writes each token's keys and values: the paged cache of every layer
/// (layer `l`'s at `k + l·layer_bytes`) and each token's slot.
pub(crate) struct KvSink {
    pub(crate) k: DevPtr,
    pub(crate) v: DevPtr,
    pub(crate) layer_bytes: usize,
    pub(crate) slots: DevPtr,
}

/// Device copies of a batch's bookkeeping.
pub(crate) struct Shape {
    n: usize,
    ids: Buf,
    pos: Buf,
    tiles: Buf,
    n_tiles: usize,
}

/// One block's saved activations.
struct LayerActs {
    h1: Buf,
    rstd1: Buf,
    qkv: Buf,
    att: Buf,
    lse: Buf,
    x_mid: Buf,
    h2: Buf,
    rstd2: Buf,
    gu: Buf,
    /// Per [`Group`], `x·Aᵀ` of its LoRA adapter (`[n, width]`), when it has one.
    lora: [Option<Buf>; 4],
}

/// A forward pass kept for the backward.
pub struct Pass {
    shape: Shape,
    index: EmbedIndex,
    /// Block inputs x_0 … x_{L-1}, and x_L (the last block's output).
    xs: Vec<Buf>,
    /// Per block, or one scratch set (recomputed per block) under gradient checkpointing.
    acts: Vec<LayerActs>,
    hf: Buf,
    rstdf: Buf,
    rows: Vec<usize>,
    rows_dev: Buf,
    head_state: HeadState,
}

/// What the head keeps for its backward.
enum HeadState {
    Lm { targets: Buf, lse: Buf, ent: Buf, inv_t: f32 },
    Value,
}

impl DeviceModel {
    /// Uploads a model from HF-named tensors (`value_head`: a critic or reward model, whose
    /// `score.weight` starts at zero when absent, as on the CPU engine).
    pub fn from_weights(gpu: &Arc<Gpu>, cfg: ModelConfig, weights: &mut WeightSet, dt: DType, value_head: bool) -> Result<DeviceModel> {
        check_config(&cfg)?;
        let layout = Layout::new(&cfg, value_head);
        let params = gpu.alloc(layout.total * dt.size(), "model weights", "use a smaller model or a GPU with more memory")?;
        let ops = Ops::new(gpu, dt);
        let largest = layout.slots.iter().map(Slot::len).max().unwrap_or(1);
        let staging = gpu.alloc(largest * 4, "weight staging", "use a smaller model")?;
        for_each_slot(&layout, &cfg, weights, |slot, data| {
            gpu.upload(staging.ptr, data)?;
            ops.cast_from_f32(params.at(slot.offset, dt), staging.ptr, slot.len())
        })?;
        Self::with_params(gpu, cfg, layout, params, dt)
    }

    /// A model over weights already on the device in `layout` (storage type `dt`).
    pub(crate) fn with_params(gpu: &Arc<Gpu>, cfg: ModelConfig, layout: Layout, params: Buf, dt: DType) -> Result<DeviceModel> {
        let (rope_cos, rope_sin) = rope_tables(gpu, &cfg)?;
        gpu.sync()?;
        let attention = AttentionKernels::from_env()?;
        let (decode_rope, decode_linear, decode_launch) = (DecodeRope::from_env()?, DecodeLinear::from_env()?, DecodeLaunch::from_env()?);
        Ok(DeviceModel { gpu: Arc::clone(gpu), cfg, dt, layout, params, rope_cos, rope_sin, attention, decode_rope, decode_linear, decode_launch, head_chunk_rows: None })
    }

    /// Loads a Hugging Face model directory.
    pub fn load(gpu: &Arc<Gpu>, dir: &std::path::Path, dt: DType, value_head: bool) -> Result<DeviceModel> {
        let cfg = ModelConfig::from_dir(dir)?;
        let mut w = WeightSet::load_dir(dir)?;
        Self::from_weights(gpu, cfg, &mut w, dt, value_head)
    }

    /// The weights as HF-named f32 host tensors (from the storage copy).
    pub fn to_hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        download_slots(&self.gpu, &self.layout, self.params.ptr, self.dt)
    }

    /// Replaces the weights with HF-named host tensors of the same shapes (weight sync from
    /// another process, or a checkpoint).
    pub fn load_tensors(&mut self, tensors: BTreeMap<String, HostTensor>) -> Result<()> {
        let mut w = WeightSet::from_map("<tensors>", tensors.into_iter().collect());
        let ops = self.ops();
        let largest = self.layout.slots.iter().map(Slot::len).max().unwrap_or(1);
        let staging = self.gpu.alloc(largest * 4, "weight staging", "use a smaller model")?;
        for_each_slot(&self.layout, &self.cfg, &mut w, |slot, data| {
            self.gpu.upload(staging.ptr, data)?;
            ops.cast_from_f32(self.params.at(slot.offset, self.dt), staging.ptr, slot.len())
        })?;
        self.gpu.sync()
    }

    pub(crate) fn ops(&self) -> Ops<'_> {
        Ops { attention: self.attention, decode_rope: self.decode_rope, decode_linear: self.decode_linear, decode_launch: self.decode_launch, ..Ops::new(&self.gpu, self.dt) }
    }

    pub(crate) fn p(&self, off: usize) -> DevPtr {
        self.params.at(off, self.dt)
    }

    pub(crate) fn act(&self, elems: usize, what: &str) -> Result<Buf> {
        self.act_or(elems, what, FIX_ACTIVATIONS)
    }

    pub(crate) fn f32s(&self, elems: usize, what: &str) -> Result<Buf> {
        self.f32s_or(elems, what, FIX_ACTIVATIONS)
    }

    /// Activations in the model's type; out of memory names `fix`.
    fn act_or(&self, elems: usize, what: &str, fix: &str) -> Result<Buf> {
        self.gpu.alloc(elems * self.dt.size(), what, fix)
    }

    /// f32 activations; out of memory names `fix`.
    fn f32s_or(&self, elems: usize, what: &str, fix: &str) -> Result<Buf> {
        self.gpu.alloc(elems * 4, what, fix)
    }

    pub(crate) fn dims(&self) -> (usize, usize, usize, usize, usize, usize) {
        let c = &self.cfg;
        (c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
    }

    pub(crate) fn shape(&self, batch: &Packed) -> Result<Shape> {
        let tiles = batch.tiles(self.ops().attention_tile(self.cfg.head_dim));
        Ok(Shape {
            n: batch.len(),
            ids: self.gpu.upload_new(&batch.ids_i32(), "token ids")?,
            pos: self.gpu.upload_new(&batch.positions, "positions")?,
            n_tiles: tiles.count,
            tiles: self.gpu.upload_new(&tiles.data, "attention tiles")?,
        })
    }

    /// One layer's activations for `n` tokens; `fix` says how to need less memory.
    fn layer_acts(&self, n: usize, fix: &str) -> Result<LayerActs> {
        let (h, i, nh, _, _, ldq) = self.dims();
        let act = |elems: usize| self.act_or(elems, "activations", fix);
        let f32s = |elems: usize| self.f32s_or(elems, "activations", fix);
        // Every block carries the same adapters: block 0's widths are every block's.
        let lora = |g: Group| self.layout.lora_group(0, g).map(|(grp, r, _)| act(n * grp.width(r))).transpose();
        Ok(LayerActs {
            lora: [lora(Group::Qkv)?, lora(Group::O)?, lora(Group::GateUp)?, lora(Group::Down)?],
            h1: act(n * h)?,
            rstd1: f32s(n)?,
            qkv: act(n * ldq)?,
            att: act(n * nh * self.cfg.head_dim)?,
            lse: f32s(n * nh)?,
            x_mid: act(n * h)?,
            h2: act(n * h)?,
            rstd2: f32s(n)?,
            gu: act(n * 2 * i)?,
        })
    }

    /// One block: `x_out = block(x_in)`, filling `a`; `mlp` is scratch of `n · I`.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(&self, l: usize, s: &Shape, x_in: DevPtr, a: &LayerActs, x_out: DevPtr, mlp: DevPtr, kv: Option<&KvSink>) -> Result<()> {
        let (h, i, nh, kvh, hd, ldq) = self.dims();
        let n = s.n;
        let o = &self.layout.layers[l];
        let ops = self.ops();
        let eps = self.cfg.rms_norm_eps;
        ops.rmsnorm(a.h1.ptr, a.rstd1.ptr, x_in, self.p(o.ln1), n, h, eps)?;
        ops.linear(a.h1.ptr, self.p(o.w_qkv), o.b_qkv.map(|b| self.p(b)), None, a.qkv.ptr, n, ldq, h)?;
        self.lora_forward(l, Group::Qkv, a.h1.ptr, a.lora[0].as_ref(), a.qkv.ptr, n)?;
        match kv {
            Some(kv) => {
                let off = l * kv.layer_bytes;
                ops.rope_kv_store(a.qkv.ptr, kv.k.add(off), kv.v.add(off), self.rope_cos.ptr, self.rope_sin.ptr, s.pos.ptr, kv.slots, n, nh, kvh, hd, ldq)?;
            }
            None => ops.rope(a.qkv.ptr, self.rope_cos.ptr, self.rope_sin.ptr, s.pos.ptr, n, nh + kvh, hd, ldq, false)?,
        }
        ops.attention(a.att.ptr, a.lse.ptr, a.qkv.ptr, s.tiles.ptr, s.n_tiles, n, nh, kvh, hd, ldq)?;
        ops.linear(a.att.ptr, self.p(o.w_o), o.b_o.map(|b| self.p(b)), Some(x_in), a.x_mid.ptr, n, h, nh * hd)?;
        self.lora_forward(l, Group::O, a.att.ptr, a.lora[1].as_ref(), a.x_mid.ptr, n)?;
        ops.rmsnorm(a.h2.ptr, a.rstd2.ptr, a.x_mid.ptr, self.p(o.ln2), n, h, eps)?;
        ops.linear(a.h2.ptr, self.p(o.w_gu), o.b_gu.map(|b| self.p(b)), None, a.gu.ptr, n, 2 * i, h)?;
        self.lora_forward(l, Group::GateUp, a.h2.ptr, a.lora[2].as_ref(), a.gu.ptr, n)?;
        ops.swiglu(mlp, a.gu.ptr, n, i)?;
        ops.linear(mlp, self.p(o.w_down), o.b_down.map(|b| self.p(b)), Some(a.x_mid.ptr), x_out, n, h, i)?;
        self.lora_forward(l, Group::Down, mlp, a.lora[3].as_ref(), x_out, n)
    }

    /// The final hidden states (after the last norm) of a batch, keeping nothing else but,
    /// with `kv`, every token's keys and values in the paged cache (a rollout's prefill).
    pub(crate) fn hidden(&self, s: &Shape, kv: Option<&KvSink>) -> Result<(Buf, Buf)> {
        let (h, i, ..) = self.dims();
        let n = s.n;
        // A prefill's tokens per pass are the rollout's knob; a scoring pass's, training's.
        let fix = if kv.is_some() { FIX_PREFILL } else { FIX_ACTIVATIONS };
        let act = |elems: usize| self.act_or(elems, "activations", fix);
        let a = self.layer_acts(n, fix)?;
        let mlp = act(n * i)?;
        let mut x = act(n * h)?;
        let mut y = act(n * h)?;
        self.ops().embed(x.ptr, self.p(self.layout.embed), s.ids.ptr, None, n, h)?;
        for l in 0..self.cfg.num_layers {
            self.layer_forward(l, s, x.ptr, &a, y.ptr, mlp.ptr, kv)?;
            std::mem::swap(&mut x, &mut y);
        }
        let hf = act(n * h)?;
        let rstd = self.f32s_or(n, "activations", fix)?;
        self.ops().rmsnorm(hf.ptr, rstd.ptr, x.ptr, self.p(self.layout.norm), n, h, self.cfg.rms_norm_eps)?;
        Ok((hf, rstd))
    }

    /// Device memory [`DeviceModel::hidden`] allocates for a pass over `tokens` tokens, its
    /// batch's ids, positions and attention tiles included: what a rollout sets aside for a
    /// prefill pass within its memory budget. It follows `hidden` buffer by buffer (a test
    /// compares it with the emulator's count).
    pub(crate) fn hidden_bytes(&self, tokens: usize) -> usize {
        let (h, i, nh, _, hd, ldq) = self.dims();
        // `layer_acts` (h1, qkv, att, x_mid, h2, gu), mlp, x, y and hf, in the storage type.
        let elems = h + ldq + nh * hd + h + h + 2 * i + i + 2 * h + h;
        // rstd1, lse, rstd2 and the final norm's rstd, in f32.
        let floats = 1 + nh + 1 + 1;
        // Ids and positions (i32), and at most one attention tile (six i32) per token.
        let shape = 4 + 4 + 6 * 4;
        tokens * (elems * self.dt.size() + floats * 4 + shape)
    }

    /// Rows of the LM head computed at once.
    fn head_chunk(&self) -> usize {
        if let Some(rows) = self.head_chunk_rows {
            return rows.max(1);
        }
        let (lo, hi) = HEAD_CHUNK_BYTES;
        let bytes = (self.gpu.info.total_mem / 64).clamp(lo as u64, hi as u64) as usize;
        (bytes / (self.cfg.vocab_size * 4).max(1)).clamp(16, 4096)
    }

    /// The LM head's chunk for `r` rows: its rows, f32 logits, and (`backward`, bf16) their
    /// gradient — dz reuses z's memory in f32, each element read, then written, by one thread.
    /// Where the memory is short, chunks halve down to 256 MiB of logits before it is an error.
    fn head_scratch(&self, r: usize, backward: bool) -> Result<(usize, Buf, Option<Buf>)> {
        let vocab = self.cfg.vocab_size;
        let floor = (HEAD_CHUNK_BYTES.0 / (vocab * 4).max(1)).max(16);
        let mut chunk = self.head_chunk().min(r);
        loop {
            let bufs = self.f32s(chunk * vocab, "logits chunk").and_then(|z| {
                let dz = if backward && self.dt != DType::F32 { Some(self.act(chunk * vocab, "logits gradient chunk")?) } else { None };
                Ok((z, dz))
            });
            match bufs {
                Ok((z, dz)) => return Ok((chunk, z, dz)),
                Err(CudaError::OutOfMemory { .. }) if chunk / 2 >= floor => chunk /= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// Scores rows of a batch without keeping anything for a backward: `rows` are packed
    /// positions (each predicting its target under the LM head, or read by the value head).
    pub fn score(&self, batch: &Packed, rows: &[usize], head: Head<'_>) -> Result<RowOut> {
        check_rows(batch, rows, &head, self.cfg.vocab_size)?;
        if rows.is_empty() {
            return Ok(RowOut::default());
        }
        let s = self.shape(batch)?;
        let (hf, _) = self.hidden(&s, None)?;
        let rows_dev = self.gpu.upload_new(&rows_i32(rows), "scored rows")?;
        let (out, _) = self.head_forward(&hf, &rows_dev, rows.len(), head, false)?;
        Ok(out)
    }

    /// The LM head's logits (f32, `[rows, vocab]`, row-major) at the given packed positions:
    /// for checks against references, not for training (it materialises the logits).
    pub fn logits(&self, batch: &Packed, rows: &[usize]) -> Result<Vec<f32>> {
        let targets = vec![0u32; rows.len()];
        check_rows(batch, rows, &Head::Lm { targets: &targets, temperature: 1.0 }, self.cfg.vocab_size)?;
        if self.layout.score.is_some() {
            return Err(CudaError::Request("a value model has no LM head".into()));
        }
        let s = self.shape(batch)?;
        let (hf, _) = self.hidden(&s, None)?;
        let h = self.cfg.hidden_size;
        let r = rows.len();
        let rows_dev = self.gpu.upload_new(&rows_i32(rows), "scored rows")?;
        let hs = self.act(r * h, "head rows")?;
        self.ops().gather_rows(hs.ptr, hf.ptr, rows_dev.ptr, r, h)?;
        let z = self.f32s(r * self.cfg.vocab_size, "logits")?;
        self.ops().logits(hs.ptr, self.p(self.layout.head()), z.ptr, r, self.cfg.vocab_size, h)?;
        self.gpu.to_vec(z.ptr, r * self.cfg.vocab_size)
    }

    /// The head over the gathered rows; with `keep`, what its backward needs.
    fn head_forward(&self, hf: &Buf, rows: &Buf, r: usize, head: Head<'_>, keep: bool) -> Result<(RowOut, HeadState)> {
        let h = self.cfg.hidden_size;
        let ops = self.ops();
        let hs = self.act(r * h, "head rows")?;
        ops.gather_rows(hs.ptr, hf.ptr, rows.ptr, r, h)?;
        match head {
            Head::Value => {
                let score = self.layout.score.ok_or_else(|| CudaError::Request("this model has no value head".into()))?;
                let v = self.f32s(r, "values")?;
                ops.value_head(v.ptr, hs.ptr, self.p(score), r, h)?;
                Ok((RowOut { value: self.gpu.to_vec(v.ptr, r)?, entropy: Vec::new() }, HeadState::Value))
            }
            Head::Lm { targets, temperature } => {
                let inv_t = (1.0 / temperature) as f32;
                let vocab = self.cfg.vocab_size;
                let tg: Vec<i32> = targets.iter().map(|&t| t as i32).collect();
                let tdev = self.gpu.upload_new(&tg, "targets")?;
                let (lp, ent, lse) = (self.f32s(r, "log-probs")?, self.f32s(r, "entropies")?, self.f32s(r, "log-sum-exp")?);
                let (chunk, z, _) = self.head_scratch(r, false)?;
                for c0 in (0..r).step_by(chunk) {
                    let c = chunk.min(r - c0);
                    ops.logits(hs.at(c0 * h, self.dt), self.p(self.layout.head()), z.ptr, c, vocab, h)?;
                    ops.logits_rows(lp.ptr.add(c0 * 4), ent.ptr.add(c0 * 4), lse.ptr.add(c0 * 4), z.ptr, tdev.ptr.add(c0 * 4), c, vocab, inv_t)?;
                }
                let out = RowOut { value: self.gpu.to_vec(lp.ptr, r)?, entropy: self.gpu.to_vec(ent.ptr, r)? };
                let state = if keep { HeadState::Lm { targets: tdev, lse, ent, inv_t } } else { HeadState::Value };
                Ok((out, state))
            }
        }
    }

    /// The forward of a training step: every activation the backward needs is kept (or only
    /// block inputs, with `checkpointing`, recomputed per block in the backward).
    pub fn forward_train(&self, batch: &Packed, rows: &[usize], head: Head<'_>, checkpointing: bool) -> Result<(RowOut, Pass)> {
        check_rows(batch, rows, &head, self.cfg.vocab_size)?;
        let (h, i, ..) = self.dims();
        let s = self.shape(batch)?;
        let n = s.n;
        let nl = self.cfg.num_layers;
        let mut xs = Vec::with_capacity(nl + 1);
        let x0 = self.act(n * h, "activations")?;
        self.ops().embed(x0.ptr, self.p(self.layout.embed), s.ids.ptr, None, n, h)?;
        xs.push(x0);
        let mut acts = Vec::new();
        let mlp = self.act(n * i, "activations")?;
        for l in 0..nl {
            if l == 0 || !checkpointing {
                acts.push(self.layer_acts(n, FIX_ACTIVATIONS)?);
            }
            let x_out = self.act(n * h, "activations")?;
            let a = acts.last().ok_or_else(|| CudaError::Request("no activation buffers".into()))?;
            self.layer_forward(l, &s, xs[l].ptr, a, x_out.ptr, mlp.ptr, None)?;
            xs.push(x_out);
        }
        drop(mlp);
        let hf = self.act(n * h, "activations")?;
        let rstdf = self.f32s(n, "activations")?;
        self.ops().rmsnorm(hf.ptr, rstdf.ptr, xs[nl].ptr, self.p(self.layout.norm), n, h, self.cfg.rms_norm_eps)?;
        let rows_dev = self.gpu.upload_new(&rows_i32(rows).into_iter().chain(std::iter::once(0)).collect::<Vec<_>>(), "scored rows")?;
        let (out, head_state) = if rows.is_empty() { (RowOut::default(), HeadState::Value) } else { self.head_forward(&hf, &rows_dev, rows.len(), head, true)? };
        Ok((out, Pass { index: batch.embed_index(), shape: s, xs, acts, hf, rstdf, rows: rows.to_vec(), rows_dev, head_state }))
    }

    /// The backward of [`Self::forward_train`]: adds the gradient of the loss whose derivatives
    /// with respect to the head outputs are `g` to the f32 gradient buffer `grads` (same
    /// layout as the weights).
    pub fn backward(&self, pass: Pass, g: &RowGrads, grads: DevPtr, checkpointing: bool) -> Result<()> {
        let (h, i, nh, _, hd, ldq) = self.dims();
        let s = &pass.shape;
        let n = s.n;
        let r = pass.rows.len();
        let ops = self.ops();
        let gp = |off: usize| grads.add(off * 4);
        // Under LoRA only the adapter trains: no gradient for any base weight (the gradient
        // buffer holds the factors alone).
        let frozen = self.layout.frozen_base();
        if g.value.len() != r || !(g.entropy.is_empty() || g.entropy.len() == r) {
            return Err(CudaError::Request(format!("backward: {} gradients for {r} scored rows", g.value.len())));
        }
        // Head → ∂L/∂(final hidden states) at the scored rows.
        let dhf = self.act(n * h, "gradients")?;
        if r > 0 {
            let dhs = self.act(r * h, "gradients")?;
            let gv = self.gpu.upload_new(&g.value, "head gradients")?;
            let hs = self.act(r * h, "head rows")?;
            ops.gather_rows(hs.ptr, pass.hf.ptr, pass.rows_dev.ptr, r, h)?;
            match &pass.head_state {
                HeadState::Value => {
                    let score = self.layout.score.ok_or_else(|| CudaError::Request("this model has no value head".into()))?;
                    ops.value_head_bwd(dhs.ptr, gv.ptr, self.p(score), r, h)?;
                    let part = self.f32s(Ops::col_parts(r) * h, "gradient scratch")?;
                    ops.col_sum(gp(score), part.ptr, hs.ptr, Some(gv.ptr), r, h, h)?;
                }
                HeadState::Lm { targets, lse, ent, inv_t } => {
                    let ge_host = if g.entropy.is_empty() { vec![0f32; r] } else { g.entropy.clone() };
                    let ge = self.gpu.upload_new(&ge_host, "head gradients")?;
                    let vocab = self.cfg.vocab_size;
                    let (chunk, z, dz_own) = self.head_scratch(r, true)?;
                    let dz = dz_own.as_ref().map_or(z.ptr, |b| b.ptr);
                    let head = self.layout.head();
                    for c0 in (0..r).step_by(chunk) {
                        let c = chunk.min(r - c0);
                        let q = |b: &Buf| b.ptr.add(c0 * 4);
                        ops.logits(hs.at(c0 * h, self.dt), self.p(head), z.ptr, c, vocab, h)?;
                        ops.logits_rows_bwd(dz, z.ptr, q(targets), q(lse), q(ent), gv.ptr.add(c0 * 4), ge.ptr.add(c0 * 4), c, vocab, *inv_t)?;
                        ops.linear_dx(dz, self.p(head), dhs.at(c0 * h, self.dt), c, vocab, h, false)?;
                        if !frozen {
                            ops.linear_dw(dz, hs.at(c0 * h, self.dt), gp(head), c, vocab, h)?;
                        }
                    }
                }
            }
            ops.scatter_rows(dhf.ptr, dhs.ptr, pass.rows_dev.ptr, r, h, false)?;
        }
        // Final norm.
        let nl = self.cfg.num_layers;
        let dres = self.act(n * h, "gradients")?;
        let norm_part = self.f32s(Ops::norm_parts(n) * h, "gradient scratch")?;
        ops.rmsnorm_bwd(dres.ptr, (!frozen).then(|| gp(self.layout.norm)), norm_part.ptr, dhf.ptr, pass.xs[nl].ptr, self.p(self.layout.norm), pass.rstdf.ptr, n, h, false)?;
        drop(dhf);
        // Blocks, last to first.
        let widest = ldq.max(2 * i).max(h);
        let sc = BwdScratch {
            mlp: self.act(n * i, "gradients")?,
            d_mlp: self.act(n * i, "gradients")?,
            d_gu: self.act(n * 2 * i, "gradients")?,
            dh: self.act(n * h, "gradients")?,
            d_att: self.act(n * nh * hd, "gradients")?,
            d_qkv: self.act(n * ldq, "gradients")?,
            delta: self.f32s(n * nh, "gradients")?,
            norm_part,
            col_part: self.f32s(Ops::col_parts(n) * widest, "gradient scratch")?,
            lora_dt: (self.lora_width() > 0).then(|| self.act(n * self.lora_width(), "gradients")).transpose()?,
        };
        for l in (0..nl).rev() {
            let a = if checkpointing {
                // Recompute this block's activations from its saved input.
                let a = &pass.acts[0];
                self.layer_forward(l, s, pass.xs[l].ptr, a, sc.dh.ptr, sc.mlp.ptr, None)?;
                a
            } else {
                &pass.acts[l]
            };
            self.layer_backward(l, s, pass.xs[l].ptr, a, dres.ptr, grads, &sc)?;
        }
        if frozen {
            return Ok(());
        }
        ops.embed_bwd(
            gp(self.layout.embed),
            dres.ptr,
            self.gpu.upload_new(&pass.index.uniq, "embedding index")?.ptr,
            self.gpu.upload_new(&pass.index.offs, "embedding index")?.ptr,
            self.gpu.upload_new(&pass.index.rows, "embedding index")?.ptr,
            pass.index.uniq.len(),
            h,
        )?;
        // Buffers are freed in stream order; nothing here waits for the GPU.
        Ok(())
    }

    /// One block's backward: `dres` holds ∂L/∂x_out and leaves holding ∂L/∂x_in.
    #[allow(clippy::too_many_arguments)]
    fn layer_backward(&self, l: usize, s: &Shape, x_in: DevPtr, a: &LayerActs, dres: DevPtr, grads: DevPtr, sc: &BwdScratch) -> Result<()> {
        let (h, i, nh, kvh, hd, ldq) = self.dims();
        let n = s.n;
        let o = &self.layout.layers[l];
        let ops = self.ops();
        let gp = |off: usize| grads.add(off * 4);
        // MLP: x_out = x_mid + down(swiglu(gate, up)).
        let frozen = self.layout.frozen_base();
        let lora_dt = sc.lora_dt.as_ref();
        ops.swiglu(sc.mlp.ptr, a.gu.ptr, n, i)?;
        if !frozen {
            ops.linear_dw(dres, sc.mlp.ptr, gp(o.w_down), n, h, i)?;
            if let Some(b) = o.b_down {
                ops.col_sum(gp(b), sc.col_part.ptr, dres, None, n, h, h)?;
            }
        }
        ops.linear_dx(dres, self.p(o.w_down), sc.d_mlp.ptr, n, h, i, false)?;
        self.lora_backward(l, Group::Down, sc.mlp.ptr, a.lora[3].as_ref(), dres, sc.d_mlp.ptr, lora_dt, grads, n)?;
        ops.swiglu_bwd(sc.d_gu.ptr, a.gu.ptr, sc.d_mlp.ptr, n, i)?;
        if !frozen {
            ops.linear_dw(sc.d_gu.ptr, a.h2.ptr, gp(o.w_gu), n, 2 * i, h)?;
            if let Some(b) = o.b_gu {
                ops.col_sum(gp(b), sc.col_part.ptr, sc.d_gu.ptr, None, n, 2 * i, 2 * i)?;
            }
        }
        ops.linear_dx(sc.d_gu.ptr, self.p(o.w_gu), sc.dh.ptr, n, 2 * i, h, false)?;
        self.lora_backward(l, Group::GateUp, a.h2.ptr, a.lora[2].as_ref(), sc.d_gu.ptr, sc.dh.ptr, lora_dt, grads, n)?;
        ops.rmsnorm_bwd(dres, (!frozen).then(|| gp(o.ln2)), sc.norm_part.ptr, sc.dh.ptr, a.x_mid.ptr, self.p(o.ln2), a.rstd2.ptr, n, h, true)?;
        // Attention: x_mid = x_in + o_proj(attn(rope(qkv(rmsnorm(x_in))))).
        if !frozen {
            ops.linear_dw(dres, a.att.ptr, gp(o.w_o), n, h, nh * hd)?;
            if let Some(b) = o.b_o {
                ops.col_sum(gp(b), sc.col_part.ptr, dres, None, n, h, h)?;
            }
        }
        ops.linear_dx(dres, self.p(o.w_o), sc.d_att.ptr, n, h, nh * hd, false)?;
        self.lora_backward(l, Group::O, a.att.ptr, a.lora[1].as_ref(), dres, sc.d_att.ptr, lora_dt, grads, n)?;
        ops.attention_bwd(sc.d_qkv.ptr, sc.delta.ptr, a.qkv.ptr, a.att.ptr, sc.d_att.ptr, a.lse.ptr, s.tiles.ptr, s.n_tiles, n, nh, kvh, hd, ldq)?;
        ops.rope(sc.d_qkv.ptr, self.rope_cos.ptr, self.rope_sin.ptr, s.pos.ptr, n, nh + kvh, hd, ldq, true)?;
        if !frozen {
            ops.linear_dw(sc.d_qkv.ptr, a.h1.ptr, gp(o.w_qkv), n, ldq, h)?;
            if let Some(b) = o.b_qkv {
                ops.col_sum(gp(b), sc.col_part.ptr, sc.d_qkv.ptr, None, n, ldq, ldq)?;
            }
        }
        ops.linear_dx(sc.d_qkv.ptr, self.p(o.w_qkv), sc.dh.ptr, n, ldq, h, false)?;
        self.lora_backward(l, Group::Qkv, a.h1.ptr, a.lora[0].as_ref(), sc.d_qkv.ptr, sc.dh.ptr, lora_dt, grads, n)?;
        ops.rmsnorm_bwd(dres, (!frozen).then(|| gp(o.ln1)), sc.norm_part.ptr, sc.dh.ptr, x_in, self.p(o.ln1), a.rstd1.ptr, n, h, true)
    }
}

/// Scratch the block backward reuses across blocks.
struct BwdScratch {
    mlp: Buf,
    d_mlp: Buf,
    d_gu: Buf,
    dh: Buf,
    d_att: Buf,
    d_qkv: Buf,
    delta: Buf,
    norm_part: Buf,
    col_part: Buf,
    /// `∂L/∂(x·Aᵀ)` of a LoRA group (`[n, widest group]`), when the model has an adapter.
    lora_dt: Option<Buf>,
}

/// Calls `f` with each slot of `layout` and its f32 data from `weights`, checking shapes (a
/// missing `score.weight` is zeros; a tied model's stray `lm_head.weight` is ignored).
pub(crate) fn for_each_slot(layout: &Layout, cfg: &ModelConfig, weights: &mut WeightSet, mut f: impl FnMut(&Slot, &[f32]) -> Result<()>) -> Result<()> {
    if cfg.tie_word_embeddings && weights.contains("lm_head.weight") {
        // A copy of the tied head that some exporters write; it is not a parameter of its own.
        weights.take("lm_head.weight", &[cfg.vocab_size, cfg.hidden_size])?;
    }
    for slot in &layout.slots {
        let t = if slot.name == "score.weight" {
            weights.take_opt(&slot.name, &slot.shape)?.unwrap_or(HostTensor { shape: slot.shape.clone(), data: vec![0.0; slot.len()] })
        } else {
            weights.take(&slot.name, &slot.shape)?
        };
        f(slot, &t.data)?;
    }
    Ok(())
}

fn rows_i32(rows: &[usize]) -> Vec<i32> {
    rows.iter().map(|&r| r as i32).collect()
}

fn check_rows(batch: &Packed, rows: &[usize], head: &Head<'_>, vocab: usize) -> Result<()> {
    if let Some(&bad) = rows.iter().find(|&&r| r >= batch.len()) {
        return Err(CudaError::Request(format!("scored row {bad} is outside the batch of {} tokens", batch.len())));
    }
    if let Head::Lm { targets, temperature } = head {
        if targets.len() != rows.len() {
            return Err(CudaError::Request(format!("{} targets for {} scored rows", targets.len(), rows.len())));
        }
        if !(temperature.is_finite() && *temperature > 0.0) {
            return Err(CudaError::Request(format!("temperature must be a positive number, got {temperature}")));
        }
        // The kernels read a target's logit by index: one past the vocabulary would read the
        // next row's.
        if let Some(&bad) = targets.iter().find(|&&t| t as usize >= vocab) {
            return Err(CudaError::Request(format!("target token {bad} is outside the vocabulary of {vocab}: token ids must come from this model's tokenizer")));
        }
    }
    let mut sorted = rows.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(CudaError::Request("a row is scored twice".into()));
    }
    Ok(())
}

/// Parameters a token's forward pass multiplies with: all of them but an untied embedding
/// table, whose lookup reads one row (tied, it is the LM head and counts). What a decode step
/// reads from memory and what model FLOPs count.
pub fn multiplying_params(cfg: &ModelConfig, layout: &Layout) -> usize {
    layout.num_params() - if cfg.tie_word_embeddings { 0 } else { cfg.vocab_size * cfg.hidden_size }
}

/// Model FLOPs of a training step (forward and backward) over sequences given as `(tokens,
/// context)` — a sequence's own tokens and the keys they attend to (its length, plus a shared
/// prefix's for a continuation: [`Packed::contexts`]) — as PaLM counts them: 6 per weight that
/// multiplies (the embedding table only as a tied LM head) per token, plus 12 · layers · hidden
/// · context per token for attention. MFU divides this by the step time and the GPU's peak.
/// Under LoRA a frozen weight counts 4 (its gradient GEMM does not run), a factor 6.
pub fn train_flops(cfg: &ModelConfig, layout: &Layout, seqs: impl IntoIterator<Item = (usize, usize)>) -> f64 {
    let n = multiplying_params(cfg, layout) as f64;
    let per_token = if layout.frozen_base() {
        let factors = layout.slots.iter().filter(|s| s.offset < layout.trainable).map(Slot::len).sum::<usize>() as f64;
        4.0 * (n - factors) + 6.0 * factors
    } else {
        6.0 * n
    };
    let per = (12 * cfg.num_layers * cfg.hidden_size) as f64;
    seqs.into_iter().map(|(l, ctx)| l as f64 * (per_token + per * ctx as f64)).sum()
}

/// Refuses shapes the kernels do not cover, before anything is allocated.
pub fn check_config(cfg: &ModelConfig) -> Result<()> {
    if cfg.head_dim > MAX_HEAD_DIM {
        return Err(CudaError::Request(format!("head_dim {} is above the CUDA engine's {MAX_HEAD_DIM}", cfg.head_dim)));
    }
    if cfg.group_size() > MAX_GQA_GROUP {
        return Err(CudaError::Request(format!("{} query heads per KV head is above the CUDA engine's {MAX_GQA_GROUP}", cfg.group_size())));
    }
    Ok(())
}

/// cos and sin of `position · θ^(−2i/hd)` for every position and frequency, computed in f64
/// like the CPU engine, `[max_pos, hd/2]` each.
fn rope_tables(gpu: &Arc<Gpu>, cfg: &ModelConfig) -> Result<(Buf, Buf)> {
    let (hd, max) = (cfg.head_dim, cfg.max_position_embeddings.max(1));
    let half = hd / 2;
    let inv: Vec<f64> = (0..half).map(|i| cfg.rope_theta.powf(-2.0 * i as f64 / hd as f64)).collect();
    let mut cos = Vec::with_capacity(max * half);
    let mut sin = Vec::with_capacity(max * half);
    for p in 0..max {
        for f in &inv {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((gpu.upload_new(&cos, "RoPE table")?, gpu.upload_new(&sin, "RoPE table")?))
}

/// Every slot of a flat buffer of `dt` at `base` as HF-named f32 host tensors.
pub fn download_slots(gpu: &Arc<Gpu>, layout: &Layout, base: DevPtr, dt: DType) -> Result<BTreeMap<String, HostTensor>> {
    download_slots_where(gpu, layout, base, dt, |_| true)
}

/// [`download_slots`] of the slots `keep` picks (a buffer that holds only those).
pub fn download_slots_where(gpu: &Arc<Gpu>, layout: &Layout, base: DevPtr, dt: DType, keep: impl Fn(&Slot) -> bool) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    for slot in layout.slots.iter().filter(|s| keep(s)) {
        let p = base.add(slot.offset * dt.size());
        let data = match dt {
            DType::F32 => gpu.to_vec::<f32>(p, slot.len())?,
            DType::Bf16 => gpu.to_vec::<u16>(p, slot.len())?.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect(),
        };
        out.insert(slot.name.clone(), HostTensor { shape: slot.shape.clone(), data });
    }
    Ok(out)
}
