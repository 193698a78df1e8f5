//! Generation on the device (nano-vllm's shape): a paged KV cache with a block pool, a
//! scheduler that admits prompt groups while their blocks fit and lets finished sequences
//! leave, one prefill per prompt shared by its `n` samples, decode steps over every live
//! sequence, and sampling on the device.
//!
//! Same requests and answers as the CPU engine (`reinforge_engine::generate_with`):
//! `SamplingParams` in, `Completion`s out in (prompt, sample) order, each with its token ids,
//! per-token log-probabilities under the full softmax at the sampling temperature, and why it
//! stopped. Greedy decoding gives the CPU engine's tokens wherever the logits are not within
//! the storage type's rounding of a tie.
//!
//! Admission (vLLM's limits): at most `max_num_seqs` sequences decode at once, and one
//! prefill pass takes groups while their prompts fit `max_num_batched_tokens`; the others wait
//! and join between decode steps as running sequences finish and free their blocks.
//!
//! Memory: a group (a prompt and its samples) is admitted with every block it can ever need
//! (prompt + `max_new_tokens`) reserved, so nothing is preempted; the prompt's full blocks are
//! shared by its samples (reference counts) and only its last, partial block is copied per
//! sample. The pool is sized from `gpu_memory_utilization` (verl's name: the fraction of the
//! GPU's memory this process may fill, weights and training state included) and kept between
//! calls.
//!
//! Decode steps (vLLM's scheme): the live rows are padded up to a bucket size (1, 2, 4, …, 1024;
//! padding rows attend one slot of a scratch block no sequence owns), the step's inputs go up
//! in one copy and its tokens come back in one, and from a bucket's second step on the whole
//! step — every layer's kernels, the LM head and sampling — is one recorded graph
//! ([`crate::gpu::Graph`]) replayed with one launch. `enforce_eager` (verl's
//! `rollout.enforce_eager`) runs every step kernel by kernel instead. The buffers and graphs
//! stay for the next call while the model's weights (updated in place), the cache and the
//! sampling settings they bake in stay the same (graphs are per sampling setting); giving the
//! cache back frees them too.
//!
//! Steps overlap the host's work (vLLM's async scheduling): the host queues step t+1 before it
//! reads step t's tokens, so the device never waits while the host checks stop conditions,
//! frees blocks and builds the next inputs. Step t+1 takes each row's token straight from
//! step t's output on the device, and decodes every row that may still be running: a row that
//! step t ends with a stop token costs one wasted row-step, whose token is dropped (a row
//! ending by length is known in advance and left out). Every row's positions, cache slots,
//! random keys and input tokens are those it has when each step is read before the next is
//! queued (`async_scheduling = false`); what can differ is a step's row count (a row a stop
//! token ended stays one step longer, a group admitted as blocks free up joins one step
//! later), and with it the GEMMs' shapes, whose rounding cuBLASLt may vary by shape. On the
//! emulator, whose GEMM rows do not depend on the row count, the tokens are identical.

use crate::error::{CudaError, Result};
use crate::gpu::{Buf, DevPtr, Staging};
use crate::model::{DeviceModel, KvSink, Packed, FIX_PREFILL};
use crate::ops::NewTokens;
use reinforge_engine::{admit, row_seed, Completion, Detokenize, FinishReason, GenerationStats, SamplingParams};
use std::collections::VecDeque;

/// Tokens per cache block.
pub const BLOCK_SIZE: usize = 16;

/// Most sequences one decode step can hold (the largest bucket): the ceiling of
/// [`Rollout::max_num_seqs`].
pub const MAX_NUM_SEQS: usize = 1024;

/// Sequences decoded at once by default (verl's `rollout.max_num_seqs`).
pub const DEFAULT_MAX_NUM_SEQS: usize = 1024;

/// Prompt tokens one prefill pass takes by default (verl's `rollout.max_num_batched_tokens`).
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 8192;

/// The paged cache: for every layer, keys and values of `(blocks + 1) · BLOCK_SIZE` slots;
/// block `blocks` is scratch, written and read only by decode's padding rows.
struct KvCache {
    k: Buf,
    v: Buf,
    /// Blocks sequences may own (the pool's).
    blocks: usize,
    /// Bytes of one layer's keys (or values).
    layer_bytes: usize,
    /// Elements of one block of one layer.
    block_elems: usize,
    /// Layers and storage type of the model it was sized for.
    layers: usize,
    dt: crate::gpu::DType,
    /// Sized by the memory budget rather than by what was asked (asking again won't help).
    at_budget: bool,
}

/// Free blocks and reference counts.
struct Pool {
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl Pool {
    fn new(blocks: usize) -> Pool {
        Pool { free: (0..blocks as u32).rev().collect(), refs: vec![0; blocks] }
    }
    fn take(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        Some(b)
    }
    fn share(&mut self, b: u32) {
        self.refs[b as usize] += 1;
    }
    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }
}

/// One sequence being generated.
struct Row {
    /// Index into the output.
    out: usize,
    /// Its blocks, covering prompt + `max_new_tokens`.
    table: Vec<u32>,
    prompt_len: usize,
    /// Key of its random stream (see [`row_seed`]).
    key: u64,
    /// Tokens sampled for it, counting one a queued step has not returned yet.
    issued: usize,
    /// Its place in the last decode step queued, if it was there (its token is then on the
    /// device for the next step to read).
    last: Option<(usize, usize)>,
}

/// The rollout engine's state kept between calls: the cache, and the decode buffers and graphs.
pub struct Rollout {
    /// Decode buffers and graphs from the last call, reused while they fit. Before the cache,
    /// so that graphs that write it go first.
    decode: Option<DecodeBufs>,
    cache: Option<KvCache>,
    /// Fraction of the GPU's memory the process may use, the cache included.
    pub gpu_memory_utilization: f64,
    /// Decode kernel by kernel, without graphs (verl's `rollout.enforce_eager`).
    pub enforce_eager: bool,
    /// Queue each decode step before reading the last one's tokens (vLLM's
    /// `async_scheduling`); off, the host reads every step before queuing the next.
    pub async_scheduling: bool,
    /// Sequences decoded at once at most (verl's and vLLM's `max_num_seqs`; above
    /// [`MAX_NUM_SEQS`], that many); the rest wait until running ones finish.
    pub max_num_seqs: usize,
    /// Prompt tokens one prefill pass takes at most (vLLM's `max_num_batched_tokens`): prompt
    /// groups beyond it are prefilled in later passes, between decode steps, which bounds
    /// prefill's activation memory. A longer prompt is prefilled alone.
    pub max_num_batched_tokens: usize,
    /// Decode steps replayed from a graph in the last `generate` call (the rest ran eagerly).
    pub graph_steps: usize,
    /// Graphs recorded in the last `generate` call (none when it found all it needed kept).
    pub graphs_recorded: usize,
    /// Launches this op of every decode step twice (every layer's, for a layer's op), for
    /// `bench rollout --decode-breakdown`: the step's extra time is what the op costs in a step
    /// as it runs — in a graph, after and before its neighbours, dependent launches and all —
    /// which a profile's events between kernels cannot show. The tokens do not change: each op
    /// writes only what it computes from what it reads. (Where `rope_kv_store` rotates the new
    /// tokens in place before attention, only the attention kernel is repeated.)
    pub repeat_op: Option<DecodeOp>,
}

impl Default for Rollout {
    /// verl's defaults: half the GPU's memory, graphs, async scheduling, vLLM's limits.
    fn default() -> Rollout {
        Rollout::new(0.5)
    }
}

/// Row counts a decode step is padded up to: each has its own graph.
const BUCKETS: [usize; 18] = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 896, 1024];

/// The bucket `rows` live rows are padded to.
fn bucket(rows: usize) -> usize {
    BUCKETS.iter().copied().find(|&b| b >= rows).unwrap_or(MAX_NUM_SEQS)
}

/// One of a decode step's ops, as [`Rollout::repeat_op`] names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeOp {
    /// The token embedding lookup.
    Embed,
    /// Each layer's norm + QKV projection.
    Qkv,
    /// Each layer's attention over the paged cache (with the new tokens' RoPE and cache store,
    /// where its kernel does them).
    Attention,
    /// Each layer's output projection + residual.
    OProj,
    /// Each layer's norm + gate/up projection + SwiGLU.
    GateUp,
    /// Each layer's down projection + residual.
    Down,
    /// The final norm.
    FinalNorm,
    /// The LM head's logits.
    Logits,
    /// Sampling.
    Sample,
}

impl DecodeOp {
    /// Every op, in a step's order.
    pub const ALL: [DecodeOp; 9] =
        [DecodeOp::Embed, DecodeOp::Qkv, DecodeOp::Attention, DecodeOp::OProj, DecodeOp::GateUp, DecodeOp::Down, DecodeOp::FinalNorm, DecodeOp::Logits, DecodeOp::Sample];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            DecodeOp::Embed => "embed",
            DecodeOp::Qkv => "qkv",
            DecodeOp::Attention => "attention",
            DecodeOp::OProj => "o_proj",
            DecodeOp::GateUp => "gate_up",
            DecodeOp::Down => "down",
            DecodeOp::FinalNorm => "final_norm",
            DecodeOp::Logits => "logits",
            DecodeOp::Sample => "sample",
        }
    }

    /// Whether each layer runs it (else once a step).
    pub fn per_layer(self) -> bool {
        matches!(self, DecodeOp::Qkv | DecodeOp::Attention | DecodeOp::OProj | DecodeOp::GateUp | DecodeOp::Down)
    }
}

/// Device buffers of decode steps of up to `rows` rows, reused by every step and recorded by
/// the graphs (one per bucket and sampling setting), which all share them. Kept between
/// `generate` calls with the graphs while the model and the cache stay where they are.
struct DecodeBufs {
    /// Per bucket and sampling setting: steps run, and the graph (recorded at the second step,
    /// once kernels are loaded and GEMMs planned). First, so graphs go before their buffers.
    graphs: Vec<GraphSlot>,
    /// The model the graphs read.
    model: ModelKey,
    /// The cache the graphs read and write (`None`: not recorded against one yet).
    cache: Option<CacheKey>,
    rows: usize,
    max_blocks: usize,
    /// Inputs, one upload per step: keys (u64), then token ids, the rows' places in the
    /// previous step (-1: the id is given), positions, cache slots, context lengths (i32 each)
    /// and block tables (i32, `max_blocks` per row), each region sized for `rows`.
    input: Buf,
    /// Host sides of the inputs and of the sampled tokens, two of each: the host fills one
    /// while the other's copy may still wait its turn on the stream.
    staged_in: [Staging; 2],
    staged_out: [Staging; 2],
    /// Decode steps queued so far with these buffers (over calls).
    queued: usize,
    x: Buf,
    y: Buf,
    hn: Buf,
    qkv: Buf,
    att: Buf,
    xm: Buf,
    gu: Buf,
    mlp: Buf,
    rstd: Buf,
    /// Decode attention's partial results, per row, head and split of the context.
    part: Buf,
    /// Splits of each (row, KV head) done so far in a decode step (zero between steps).
    done: Buf,
    /// Positions per split of the context, and splits of the longest (`max_blocks` blocks).
    split: (usize, usize),
    /// o_proj's and down's partial tiles per split of k, and their counters per 16 outputs
    /// (zero between launches), where [`crate::ops::Ops::linear_rows`] splits.
    lin_part: Buf,
    lin_done: Buf,
    /// f32 logits.
    z: Buf,
    /// Sampled tokens (i32) then their log-probs (f32): one download per step.
    picked: Buf,
    /// A recording failed: the rest of this call decodes eagerly.
    eager: bool,
    /// The op the graphs launch twice ([`Rollout::repeat_op`]).
    repeat: Option<DecodeOp>,
}

/// A decode step's graph, for one bucket and sampling setting.
struct GraphSlot {
    rows: usize,
    sampling: SamplingKey,
    /// Steps of this bucket and setting run so far.
    steps: usize,
    graph: Option<crate::gpu::Graph>,
}

/// What a recorded decode step bakes in of the model: where its weights are, and its shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ModelKey {
    params: DevPtr,
    bytes: usize,
    rope: (DevPtr, DevPtr),
    dt: crate::gpu::DType,
    dims: (usize, usize, usize, usize, usize, usize),
    layers: usize,
    vocab: usize,
    eps: u64,
    /// The kernel choices (a recorded step keeps the kernels it was recorded with, and the
    /// buffers are sized for them: linear_rows' partials).
    kernels: (crate::ops::AttentionKernels, crate::ops::DecodeRope, crate::ops::DecodeLinear, crate::ops::DecodeLaunch),
}

impl ModelKey {
    fn of(model: &DeviceModel) -> ModelKey {
        ModelKey {
            params: model.params.ptr,
            bytes: model.params.bytes,
            rope: (model.rope_cos.ptr, model.rope_sin.ptr),
            dt: model.dt,
            dims: model.dims(),
            layers: model.cfg.num_layers,
            vocab: model.cfg.vocab_size,
            eps: model.cfg.rms_norm_eps.to_bits(),
            kernels: (model.attention, model.decode_rope, model.decode_linear, model.decode_launch),
        }
    }
}

/// What a recorded decode step bakes in of the cache: where each layer's keys and values are.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CacheKey {
    k: DevPtr,
    v: DevPtr,
    layer_bytes: usize,
}

/// What a recorded decode step bakes in of the sampling settings (the sampler's arguments).
#[derive(Debug, Clone, Copy, PartialEq)]
struct SamplingKey {
    inv_t: u32,
    greedy: bool,
    top_k: usize,
    top_p: u32,
}

impl DecodeBufs {
    fn new(model: &DeviceModel, rows: usize, max_blocks: usize) -> Result<DecodeBufs> {
        let gpu = &model.gpu;
        let (h, i, nh, _, hd, ldq) = model.dims();
        let fix = &format!("lower rollout.max_num_seqs (these buffers are for {rows} sequences at once)");
        let act = |e: usize| gpu.alloc(e * model.dt.size(), "decode activations", fix);
        let split_keys = crate::ops::decode_split_keys(max_blocks * BLOCK_SIZE)?;
        let splits = (max_blocks * BLOCK_SIZE).div_ceil(split_keys);
        let input_bytes = DecodeBufs::input_bytes(rows, max_blocks);
        Ok(DecodeBufs {
            graphs: Vec::new(),
            model: ModelKey::of(model),
            cache: None,
            rows,
            max_blocks,
            split: (split_keys, splits),
            part: gpu.alloc(rows * nh * splits * (hd + 2) * 4, "decode attention partials", fix)?,
            done: gpu.alloc(rows * model.cfg.num_kv_heads * 4, "decode attention counters", fix)?,
            lin_part: gpu.alloc(model.ops().linear_rows_scratch(rows, &[(h, nh * hd), (h, i)]), "decode linear partials", fix)?,
            lin_done: gpu.alloc(h.div_ceil(16) * 4, "decode linear counters", fix)?,
            input: gpu.alloc(input_bytes, "decode inputs", fix)?,
            staged_in: [gpu.staging(input_bytes)?, gpu.staging(input_bytes)?],
            staged_out: [gpu.staging(8 * rows)?, gpu.staging(8 * rows)?],
            queued: 0,
            x: act(rows * h)?,
            y: act(rows * h)?,
            hn: act(rows * h)?,
            qkv: act(rows * ldq)?,
            att: act(rows * nh * hd)?,
            xm: act(rows * h)?,
            gu: act(rows * 2 * i)?,
            mlp: act(rows * i)?,
            rstd: gpu.alloc(rows * 4, "decode activations", fix)?,
            z: gpu.alloc(rows * model.cfg.vocab_size * 4, "logits", fix)?,
            picked: gpu.alloc(rows * 8, "sampled tokens", fix)?,
            eager: false,
            repeat: None,
        })
    }

    /// Bytes of the inputs of a step of up to `rows` rows.
    fn input_bytes(rows: usize, max_blocks: usize) -> usize {
        rows * (8 + 5 * 4 + 4 * max_blocks)
    }

    /// Addresses of the input regions, in their order in `input`.
    fn inputs(&self) -> StepInputs {
        let (p, r) = (self.input.ptr, self.rows);
        StepInputs { keys: p, ids: p.add(8 * r), from: p.add(12 * r), pos: p.add(16 * r), slots: p.add(20 * r), ctx: p.add(24 * r), tables: p.add(28 * r) }
    }
}

/// Where a decode step's inputs are on the device.
struct StepInputs {
    keys: DevPtr,
    ids: DevPtr,
    from: DevPtr,
    pos: DevPtr,
    slots: DevPtr,
    ctx: DevPtr,
    tables: DevPtr,
}

/// A decode step queued: the rows it decodes (by output index, in order), and which of the
/// staging buffers its tokens come back in.
struct Queued {
    outs: Vec<usize>,
    turn: usize,
}

impl Rollout {
    /// An engine that may fill `gpu_memory_utilization` of the device's memory.
    pub fn new(gpu_memory_utilization: f64) -> Rollout {
        Rollout {
            decode: None,
            cache: None,
            gpu_memory_utilization,
            enforce_eager: false,
            async_scheduling: true,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            graph_steps: 0,
            graphs_recorded: 0,
            repeat_op: None,
        }
    }

    /// The same engine, decoding without graphs when `enforce_eager`.
    pub fn eager(self, enforce_eager: bool) -> Rollout {
        Rollout { enforce_eager, ..self }
    }

    /// The same engine, queuing each decode step before reading the last when
    /// `async_scheduling`.
    pub fn overlapped(self, async_scheduling: bool) -> Rollout {
        Rollout { async_scheduling, ..self }
    }

    /// The same engine, decoding at most `max_num_seqs` sequences at once and prefilling at
    /// most `max_num_batched_tokens` prompt tokens per pass.
    pub fn limited(self, max_num_seqs: usize, max_num_batched_tokens: usize) -> Rollout {
        Rollout { max_num_seqs, max_num_batched_tokens, ..self }
    }

    /// Bytes of the cache now held.
    pub fn cache_bytes(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.k.bytes + c.v.bytes)
    }

    /// Frees the cache, and the decode buffers and graphs that refer to it (for colocated
    /// training to have the memory back).
    pub fn release_cache(&mut self) {
        self.decode = None;
        if let Some(c) = self.cache.take() {
            let gpu = std::sync::Arc::clone(c.k.gpu());
            drop(c);
            // Hand the memory back to the driver too, for what allocates outside our pool.
            if let Err(e) = gpu.release_cached() {
                tracing::warn!("returning cached GPU memory: {e}");
            }
        }
    }

    /// Device memory a call over `prompts` sets aside within the budget for its prefill
    /// passes: the activations of the longest pass there may be (`max_num_batched_tokens`
    /// prompt tokens, or a longer prompt alone), its cache slots, and a few integers per
    /// sequence (sampling keys, rows, first tokens, block copies). The KV cache gets what is
    /// left, so that a prefill between decode steps does not take the process past
    /// `gpu_memory_utilization` (vLLM measures the same peak with a dummy pass of
    /// `max_num_batched_tokens`; here it is counted, buffer by buffer). It does not depend on
    /// how many prompts a call has, so a cache sized for one call's (validation's) fits the next.
    pub fn prefill_reserve(&self, model: &DeviceModel, prompts: &[Vec<u32>]) -> usize {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let tokens = self.max_num_batched_tokens.max(longest);
        model.hidden_bytes(tokens) + 4 * tokens + 32 * MAX_NUM_SEQS
    }

    /// Makes sure the cache has `want` blocks (or as many as the budget allows, at least
    /// `need` — one group's) with `reserve` bytes of the budget left for prefill, reusing the
    /// one it has when big enough.
    fn ensure_cache(&mut self, model: &DeviceModel, want: usize, need: usize, reserve: usize) -> Result<()> {
        let cfg = &model.cfg;
        let dt = model.dt;
        let block_elems = BLOCK_SIZE * cfg.num_kv_heads * cfg.head_dim;
        let block_bytes = 2 * cfg.num_layers * block_elems * dt.size();
        // Measured while the old cache is still allocated: once freed, its memory would count
        // as free (idle in the memory pool) and again as `held`.
        let held = self.cache_bytes();
        let (free, total) = model.gpu.mem_info()?;
        let used_by_others = total.saturating_sub(free + held as u64);
        let budget = (self.gpu_memory_utilization * total as f64) as u64;
        if let Some(c) = &self.cache {
            let fits_model = (c.block_elems, c.layers, c.dt) == (block_elems, cfg.num_layers, dt);
            // What else the process holds (new decode buffers, a longer prompt's reserve) may
            // have grown since it was sized: kept only while it still fits beside them.
            let room = used_by_others + held as u64 + reserve as u64 <= budget;
            if fits_model && room && (c.blocks >= want || (c.at_budget && c.blocks >= need)) {
                return Ok(());
            }
        }
        self.cache = None;
        // One block more than sequences may own: the padding rows' scratch block.
        let affordable = ((budget.saturating_sub(used_by_others + reserve as u64) / block_bytes as u64) as usize).saturating_sub(1);
        let blocks = want.min(affordable);
        if blocks < need {
            return Err(CudaError::OutOfMemory {
                what: "the rollout's KV cache".into(),
                need_mib: (need * block_bytes) as u64 >> 20,
                free_mib: (affordable * block_bytes) as u64 >> 20,
                total_mib: total >> 20,
                fix: format!(
                    "raise rollout.gpu_memory_utilization (now {}), or lower rollout.n / data.max_response_length / rollout.max_num_batched_tokens; the weights, training state, decode buffers, CUDA context and any other process on this GPU already use {} MiB, prefill passes {} MiB",
                    self.gpu_memory_utilization,
                    used_by_others >> 20,
                    reserve >> 20
                ),
            });
        }
        let layer_bytes = (blocks + 1) * block_elems * dt.size();
        let fix = "raise rollout.gpu_memory_utilization or lower rollout.n";
        let k = model.gpu.alloc(cfg.num_layers * layer_bytes, "the rollout's KV cache (keys)", fix)?;
        let v = model.gpu.alloc(cfg.num_layers * layer_bytes, "the rollout's KV cache (values)", fix)?;
        self.cache = Some(KvCache { k, v, blocks, layer_bytes, block_elems, layers: cfg.num_layers, dt, at_budget: blocks < want });
        Ok(())
    }

    /// Generates `params.n` completions per prompt.
    pub fn generate(&mut self, model: &DeviceModel, prompts: &[Vec<u32>], params: &SamplingParams, detok: Option<&dyn Detokenize>) -> Result<(Vec<Completion>, GenerationStats)> {
        if model.layout.lora.is_some() {
            // The decode kernels read the plain model's weights: they would skip the adapter.
            return Err(CudaError::Request("a model with a LoRA adapter decodes through its merged copy (DeviceModel::merged)".into()));
        }
        if !admit(&model.cfg, prompts, params, detok)? {
            return Ok(Default::default());
        }
        let n = params.n;
        let blocks_for = |len: usize| len.div_ceil(BLOCK_SIZE);
        // Blocks a group holds: the prompt's full blocks once, the rest per sample.
        let group_blocks = |i: usize| {
            let p = &prompts[i];
            let full = p.len() / BLOCK_SIZE;
            full + n * (blocks_for(p.len() + params.max_new_for(i)) - full)
        };
        let want: usize = (0..prompts.len()).map(group_blocks).sum();
        let need = (0..prompts.len()).map(group_blocks).max().unwrap_or(1);
        let max_blocks = prompts.iter().enumerate().map(|(i, p)| blocks_for(p.len() + params.max_new_for(i))).max().unwrap_or(1);
        let max_seqs = self.max_num_seqs.min(MAX_NUM_SEQS);
        if max_seqs == 0 || self.max_num_batched_tokens == 0 {
            return Err(CudaError::Request(format!(
                "rollout.max_num_seqs = {} and max_num_batched_tokens = {}: both must be at least 1",
                self.max_num_seqs, self.max_num_batched_tokens
            )));
        }
        if n > max_seqs {
            return Err(CudaError::Request(format!(
                "rollout.n = {n} is above the {max_seqs} sequences decoded at once (rollout.max_num_seqs, at most {MAX_NUM_SEQS}; a prompt's samples decode together): raise max_num_seqs or lower rollout.n"
            )));
        }
        // The decode buffers first, so that the cache takes only what the budget leaves: the
        // last call's, graphs included, when they are this model's and large enough.
        let rows = bucket((prompts.len() * n).min(max_seqs));
        let key = ModelKey::of(model);
        let kept = self.decode.take().filter(|b| b.model == key && b.rows >= rows && b.max_blocks >= max_blocks);
        let mut bufs = match kept {
            Some(b) => b,
            None => {
                // The cache is sized again after the new buffers, within the budget (it was
                // sized without them; it has no graphs left to keep).
                self.cache = None;
                // Room for longer sequences than this call's (up to the next power of two of
                // blocks, within the model's context), so that the buffers and their graphs
                // last over the calls of a run.
                let most = model.cfg.max_position_embeddings.div_ceil(BLOCK_SIZE).max(max_blocks);
                DecodeBufs::new(model, rows, max_blocks.next_power_of_two().min(most))?
            }
        };
        bufs.eager = false;
        self.ensure_cache(model, want, need, self.prefill_reserve(model, prompts))?;
        let cache = self.cache.as_ref().ok_or_else(|| CudaError::Request("no KV cache".into()))?;
        // Graphs recorded against another cache would write where it was.
        let cache_key = CacheKey { k: cache.k.ptr, v: cache.v.ptr, layer_bytes: cache.layer_bytes };
        if bufs.cache != Some(cache_key) || bufs.repeat != self.repeat_op {
            bufs.graphs.clear();
            bufs.cache = Some(cache_key);
            bufs.repeat = self.repeat_op;
        }
        let mut pool = Pool::new(cache.blocks);

        let mut out: Vec<Completion> = (0..prompts.len() * n)
            .map(|r| Completion { prompt_index: r / n, sample_index: r % n, token_ids: Vec::new(), logprobs: Vec::new(), finish_reason: FinishReason::Length })
            .collect();
        let mut stats = GenerationStats { prompt_tokens: prompts.iter().map(Vec::len).sum::<usize>() * n, ..Default::default() };
        self.graph_steps = 0;
        self.graphs_recorded = 0;
        let mut waiting: VecDeque<usize> = (0..prompts.len()).collect();
        let mut live: Vec<Row> = Vec::new();
        // By output index: the sequence has ended (its tokens from steps still queued are dropped).
        let mut finished = vec![false; out.len()];
        // The decode step queued whose tokens the host has not read yet.
        let mut in_flight: Option<Queued> = None;
        let longest_stop = params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0);
        let greedy = params.temperature == 0.0;
        let inv_t = if greedy { 1.0 } else { 1.0 / params.temperature };

        loop {
            // Admit whole groups while their blocks, the sequence limit and this prefill's
            // token budget allow (the first group whatever its length).
            let mut admitted: Vec<(usize, Vec<Row>)> = Vec::new();
            let mut batched = 0;
            while let Some(&p) = waiting.front() {
                let plen = prompts[p].len();
                let gb = group_blocks(p);
                let rows_now = live.len() + admitted.len() * n;
                let over_budget = !admitted.is_empty() && batched + plen > self.max_num_batched_tokens;
                if gb > pool.free.len() || rows_now + n > max_seqs || over_budget {
                    break;
                }
                waiting.pop_front();
                batched += plen;
                let total = blocks_for(plen + params.max_new_for(p));
                let full = plen / BLOCK_SIZE;
                let mut rows = Vec::with_capacity(n);
                let first: Vec<u32> = (0..total).map(|_| pool.take()).collect::<Option<_>>().ok_or_else(|| CudaError::Request("block pool ran dry".into()))?;
                for s in 0..n {
                    let table = if s == 0 {
                        first.clone()
                    } else {
                        let mut t = Vec::with_capacity(total);
                        for &b in &first[..full] {
                            pool.share(b);
                            t.push(b);
                        }
                        for _ in full..total {
                            t.push(pool.take().ok_or_else(|| CudaError::Request("block pool ran dry".into()))?);
                        }
                        t
                    };
                    rows.push(Row { out: p * n + s, table, prompt_len: plen, key: row_seed(params, p, s), issued: 1, last: None });
                }
                admitted.push((p, rows));
            }
            let admitted_any = !admitted.is_empty();
            if admitted_any {
                stats.prefills += 1;
                let picks = self.prefill(model, &bufs, prompts, &admitted, params, inv_t, greedy)?;
                for ((_, rows), group_picks) in admitted.into_iter().zip(picks) {
                    for (row, (tok, lp)) in rows.into_iter().zip(group_picks) {
                        stats.new_tokens += 1;
                        if record(&mut out[row.out], tok, lp, params, detok, longest_stop) {
                            finished[row.out] = true;
                            release(&mut pool, &row);
                        } else {
                            live.push(row);
                        }
                    }
                }
            }
            if live.is_empty() {
                if waiting.is_empty() {
                    break;
                }
                // Every admitted row ended on its first token: admit the next groups.
                if admitted_any {
                    continue;
                }
                return Err(CudaError::Request("the rollout scheduler could not admit a prompt group (not enough KV blocks)".into()));
            }
            // The next decode step, for every live row that may still be running: a row whose
            // tokens so far (one still in flight included) reach its prompt's cap is done
            // whatever that token is.
            let next: Vec<usize> = (0..live.len()).filter(|&i| live[i].issued < params.max_new_for(live[i].out / n)).collect();
            let queued = match next.is_empty() {
                true => None,
                false => Some(self.queue_decode(model, &mut bufs, &mut live, &next, &out, inv_t, greedy, params)?),
            };
            if let Some(q) = &queued {
                stats.decode_steps += 1;
                stats.row_steps += q.outs.len();
                stats.max_step_rows = stats.max_step_rows.max(q.outs.len());
            }
            // Then read the step before it — or, without async scheduling, this one.
            let read = if self.async_scheduling { std::mem::replace(&mut in_flight, queued) } else { queued };
            let Some(step) = read else {
                // The first step since the rollout began: nothing before it to read yet.
                if in_flight.is_some() {
                    continue;
                }
                return Err(CudaError::Request("the rollout scheduler has live rows but no decode step to run".into()));
            };
            let picks = read_step(&mut bufs, &step)?;
            for (&o, (tok, lp)) in step.outs.iter().zip(picks) {
                // A row the step before ended: its token from this step is dropped.
                if finished[o] {
                    continue;
                }
                stats.new_tokens += 1;
                finished[o] = record(&mut out[o], tok, lp, params, detok, longest_stop);
            }
            live.retain(|row| {
                if finished[row.out] {
                    release(&mut pool, row);
                }
                !finished[row.out]
            });
        }
        self.decode = Some(bufs);
        Ok((out, stats))
    }

    /// Prefills the admitted groups' prompts (one pass, keys and values into sample 0's
    /// blocks), copies each prompt's partial last block to its other samples, and samples
    /// every sample's first token from its prompt's last logits (in `bufs`' rows and logits,
    /// which the decode step queued before, on the same stream, is done with).
    #[allow(clippy::too_many_arguments)]
    fn prefill(&self, model: &DeviceModel, bufs: &DecodeBufs, prompts: &[Vec<u32>], groups: &[(usize, Vec<Row>)], params: &SamplingParams, inv_t: f32, greedy: bool) -> Result<Vec<Vec<(u32, f32)>>> {
        let cache = self.cache.as_ref().ok_or_else(|| CudaError::Request("no KV cache".into()))?;
        let seqs: Vec<&[u32]> = groups.iter().map(|(p, _)| prompts[*p].as_slice()).collect();
        let batch = Packed::new(&seqs, model.cfg.vocab_size, model.cfg.max_position_embeddings)?;
        let mut slots = Vec::with_capacity(batch.len());
        for (_, rows) in groups {
            let r0 = &rows[0];
            slots.extend((0..r0.prompt_len).map(|pos| slot(&r0.table, pos)));
        }
        let gpu = &model.gpu;
        let slots = gpu.upload_new_or(&slots, "cache slots", FIX_PREFILL)?;
        let shape = model.shape(&batch)?;
        let sink = KvSink { k: cache.k.ptr, v: cache.v.ptr, layer_bytes: cache.layer_bytes, slots: slots.ptr };
        let (hf, _) = model.hidden(&shape, Some(&sink))?;
        // Partial last blocks: sample 0's copy goes to every other sample's own block.
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for (_, rows) in groups {
            let full = rows[0].prompt_len / BLOCK_SIZE;
            if rows[0].prompt_len % BLOCK_SIZE != 0 {
                for r in &rows[1..] {
                    src.push(rows[0].table[full] as i32);
                    dst.push(r.table[full] as i32);
                }
            }
        }
        if !src.is_empty() {
            let (s, d) = (gpu.upload_new_or(&src, "block copies", FIX_PREFILL)?, gpu.upload_new_or(&dst, "block copies", FIX_PREFILL)?);
            let ops = model.ops();
            let layers = model.cfg.num_layers;
            for base in [cache.k.ptr, cache.v.ptr] {
                // Each layer's cache is its own range of blocks.
                for l in 0..layers {
                    ops.copy_blocks(base.add(l * cache.layer_bytes), s.ptr, d.ptr, src.len(), cache.block_elems)?;
                }
            }
        }
        // The last prompt position of each group, once per sample.
        let mut last = Vec::new();
        let mut keys = Vec::new();
        for (gi, (_, rows)) in groups.iter().enumerate() {
            let (start, len) = batch.seqs[gi];
            for r in rows {
                last.push((start + len - 1) as i32);
                keys.push(step_key(r.key, 0));
            }
        }
        let picks = sample_rows(model, bufs, &hf, &last, &keys, inv_t, greedy, params)?;
        let mut it = picks.into_iter();
        Ok(groups.iter().map(|(_, rows)| it.by_ref().take(rows.len()).collect()).collect())
    }

    /// Queues one decode step for the live rows `next` (indices into `live`), padded to its
    /// bucket: the inputs go up in one copy, the step's kernels run (replayed from the bucket's
    /// graph from its second step on, unless `enforce_eager`), and a copy of its tokens and
    /// log-probs back to the host is queued behind them ([`read_step`] waits for it). A row
    /// that was in the step before takes its token from that step's output on the device.
    #[allow(clippy::too_many_arguments)]
    fn queue_decode(&mut self, model: &DeviceModel, bufs: &mut DecodeBufs, live: &mut [Row], next: &[usize], out: &[Completion], inv_t: f32, greedy: bool, params: &SamplingParams) -> Result<Queued> {
        let cache = self.cache.as_ref().ok_or_else(|| CudaError::Request("no KV cache".into()))?;
        let gpu = &model.gpu;
        let (r, rows, stride, mb) = (next.len(), bucket(next.len()), bufs.rows, bufs.max_blocks);
        if rows > stride {
            return Err(CudaError::Request(format!("{r} live rows, decode buffers for {stride}")));
        }
        let scratch = cache.blocks as i32;
        let (step_no, turn) = (bufs.queued, bufs.queued % 2);
        let mut keys = vec![0u64; stride];
        let mut ints = vec![0i32; stride * (5 + mb)];
        let (ids, rest) = ints.split_at_mut(stride);
        let (from, rest) = rest.split_at_mut(stride);
        let (pos, rest) = rest.split_at_mut(stride);
        let (slots, rest) = rest.split_at_mut(stride);
        let (ctx, tables) = rest.split_at_mut(stride);
        let mut outs = Vec::with_capacity(r);
        for j in 0..rows {
            let Some(row) = next.get(j).map(|&i| &mut live[i]) else {
                // Padding: one position in the scratch block.
                from[j] = -1;
                slots[j] = scratch * BLOCK_SIZE as i32;
                ctx[j] = 1;
                tables[j * mb] = scratch;
                continue;
            };
            // The position of its last token, whose keys and values this step stores.
            let p = row.prompt_len + row.issued - 1;
            match row.last {
                Some((s, k)) if s + 1 == step_no => from[j] = k as i32,
                _ => {
                    from[j] = -1;
                    ids[j] = *out[row.out].token_ids.last().unwrap_or(&0) as i32;
                }
            }
            pos[j] = p as i32;
            slots[j] = slot(&row.table, p);
            ctx[j] = p as i32 + 1;
            for (b, &blk) in row.table.iter().enumerate() {
                tables[j * mb + b] = blk as i32;
            }
            keys[j] = step_key(row.key, row.issued);
            row.issued += 1;
            row.last = Some((step_no, j));
            outs.push(row.out);
        }
        let staged = &mut bufs.staged_in[turn];
        let host = staged.bytes_mut()?;
        let (kb, ib) = host.split_at_mut(8 * stride);
        for (d, k) in kb.chunks_exact_mut(8).zip(&keys) {
            d.copy_from_slice(&k.to_le_bytes());
        }
        for (d, v) in ib.chunks_exact_mut(4).zip(&ints) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        let len = DecodeBufs::input_bytes(stride, mb);
        gpu.upload_staged(bufs.input.ptr, staged, len)?;

        let sampling = SamplingKey { inv_t: inv_t.to_bits(), greedy, top_k: top_k(params, model.cfg.vocab_size), top_p: params.top_p.to_bits() };
        let idx = match bufs.graphs.iter().position(|g| g.rows == rows && g.sampling == sampling) {
            Some(i) => i,
            None => {
                bufs.graphs.push(GraphSlot { rows, sampling, steps: 0, graph: None });
                bufs.graphs.len() - 1
            }
        };
        let (steps, mut graph) = (bufs.graphs[idx].steps, bufs.graphs[idx].graph.take());
        let repeat = self.repeat_op;
        let step = |b: &DecodeBufs| queue_step(model, cache, b, rows, (inv_t, greedy, params), repeat);
        if graph.is_none() && steps > 0 && !self.enforce_eager && !bufs.eager {
            match gpu.capture(|| step(bufs)) {
                Ok(g) => {
                    graph = Some(g);
                    self.graphs_recorded += 1;
                }
                Err(e) => {
                    tracing::warn!("recording the decode step as a CUDA graph failed ({e}); this rollout decodes eagerly");
                    bufs.eager = true;
                }
            }
        }
        match &graph {
            // A graph exists only if recorded while graphs were on; another bucket's failed
            // recording since then (`bufs.eager`) turns them off for the rest of the call.
            Some(g) if !bufs.eager && !self.enforce_eager => {
                gpu.replay(g)?;
                self.graph_steps += 1;
            }
            _ => step(bufs)?,
        }
        bufs.graphs[idx].steps += 1;
        bufs.graphs[idx].graph = graph;
        gpu.download_staged(bufs.picked.ptr, &mut bufs.staged_out[turn], 8 * stride)?;
        bufs.queued += 1;
        Ok(Queued { outs, turn })
    }
}

/// Waits for a queued decode step's tokens and log-probs, in the order of its rows.
fn read_step(bufs: &mut DecodeBufs, step: &Queued) -> Result<Vec<(u32, f32)>> {
    let stride = bufs.rows;
    let host = bufs.staged_out[step.turn].bytes_mut()?;
    let word = |i: usize| u32::from_le_bytes([host[4 * i], host[4 * i + 1], host[4 * i + 2], host[4 * i + 3]]);
    Ok((0..step.outs.len()).map(|j| (word(j), f32::from_bits(word(stride + j)))).collect())
}

/// Queues one decode step of `r` rows (padding included) on `b`'s buffers: every layer
/// (attending the paged cache), the final norm, the LM head and sampling; `repeat` twice.
/// Allocates nothing and never waits, so it can be recorded as a graph.
fn queue_step(model: &DeviceModel, cache: &KvCache, b: &DecodeBufs, r: usize, (inv_t, greedy, params): (f32, bool, &SamplingParams), repeat: Option<DecodeOp>) -> Result<()> {
    let times = |op: DecodeOp| 1 + (repeat == Some(op)) as usize;
    let ops = model.ops();
    let (h, i, nh, kvh, hd, ldq) = model.dims();
    let v = model.cfg.vocab_size;
    let StepInputs { keys, ids, from, pos, slots, ctx, tables } = b.inputs();
    let lay = &model.layout;
    let eps = model.cfg.rms_norm_eps;
    let (mut x, mut y) = (b.x.ptr, b.y.ptr);
    // Each layer's attention rotates the new tokens and stores them in its cache first.
    let new = NewTokens { cos: model.rope_cos.ptr, sin: model.rope_sin.ptr, pos, slots };
    // Rows of the step before read their token where its sampler left it, in `picked`.
    for _ in 0..times(DecodeOp::Embed) {
        ops.embed(x, model.p(lay.embed), ids, Some((from, b.picked.ptr)), r, h)?;
    }
    // The separate norm's output, where norm_linear does not fuse.
    let scratch = (b.hn.ptr, b.rstd.ptr);
    // o_proj's and down's split partials, where linear_rows splits.
    let lin = (b.lin_part.ptr, b.lin_done.ptr);
    for (l, o) in lay.layers.iter().enumerate() {
        for _ in 0..times(DecodeOp::Qkv) {
            ops.norm_linear(b.qkv.ptr, x, (model.p(o.ln1), eps), model.p(o.w_qkv), o.b_qkv.map(|w| model.p(w)), (r, ldq, h), None, scratch)?;
        }
        let (kc, vc) = (cache.k.ptr.add(l * cache.layer_bytes), cache.v.ptr.add(l * cache.layer_bytes));
        for n in 0..times(DecodeOp::Attention) {
            // Once rope_kv_store has rotated q and k in place (when the kernel does not), the
            // repeat attends as a step whose new tokens are stored.
            let new = (n == 0 || ops.rope_inside_attention(hd)).then_some(&new);
            ops.decode_attention(b.att.ptr, b.part.ptr, b.done.ptr, b.qkv.ptr, kc, vc, tables, ctx, new, r, b.max_blocks, BLOCK_SIZE, (nh, kvh, hd, ldq), b.split)?;
        }
        for _ in 0..times(DecodeOp::OProj) {
            ops.linear_rows(b.xm.ptr, b.att.ptr, model.p(o.w_o), o.b_o.map(|w| model.p(w)), Some(x), (r, h, nh * hd), lin)?;
        }
        for _ in 0..times(DecodeOp::GateUp) {
            ops.norm_linear(b.mlp.ptr, b.xm.ptr, (model.p(o.ln2), eps), model.p(o.w_gu), o.b_gu.map(|w| model.p(w)), (r, i, h), Some(b.gu.ptr), scratch)?;
        }
        for _ in 0..times(DecodeOp::Down) {
            ops.linear_rows(y, b.mlp.ptr, model.p(o.w_down), o.b_down.map(|w| model.p(w)), Some(b.xm.ptr), (r, h, i), lin)?;
        }
        std::mem::swap(&mut x, &mut y);
    }
    for _ in 0..times(DecodeOp::FinalNorm) {
        ops.rmsnorm(b.hn.ptr, b.rstd.ptr, x, model.p(lay.norm), r, h, eps)?;
    }
    for _ in 0..times(DecodeOp::Logits) {
        ops.logits(b.hn.ptr, model.p(lay.head()), b.z.ptr, r, v, h)?;
    }
    for _ in 0..times(DecodeOp::Sample) {
        ops.sample(b.picked.ptr, b.picked.ptr.add(4 * b.rows), b.z.ptr, keys, r, v, inv_t, greedy, top_k(params, v), params.top_p)?;
    }
    Ok(())
}

/// The sampling kernel's top-k: 0 (off) when it would keep the whole vocabulary of `v`.
fn top_k(params: &SamplingParams, v: usize) -> usize {
    if params.top_k >= v {
        0
    } else {
        params.top_k
    }
}

/// The cache slot of position `pos` of a sequence with block table `table`.
fn slot(table: &[u32], pos: usize) -> i32 {
    (table[pos / BLOCK_SIZE] as usize * BLOCK_SIZE + pos % BLOCK_SIZE) as i32
}

/// The random key of a row's `step`-th token (splitmix64-style mixing, the kernel mixes again).
fn step_key(key: u64, step: usize) -> u64 {
    let mut z = (step as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    key ^ z ^ (z >> 31)
}

/// Samples a token for each of `rows` (rows of `hf`, each with its key), `bufs.rows` at a
/// time through the decode buffers' hidden rows and logits: a prefill's sampling needs no
/// logits of its own (up to 1024 rows × the vocabulary in f32, over 600 MB for Qwen2's).
/// Not into `bufs.picked`, where the next decode step reads the last one's tokens.
#[allow(clippy::too_many_arguments)]
fn sample_rows(model: &DeviceModel, bufs: &DecodeBufs, hf: &Buf, rows: &[i32], keys: &[u64], inv_t: f32, greedy: bool, params: &SamplingParams) -> Result<Vec<(u32, f32)>> {
    let gpu = &model.gpu;
    let ops = model.ops();
    let (h, v) = (model.cfg.hidden_size, model.cfg.vocab_size);
    let r = rows.len();
    let rows_d = gpu.upload_new_or(rows, "rows", FIX_PREFILL)?;
    let keys_d = gpu.upload_new_or(keys, "sampling keys", FIX_PREFILL)?;
    let (tok, lp) = (gpu.alloc(r * 4, "sampled tokens", FIX_PREFILL)?, gpu.alloc(r * 4, "sampled tokens", FIX_PREFILL)?);
    for at in (0..r).step_by(bufs.rows.max(1)) {
        let c = bufs.rows.min(r - at);
        ops.gather_rows(bufs.hn.ptr, hf.ptr, rows_d.ptr.add(4 * at), c, h)?;
        ops.logits(bufs.hn.ptr, model.p(model.layout.head()), bufs.z.ptr, c, v, h)?;
        ops.sample(tok.ptr.add(4 * at), lp.ptr.add(4 * at), bufs.z.ptr, keys_d.ptr.add(8 * at), c, v, inv_t, greedy, top_k(params, v), params.top_p)?;
    }
    let toks: Vec<i32> = gpu.to_vec(tok.ptr, r)?;
    let lps: Vec<f32> = gpu.to_vec(lp.ptr, r)?;
    Ok(toks.into_iter().map(|t| t as u32).zip(lps).collect())
}

/// Appends a sampled token; true when the sequence is finished.
fn record(c: &mut Completion, tok: u32, lp: f32, params: &SamplingParams, detok: Option<&dyn Detokenize>, longest_stop: usize) -> bool {
    c.token_ids.push(tok);
    c.logprobs.push(lp);
    if params.stop_token_ids.contains(&tok) {
        c.finish_reason = FinishReason::StopToken(tok);
        return true;
    }
    if let (Some(d), false) = (detok, params.stop_strings.is_empty()) {
        // Decode only a tail long enough to hold any stop string (as the CPU engine).
        let tail = &c.token_ids[c.token_ids.len().saturating_sub(longest_stop + 8)..];
        let text = d.detokenize(tail);
        if let Some(s) = params.stop_strings.iter().find(|s| text.contains(s.as_str())) {
            c.finish_reason = FinishReason::StopString(s.clone());
            return true;
        }
    }
    c.token_ids.len() >= params.max_new_for(c.prompt_index)
}

fn release(pool: &mut Pool, row: &Row) {
    for &b in &row.table {
        pool.release(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_blocks_return_to_the_pool_only_when_every_holder_is_done() {
        let mut p = Pool::new(3);
        let a = p.take().expect("free block");
        p.share(a);
        p.release(a);
        assert_eq!(p.free.len(), 2, "still held by one row");
        p.release(a);
        assert_eq!(p.free.len(), 3);
        assert_eq!(slot(&[5, 2], 17), (2 * BLOCK_SIZE + 1) as i32);
        assert_ne!(step_key(1, 0), step_key(1, 1));
    }

    #[test]
    fn a_prefill_reserve_covers_what_a_pass_allocates() {
        // What `hidden_bytes` counts for a pass against what the emulator saw allocated: never
        // less, and more only by the attention tiles a sequence shorter than a tile leaves out.
        let gpu = crate::Gpu::open(crate::GpuKind::Emulated).expect("emulator");
        let dir = std::env::var_os("REINFORGE_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"))
            .join("models");
        for (name, dt) in [("tiny-llama", crate::DType::Bf16), ("tiny-qwen2", crate::DType::F32)] {
            let m = DeviceModel::load(&gpu, &dir.join(name), dt, false).expect("fixture model");
            let prompts: Vec<Vec<u32>> = [3usize, 17, 40, 1].iter().map(|&n| (0..n as u32).map(|t| 5 + t % 50).collect()).collect();
            let seqs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            let tokens: usize = prompts.iter().map(Vec::len).sum();
            let batch = Packed::new(&seqs, m.cfg.vocab_size, m.cfg.max_position_embeddings).expect("batch");
            let base = gpu.allocated();
            gpu.reset_peak();
            let shape = m.shape(&batch).expect("shape");
            drop(m.hidden(&shape, None).expect("pass"));
            drop(shape);
            let seen = (gpu.peak_allocated() - base) as usize;
            let counted = m.hidden_bytes(tokens);
            assert!(counted >= seen && counted <= seen + 24 * tokens, "{name}: counted {counted} B, allocated {seen} B");
            let e = Rollout::new(0.5);
            assert!(e.prefill_reserve(&m, &prompts) >= counted);
        }
    }
}
