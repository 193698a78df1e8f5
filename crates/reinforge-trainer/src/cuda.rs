//! The roles on the CUDA engine (`trainer.device = "cuda"`, or `cuda-emu` for its emulator):
//! the same worker-group traits as [`crate::roles`], so the controller loop, checkpoints and
//! metrics do not know which engine runs.
//!
//! Sequences go to the device packed (prompt and response without padding); the head returns
//! one log-prob (and entropy) or value per response token. The RL losses stay in
//! `reinforge-algos` on the host: each micro-batch's per-token outputs become leaves of a small
//! CPU autodiff graph, the loss is the CPU engine's own code, and its gradients with respect to
//! those leaves go back to the device for the backward pass. Actor and rollout share one copy
//! of the weights on the device (the hybrid engine: weight sync costs nothing). Data-parallel
//! ranks sum their gradients through NCCL where every rank has it (`cluster.gpu_collectives`),
//! else through the host's TCP group.

use crate::build::{actor_adapter, actor_settings, optimizer_state};
use crate::config::{RolloutConfig, TrainConfig};
use crate::error::TrainError;
use crate::roles::{
    agg_mode, optim, policy_agg, to_mat, value_loss_config, value_micro_loss, ActorGroup, ActorMiniBatch, ActorSettings, CriticGroup, DeviceWeights, MicroBatching, SharedPacking,
    HostedCritic, HostedPolicy, MiniNorm, ModelState, PolicyGroup, PolicyLossCtx, RefGroup, RolloutEngine, RolloutGroup, SeqBatch,
};
use burn::tensor::{Device, Tensor, TensorData};
use reinforge_algos::{Mat, ValueLossConfig};
use reinforge_checkpoint::Checkpoint;
use reinforge_cluster::collective::StarGroup;
use reinforge_cuda::nccl::{Comm, UniqueId};
use reinforge_cuda::{DType, DeviceModel, GradReduce, Gpu, GpuKind, Head, Packed, RowGrads, RowOut, Rollout, TrainState};
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{Adapter, Completion, DeviceSpec, HostTensor, LoraConfig, ModelConfig, SamplingParams};
use reinforge_metrics::Metrics;
use reinforge_tokenizer::{ChatTokenizer, Tokenizer};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// The device of `trainer.device`, opened once per process and shared by its roles (a rank
/// hosting actor and critic, or a single-process run, puts every role on it).
pub fn open_gpu(cfg: &TrainConfig) -> Result<Arc<Gpu>, TrainError> {
    static OPEN: std::sync::Mutex<Option<(GpuKind, Arc<Gpu>)>> = std::sync::Mutex::new(None);
    let kind = match cfg.trainer.device.parse::<DeviceSpec>()? {
        DeviceSpec::Cuda(i) => GpuKind::Cuda(i),
        DeviceSpec::CudaEmulated => GpuKind::Emulated,
        DeviceSpec::Cpu => return Err(TrainError::Other("trainer.device = cpu does not use the CUDA engine".into())),
    };
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, gpu)) = open.as_ref().filter(|(k, _)| *k == kind) {
        return Ok(Arc::clone(gpu));
    }
    let gpu = Gpu::open(kind)?;
    tracing::info!(device = %gpu.info.name, memory_gib = gpu.info.total_mem as f64 / (1u64 << 30) as f64, "CUDA engine");
    *open = Some((kind, Arc::clone(&gpu)));
    Ok(gpu)
}

/// The storage type a `trainer.dtype` name means on the CUDA engine (`auto`: bf16); `None`
/// for a name it does not know (the config refuses those).
pub fn dtype_named(name: &str) -> Option<DType> {
    match name {
        "auto" | "bf16" | "bfloat16" => Some(DType::Bf16),
        "f32" | "float32" | "fp32" => Some(DType::F32),
        _ => None,
    }
}

/// The storage type of `trainer.dtype` on the CUDA engine.
pub fn dtype(cfg: &TrainConfig) -> Result<DType, TrainError> {
    dtype_named(&cfg.trainer.dtype).ok_or_else(|| TrainError::Other(format!("trainer.dtype = `{}`: use `auto`, `bf16` or `f32`", cfg.trainer.dtype)))
}

/// The policy's weights by HF name: the checkpoint's when resuming (its frozen base, under
/// LoRA), else the model directory's, else (`actor.init = "random"`) the CPU engine's random
/// init of the same seed.
fn base_tensors(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<HashMap<String, HostTensor>, TrainError> {
    Ok(match resumed {
        Some(ck) => WeightSet::load_base_dir(&ck.dir.join("actor"))?.into_map(),
        None if cfg.actor.init == "random" => reinforge_engine::model::random_hf_tensors(&ModelConfig::from_dir(model_dir)?, cfg.actor.init_seed),
        None => WeightSet::load_dir(model_dir)?.into_map(),
    })
}

/// The policy's base weights and, with `actor.lora_rank` (or a LoRA checkpoint, or
/// `actor.lora_adapter_path`), its adapter, chosen and checked as on the CPU engine.
fn policy_tensors(cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<(HashMap<String, HostTensor>, Option<Adapter>), TrainError> {
    let adapter = actor_adapter(cfg, &ModelConfig::from_dir(model_dir)?, resumed)?.map(|(a, _)| a);
    Ok((base_tensors(cfg, model_dir, resumed)?, adapter))
}

/// Sequences of a [`SeqBatch`] packed for the device, with the rows that predict each response
/// token and where each goes in the `[rows, response_len]` matrices the losses use.
struct PackedRows {
    packed: Packed,
    /// Packed row that predicts each response token, in (sequence, token) order.
    rows: Vec<usize>,
    /// The response tokens themselves.
    targets: Vec<u32>,
    /// Index into the `[n, response_len]` matrix of each of them.
    cells: Vec<usize>,
    /// Sequences in it.
    n: usize,
}

impl PackedRows {
    /// `which` rows of `batch`, one sequence each; with `share`, the rows with the same prompt
    /// (two or more, a prompt of two tokens or more) as a copy of the prompt without its last
    /// token, each continued by that token and its response (the kernels' shared prefixes;
    /// copies as [`SharedPacking`] makes them): every predicting row stays a row of its own
    /// sample.
    fn new(batch: &SeqBatch, which: &[usize], cfg: &ModelConfig, share: bool) -> Result<PackedRows, TrainError> {
        let r = batch.response_len;
        let mut parts = Vec::with_capacity(which.len());
        for &b in which {
            let (prompt, len) = batch.prompt_and_response(b);
            if prompt.is_empty() {
                return Err(TrainError::Other(format!("sequence {b} has an empty prompt: nothing predicts its first response token")));
            }
            let response = batch.ids[b][batch.prompt_len..batch.prompt_len + len].to_vec();
            parts.push((prompt, response));
        }
        let groups: Vec<Vec<usize>> = if share {
            let mut packing = SharedPacking::new(batch.response_len);
            for (i, (prompt, response)) in parts.iter().enumerate() {
                packing.push(i, prompt, response.len());
            }
            packing.groups()
        } else {
            (0..parts.len()).map(|i| vec![i]).collect()
        };
        let mut seqs: Vec<Vec<u32>> = Vec::new();
        let mut prefix = Vec::new();
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        let mut cells = Vec::new();
        let mut start = 0;
        for g in &groups {
            let prompt = &parts[g[0]].0;
            let shared = g.len() > 1 && prompt.len() > 1;
            let head = if shared { prompt.len() - 1 } else { 0 };
            let p = seqs.len();
            if shared {
                seqs.push(prompt[..head].to_vec());
                prefix.push(None);
                start += head;
            }
            for &i in g {
                let response = &parts[i].1;
                // Row `k` of this sequence predicts token `k + 1`: the first response token
                // comes after the prompt's last (kept in every sample's own rows).
                let own = &prompt[head..];
                for (j, &t) in response.iter().enumerate() {
                    rows.push(start + own.len() + j - 1);
                    targets.push(t);
                    cells.push(i * r + j);
                }
                start += own.len() + response.len();
                seqs.push([own, response.as_slice()].concat());
                prefix.push(shared.then_some(p));
            }
        }
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let packed = Packed::with_prefixes(&refs, &prefix, cfg.vocab_size, cfg.max_position_embeddings)?;
        Ok(PackedRows { packed, rows, targets, cells, n: which.len() })
    }

    /// Per-token values laid out as `[n, response_len]` (zeros where there is no token).
    fn scatter(&self, values: &[f32], response_len: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.n * response_len];
        for (&c, &v) in self.cells.iter().zip(values) {
            out[c] = v;
        }
        out
    }

    /// The entries of a `[n, response_len]` matrix at this batch's tokens, in row order.
    fn gather(&self, m: &[f64]) -> Vec<f32> {
        self.cells.iter().map(|&c| m[c] as f32).collect()
    }
}

/// Scores `batch` in micro-batches by `micro`: log-probs under `lm_temperature`, or the value
/// head's values when it is `None`; `share` packs each prompt once for its samples.
fn score_batch(model: &DeviceModel, batch: &SeqBatch, micro: MicroBatching, lm_temperature: Option<f64>, share: bool) -> Result<Mat, TrainError> {
    let mut data = Vec::with_capacity(batch.len() * batch.response_len);
    for mb in batch.all_micro_batches(micro) {
        let p = PackedRows::new(batch, &mb, &model.cfg, share)?;
        let head = match lm_temperature {
            Some(temperature) => Head::Lm { targets: &p.targets, temperature },
            None => Head::Value,
        };
        let out = model.score(&p.packed, &p.rows, head)?;
        data.extend(p.scatter(&out.value, batch.response_len).into_iter().map(f64::from));
    }
    Ok(Mat::new(batch.len(), batch.response_len, data)?)
}

/// A `[n, r]` leaf on the CPU autodiff device, whose gradient the loss's backward keeps.
fn leaf(data: Vec<f32>, n: usize, r: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(data, [n, r]), device).require_grad()
}

/// `t`'s gradient after `grads` (zeros when the loss did not depend on it).
fn grad_of(t: &Tensor<2>, grads: &burn::tensor::Gradients) -> Result<Vec<f64>, TrainError> {
    match t.grad(grads) {
        Some(g) => Ok(to_mat(g)?.data().to_vec()),
        None => {
            let [n, r] = t.dims();
            Ok(vec![0.0; n * r])
        }
    }
}

/// How a role's data-parallel group sums gradients: settled with every rank of the group at its
/// first step (all ranks must take the same path).
pub enum GpuReduce {
    /// Not settled yet; NCCL may be tried (`cluster.gpu_collectives = "nccl"`).
    Undecided {
        /// Whether the config allows NCCL.
        allow_nccl: bool,
        /// How long ranks wait for each other to form the communicator.
        timeout: std::time::Duration,
    },
    /// On the GPUs.
    Nccl(Comm),
    /// Through the host's TCP group (the emulator, NCCL missing on a rank, or `host`).
    Host,
}

impl GpuReduce {
    /// Undecided, allowing NCCL as `cfg` says.
    pub fn new(cfg: &TrainConfig) -> GpuReduce {
        GpuReduce::Undecided { allow_nccl: cfg.cluster.gpu_collectives == "nccl", timeout: std::time::Duration::from_secs_f64(cfg.cluster.nccl_timeout_s) }
    }
}

/// Settles how `g` sums gradients: NCCL when every rank can load it and make the communicator
/// (rank 0's unique id reaches the others through `g`), else the host.
fn settle(gpu: &Arc<Gpu>, g: &mut StarGroup, allow_nccl: bool, timeout: std::time::Duration) -> Result<GpuReduce, TrainError> {
    let wire = |e: reinforge_cluster::wire::WireError| TrainError::Other(format!("gradient group: {e}"));
    let local = allow_nccl && reinforge_cuda::nccl::usable_on(gpu);
    let mut able = [if local { 1.0f32 } else { 0.0 }];
    g.all_reduce_sum(&mut able).map_err(wire)?;
    if (able[0] as usize) < g.world() {
        if allow_nccl && !gpu.info.emulated && g.rank() == 0 {
            tracing::warn!("NCCL is missing on {} of {} ranks: gradients are summed through the host (install nvidia-nccl-cu13 where it is missing)", g.world() - able[0] as usize, g.world());
        }
        return Ok(GpuReduce::Host);
    }
    // The id's bytes are small integers: summed into zeros, they arrive exactly. The 129th
    // value says rank 0 could not make one, so that every rank falls back together.
    let mut id = [0f32; 129];
    if g.rank() == 0 {
        match reinforge_cuda::nccl::unique_id() {
            Ok(made) => {
                for (f, b) in id.iter_mut().zip(made.internal) {
                    *f = f32::from(b);
                }
            }
            Err(e) => {
                tracing::warn!("NCCL could not make a unique id ({e}): gradients are summed through the host");
                id[128] = 1.0;
            }
        }
    }
    g.all_reduce_sum(&mut id).map_err(wire)?;
    if id[128] != 0.0 {
        return Ok(GpuReduce::Host);
    }
    let id = UniqueId { internal: std::array::from_fn(|i| id[i] as u8) };
    let comm = Comm::init(gpu, &id, g.rank(), g.world(), timeout);
    let mut ok = [if comm.is_ok() { 1.0f32 } else { 0.0 }];
    g.all_reduce_sum(&mut ok).map_err(wire)?;
    match comm {
        Ok(c) if ok[0] as usize == g.world() => {
            if g.rank() == 0 {
                tracing::info!("gradients are summed through NCCL over {} GPUs", g.world());
            }
            Ok(GpuReduce::Nccl(c))
        }
        Ok(_) => Ok(GpuReduce::Host),
        Err(e) => {
            tracing::warn!("NCCL could not make the communicator on rank {} ({e}): gradients are summed through the host", g.rank());
            Ok(GpuReduce::Host)
        }
    }
}

/// Ends an optimizer step, all-reducing the gradient over `collective` when there is one.
fn finish(state: &mut TrainState, collective: Option<&mut StarGroup>, reduce: &mut GpuReduce, lr: f64, micro: usize) -> Result<reinforge_engine::StepStats, TrainError> {
    let Some(g) = collective else {
        return Ok(state.finish(lr, micro, None)?);
    };
    if let GpuReduce::Undecided { allow_nccl, timeout } = *reduce {
        *reduce = if g.world() > 1 { settle(&state.model.gpu, g, allow_nccl, timeout)? } else { GpuReduce::Host };
    }
    Ok(match reduce {
        GpuReduce::Nccl(comm) => state.finish(lr, micro, Some(GradReduce::Nccl(comm)))?,
        _ => {
            let mut sum = |buf: &mut [f32]| g.all_reduce_sum(buf).map_err(|e| e.to_string());
            state.finish(lr, micro, Some(GradReduce::Host(&mut sum)))?
        }
    })
}

/// Actor and rollout on one device, sharing the weights.
pub struct CudaActorRollout {
    /// Weights, gradients and AdamW state on the device.
    pub state: TrainState,
    /// The rollout engine (paged KV cache), reading `state`'s weights.
    pub engine: Rollout,
    /// Decodes text for stop strings.
    pub tokenizer: Tokenizer,
    /// Update settings.
    pub settings: ActorSettings,
    /// The data-parallel group this rank trains in (`None`: a single process).
    pub collective: Option<StarGroup>,
    /// How that group sums gradients (settled at its first step).
    pub reduce: GpuReduce,
    /// Where the losses are differentiated (the CPU, with autodiff).
    loss_device: Device,
    /// Highest device memory in use seen so far (sampled while activations are alive).
    peak_bytes: u64,
    /// Under LoRA, the adapter's settings, and the merged copy of the weights that rollout
    /// decodes with and weight sync sends (refreshed after every update).
    lora: Option<(LoraConfig, DeviceModel)>,
}

/// The CUDA rollout engine as `[rollout]` sets it up.
fn rollout_engine(r: &RolloutConfig) -> Rollout {
    Rollout::new(r.gpu_memory_utilization).eager(r.enforce_eager).overlapped(r.async_scheduling).limited(r.max_num_seqs, r.max_num_batched_tokens)
}

impl CudaActorRollout {
    /// The actor on `gpu`, optimizer state restored from the checkpoint when resuming.
    pub fn build(gpu: &Arc<Gpu>, cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Self, TrainError> {
        let mcfg = ModelConfig::from_dir(model_dir)?;
        let a = &cfg.actor;
        let (mut tensors, adapter) = policy_tensors(cfg, model_dir, resumed)?;
        let (dt, opt) = (dtype(cfg)?, optim(a.weight_decay, a.betas, a.grad_clip));
        let (mut state, lora) = match adapter {
            Some(adapter) => {
                let all: usize = tensors.values().map(|t| t.data.len()).sum();
                let trained: usize = adapter.tensors.values().map(|t| t.data.len()).sum();
                let c = adapter.config;
                tracing::info!("LoRA rank {} (alpha {}) on {}: {trained} of {} parameters train ({:.2}%)", c.rank, c.alpha, c.targets.join(", "), all + trained, 100.0 * trained as f64 / (all + trained).max(1) as f64);
                tensors.extend(adapter.tensors);
                let mut w = WeightSet::from_map("policy weights", tensors);
                let state = TrainState::with_lora(gpu, mcfg, &c, &mut w, dt, opt, a.gradient_checkpointing)?;
                let merged = state.model.merged()?;
                (state, Some((c, merged)))
            }
            None => (TrainState::from_weights(gpu, mcfg, &mut WeightSet::from_map("policy weights", tensors), dt, false, opt, a.gradient_checkpointing)?, None),
        };
        if let Some(ck) = resumed {
            state.load_optimizer_state(&optimizer_state(ck, "actor")?)?;
        }
        Ok(CudaActorRollout {
            lora,
            state,
            engine: rollout_engine(&cfg.rollout),
            tokenizer: ChatTokenizer::load_from_dir(model_dir)?.tokenizer().clone(),
            settings: actor_settings(cfg)?,
            collective: None,
            reduce: GpuReduce::new(cfg),
            loss_device: DeviceSpec::Cpu.training_device(false)?,
            peak_bytes: 0,
        })
    }
}

impl RolloutGroup for CudaActorRollout {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        let model = self.lora.as_ref().map_or(&self.state.model, |(_, merged)| merged);
        let out = self.engine.generate(model, prompts, params, Some(&self.tokenizer));
        // The cache goes back before training needs the memory (verl's free_cache_engine).
        self.engine.release_cache();
        Ok(out?.0)
    }
}

impl ActorGroup for CudaActorRollout {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        score_batch(&self.state.model, batch, micro, Some(self.settings.temperature), self.settings.share_prompts)
    }

    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError> {
        let s = self.settings.clone();
        let micro_rows = batch.micro_batches(mini.rows, s.micro);
        let norm = mini.norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, mini.rows));
        let (agg, policy_cfg) = policy_agg(&s, norm);
        let ctx = PolicyLossCtx { batch, mini, settings: &s, policy: &policy_cfg, agg: &agg, norm, device: &self.loss_device };
        let mut sums = Metrics::new();
        let r = batch.response_len;
        let started = std::time::Instant::now();
        let gpu = Arc::clone(&self.state.model.gpu);
        // The update's own high-water mark (verl's torch.cuda.max_memory_allocated, counted by
        // our allocator: the forward, the backward and the optimizer step, not the CUDA
        // context or what the released rollout cache held before).
        gpu.reset_peak();
        let mut flops = 0.0;
        self.state.zero_grads()?;
        for rows in &micro_rows {
            let p = PackedRows::new(batch, rows, &self.state.model.cfg, s.share_prompts)?;
            flops += reinforge_cuda::model::train_flops(&self.state.model.cfg, &self.state.model.layout, p.packed.contexts());
            let head = Head::Lm { targets: &p.targets, temperature: s.temperature };
            self.state.micro(&p.packed, &p.rows, head, |out: &RowOut| {
                let lp = leaf(p.scatter(&out.value, r), rows.len(), r, ctx.device);
                let ent = leaf(p.scatter(&out.entropy, r), rows.len(), r, ctx.device);
                let loss = ctx.micro_loss(rows, lp.clone(), Some(ent.clone()), &mut sums)?;
                let grads = loss.backward();
                Ok::<_, TrainError>(RowGrads { value: p.gather(&grad_of(&lp, &grads)?), entropy: p.gather(&grad_of(&ent, &grads)?) })
            })?;
        }
        let stats = finish(&mut self.state, self.collective.as_mut(), &mut self.reduce, lr, micro_rows.len())?;
        if let Some((_, merged)) = &self.lora {
            self.state.model.merge_into(merged)?;
        }
        sums.insert("actor/grad_norm", stats.grad_norm);
        sums.insert("actor/lr", lr);
        // verl's names: the update's model FLOPs utilisation against the GPU's dense bf16
        // peak (none on an unknown GPU, the emulator, or f32 weights), and the device memory
        // high-water mark so far, in GiB as torch reports it.
        self.peak_bytes = self.peak_bytes.max(gpu.peak_allocated());
        if let Some((_, peak_flops)) = gpu.info.peaks().filter(|_| self.state.model.dt == DType::Bf16) {
            sums.insert("perf/mfu/actor", flops / started.elapsed().as_secs_f64().max(1e-9) / peak_flops);
        }
        sums.insert("perf/max_memory_allocated_gb", self.peak_bytes as f64 / (1u64 << 30) as f64);
        Ok(sums)
    }
}

impl CudaActorRollout {
    /// What rollout decodes with: the weights AdamW has just written, or under LoRA their
    /// merged copy (refreshed by every update).
    fn rollout_model(&self) -> &DeviceModel {
        self.lora.as_ref().map_or(&self.state.model, |(_, merged)| merged)
    }
}

impl PolicyGroup for CudaActorRollout {
    /// Nothing to do: the rollout engine reads the weights AdamW has just written (or their
    /// merged copy, which the update refreshed).
    fn sync_rollout(&mut self) -> Result<(), TrainError> {
        Ok(())
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        let lora = self.lora.as_ref().map(|(c, _)| c.clone());
        Ok(ModelState { tensors: self.state.to_hf_tensors()?, config_json: self.state.model.cfg.to_hf_json(), optimizer: self.state.optimizer_state()?, lora })
    }
}

impl HostedPolicy for CudaActorRollout {
    /// A plain model's weights (merged under LoRA), for rollout engines of their own.
    fn weights(&mut self) -> Result<(BTreeMap<String, HostTensor>, serde_json::Value), TrainError> {
        let tensors = match &self.lora {
            Some((_, merged)) => merged.to_hf_tensors()?,
            None => self.state.to_hf_tensors()?,
        };
        Ok((tensors, self.state.model.cfg.to_hf_json()))
    }

    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup> {
        std::mem::replace(&mut self.collective, g)
    }

    fn device_weights(&self) -> Option<DeviceWeights> {
        Some(DeviceWeights::of(self.rollout_model()))
    }
}

/// A rollout engine on the device with weights of its own (a rollout rank not colocated with
/// the actor): takes the actor's weights after each update.
pub struct CudaRollout {
    /// Its weights.
    pub model: DeviceModel,
    /// The paged-KV engine.
    pub engine: Rollout,
    /// Decodes text for stop strings.
    pub tokenizer: Tokenizer,
}

impl CudaRollout {
    /// The policy's current weights (the checkpoint's when resuming) on `gpu`.
    pub fn build(gpu: &Arc<Gpu>, cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Self, TrainError> {
        // Under LoRA, the policy merged on the host (`merge_into` skips a fresh adapter's zero `B`).
        let (mut tensors, adapter) = policy_tensors(cfg, model_dir, resumed)?;
        if let Some(a) = adapter {
            a.merge_into(&mut tensors)?;
        }
        let mut w = WeightSet::from_map("rollout weights", tensors);
        Ok(CudaRollout {
            model: DeviceModel::from_weights(gpu, ModelConfig::from_dir(model_dir)?, &mut w, dtype(cfg)?, false)?,
            engine: rollout_engine(&cfg.rollout),
            tokenizer: ChatTokenizer::load_from_dir(model_dir)?.tokenizer().clone(),
        })
    }
}

impl RolloutGroup for CudaRollout {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        Ok(self.engine.generate(&self.model, prompts, params, Some(&self.tokenizer))?.0)
    }
}

impl RolloutEngine for CudaRollout {
    fn set_weights(&mut self, tensors: BTreeMap<String, HostTensor>) -> Result<(), TrainError> {
        Ok(self.model.load_tensors(tensors)?)
    }

    fn device_weights(&self) -> Option<DeviceWeights> {
        Some(DeviceWeights::of(&self.model))
    }
}

/// The frozen reference policy on the device.
pub struct CudaRef {
    /// Its weights.
    pub model: DeviceModel,
    /// The actor's temperature, so log-probs are comparable.
    pub temperature: f64,
    /// Each prompt packed once for its samples (`actor.share_prompts`).
    pub share_prompts: bool,
}

impl CudaRef {
    /// The initial policy (also after a resume), in the run's storage type.
    pub fn build(gpu: &Arc<Gpu>, cfg: &TrainConfig, model_dir: &Path) -> Result<Self, TrainError> {
        let mut w = WeightSet::from_map("reference weights", base_tensors(cfg, model_dir, None)?);
        let model = DeviceModel::from_weights(gpu, ModelConfig::from_dir(model_dir)?, &mut w, dtype(cfg)?, false)?;
        Ok(CudaRef { model, temperature: cfg.rollout.logprob_temperature(), share_prompts: cfg.actor.share_prompts })
    }
}

impl RefGroup for CudaRef {
    fn logprobs(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        score_batch(&self.model, batch, micro, Some(self.temperature), self.share_prompts)
    }
}

/// The critic on the device: the backbone with a value head (`score.weight`).
pub struct CudaCritic {
    /// Weights, gradients and AdamW state.
    pub state: TrainState,
    /// How the update's sequences form micro-batches.
    pub micro: MicroBatching,
    /// Each prompt packed once for its samples (`actor.share_prompts`; the value head reads
    /// the same rows either way).
    pub share_prompts: bool,
    /// Value-loss settings.
    pub loss: ValueLossConfig,
    /// The data-parallel group this rank trains in.
    pub collective: Option<StarGroup>,
    /// How that group sums gradients (settled at its first step).
    pub reduce: GpuReduce,
    loss_device: Device,
}

impl CudaCritic {
    /// `critic.model`, else the policy's backbone with a zero value head (as the CPU engine
    /// starts it); the checkpoint's critic when resuming.
    pub fn build(gpu: &Arc<Gpu>, cfg: &TrainConfig, model_dir: &Path, resumed: Option<&Checkpoint>) -> Result<Self, TrainError> {
        let (a, c) = (&cfg.actor, &cfg.critic);
        let (dir, mut tensors) = match (resumed, &c.model) {
            (Some(ck), _) => (ck.dir.join("critic"), WeightSet::load_dir(&ck.dir.join("critic"))?.into_map()),
            (None, Some(m)) => {
                let d = reinforge_assets::resolve_model(m)?;
                let t = WeightSet::load_dir(&d)?.into_map();
                (d, t)
            }
            (None, None) => (model_dir.to_path_buf(), base_tensors(cfg, model_dir, None)?),
        };
        let mcfg = ModelConfig::from_dir(&dir)?;
        let h = mcfg.hidden_size;
        tensors.entry("score.weight".into()).or_insert_with(|| HostTensor { shape: vec![1, h], data: vec![0.0; h] });
        // The layout keeps an untied LM head's slot, unused by a value model: a critic from a
        // directory without one gets zeros there.
        if !mcfg.tie_word_embeddings {
            let v = mcfg.vocab_size;
            tensors.entry("lm_head.weight".into()).or_insert_with(|| HostTensor { shape: vec![v, h], data: vec![0.0; v * h] });
        }
        let mut w = WeightSet::from_map("critic weights", tensors);
        let mut state = TrainState::from_weights(gpu, mcfg, &mut w, dtype(cfg)?, true, optim(c.weight_decay, a.betas, c.grad_clip), a.gradient_checkpointing)?;
        if let Some(ck) = resumed {
            state.load_optimizer_state(&optimizer_state(ck, "critic")?)?;
        }
        Ok(CudaCritic {
            state,
            micro: cfg.critic_micro(),
            share_prompts: a.share_prompts,
            loss: ValueLossConfig { cliprange_value: c.cliprange_value, loss_agg_mode: agg_mode(&c.loss_agg_mode)?, agg: Default::default() },
            collective: None,
            reduce: GpuReduce::new(cfg),
            loss_device: DeviceSpec::Cpu.training_device(false)?,
        })
    }
}

impl CriticGroup for CudaCritic {
    fn values(&mut self, batch: &SeqBatch, micro: MicroBatching) -> Result<Mat, TrainError> {
        score_batch(&self.state.model, batch, micro, None, self.share_prompts)
    }

    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64, norm: Option<MiniNorm>) -> Result<Metrics, TrainError> {
        let micro_rows = batch.micro_batches(rows, self.micro);
        let norm = norm.unwrap_or_else(|| MiniNorm::of(&batch.response_mask, rows));
        let cfg = value_loss_config(&self.loss, norm);
        let r = batch.response_len;
        let mut m = Metrics::new();
        self.state.zero_grads()?;
        for mr in &micro_rows {
            let p = PackedRows::new(batch, mr, &self.state.model.cfg, self.share_prompts)?;
            let device = &self.loss_device;
            self.state.micro(&p.packed, &p.rows, Head::Value, |out: &RowOut| {
                let vpred = leaf(p.scatter(&out.value, r), mr.len(), r, device);
                let loss = value_micro_loss(vpred.clone(), batch, mr, values, returns, &cfg, norm, device, &mut m)?;
                let grads = loss.backward();
                Ok::<_, TrainError>(RowGrads { value: p.gather(&grad_of(&vpred, &grads)?), entropy: Vec::new() })
            })?;
        }
        let stats = finish(&mut self.state, self.collective.as_mut(), &mut self.reduce, lr, micro_rows.len())?;
        m.insert("critic/grad_norm", stats.grad_norm);
        m.insert("critic/lr", lr);
        Ok(m)
    }

    fn state(&mut self) -> Result<ModelState, TrainError> {
        // The untied LM head stays in the critic's weights, as the CPU engine's value model
        // keeps it: each engine resumes the other's critic.
        Ok(ModelState { tensors: self.state.to_hf_tensors()?, config_json: self.state.model.cfg.to_hf_json(), optimizer: self.state.optimizer_state()?, lora: None })
    }
}

impl HostedCritic for CudaCritic {
    fn swap_collective(&mut self, g: Option<StarGroup>) -> Option<StarGroup> {
        std::mem::replace(&mut self.collective, g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scored row's next token is its target, and cells name each (sample, token) once.
    fn consistent(p: &PackedRows, batch: &SeqBatch, which: &[usize]) {
        for ((&row, &t), &c) in p.rows.iter().zip(&p.targets).zip(&p.cells) {
            assert_eq!(p.packed.ids[row + 1], t, "row {row} does not predict its target");
            let (i, j) = (c / batch.response_len, c % batch.response_len);
            assert_eq!(batch.ids[which[i]][batch.prompt_len + j], t);
        }
        let mut cells = p.cells.clone();
        cells.sort_unstable();
        cells.dedup();
        assert_eq!(cells.len(), p.cells.len());
    }

    #[test]
    fn shared_prompts_get_another_copy_when_their_samples_would_overload_one() {
        let cfg = ModelConfig { vocab_size: 100, max_position_embeddings: 64, ..ModelConfig::from_dir(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny-arith")).unwrap() };
        let prompt: Vec<u32> = (10..20).collect();
        let other: Vec<u32> = vec![5, 6];
        let responses: Vec<Vec<u32>> = (0..8).map(|k| (0..9).map(|j| 30 + k + j).collect()).collect();
        let mut p: Vec<&[u32]> = vec![&prompt; 8];
        let mut r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
        p.push(&other);
        r.push(&[7]);
        let batch = SeqBatch::build(&p, &r, 0);
        let which: Vec<usize> = (0..9).collect();
        // Eight samples of 10 queries each (the prompt's last token and 9 of their own) and a
        // budget of 2 · (10 + 9) = 38 queries a copy: copies for 3, 3 and 2 samples.
        let shared = PackedRows::new(&batch, &which, &cfg, true).unwrap();
        let prefixes: Vec<Option<usize>> = shared.packed.prefix.clone();
        assert_eq!(prefixes, vec![None, Some(0), Some(0), Some(0), None, Some(4), Some(4), Some(4), None, Some(8), Some(8), None]);
        assert_eq!(shared.packed.len(), 3 * 9 + 8 * 10 + 3);
        consistent(&shared, &batch, &which);
        // A token budget counts exactly what is packed.
        let counted = |batch: &SeqBatch, which: &[usize]| {
            let parts: Vec<(Vec<u32>, usize)> = which.iter().map(|&b| batch.prompt_and_response(b)).collect();
            let mut pack = SharedPacking::new(batch.response_len);
            for (i, (prompt, len)) in parts.iter().enumerate() {
                pack.push(i, prompt, *len);
            }
            pack.tokens()
        };
        assert_eq!(counted(&batch, &which), shared.packed.len());
        // Also with a one-token prompt two samples share (nothing to share), a prompt with one
        // sample, and an empty response.
        let one: Vec<u32> = vec![9];
        let p2: Vec<&[u32]> = vec![&one, &one, &other, &prompt, &prompt];
        let r2: Vec<&[u32]> = vec![&[1, 2], &[3], &[4, 5, 6], &[], &[7]];
        let b2 = SeqBatch::build(&p2, &r2, 0);
        let all: Vec<usize> = (0..5).collect();
        assert_eq!(counted(&b2, &all), PackedRows::new(&b2, &all, &cfg, true).unwrap().packed.len());
        let plain = PackedRows::new(&batch, &which, &cfg, false).unwrap();
        assert!(plain.packed.prefix.iter().all(Option::is_none));
        assert_eq!(plain.packed.len(), 8 * 19 + 3);
        consistent(&plain, &batch, &which);
        assert_eq!(plain.cells, {
            let mut c = shared.cells.clone();
            c.sort_unstable();
            c
        });
    }
}
