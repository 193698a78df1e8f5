//! The training-step primitive: per-token log-probs on autodiff tensors, micro-batch gradient
//! accumulation, global grad-norm clipping and AdamW.
//!
//! The loss itself is the caller's (the RL algorithms crate builds it from the log-probs);
//! this module only knows how to differentiate it and apply the update.

use crate::error::{EngineError, Result};
use crate::model::{CausalLm, ForwardInput, Pick};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use crate::head::head_logprobs;
use burn::tensor::{Int, Tensor, TensorData};
use crate::HostTensor;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// AdamW settings (PyTorch's defaults where they differ from burn's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Clip the global gradient L2 norm to this value (`None` = no clipping).
    pub grad_clip: Option<f64>,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, grad_clip: Some(1.0) }
    }
}

/// Per-token log-probabilities (and optionally entropies) of a batch, on autodiff tensors.
pub struct TokenLogProbs {
    /// `[B, T]`: column `t ≥ 1` is `log p(ids[t] | ids[<t])`; column 0 is 0 (nothing predicts it).
    pub logprobs: Tensor<2>,
    /// `[B, T]` entropy of the predictive distribution for the same positions, if asked.
    pub entropy: Option<Tensor<2>>,
}

/// Computes per-token log-probs of `input.ids` under `logits / temperature`, through the
/// fused LM head ([`crate::head`]): the `[B, T, vocab]` logits are never materialised.
pub fn token_logprobs(model: &CausalLm, input: &ForwardInput, temperature: f64, with_entropy: bool) -> Result<TokenLogProbs> {
    token_logprobs_from(model, input, 1, temperature, with_entropy)
}

/// [`token_logprobs`] for columns `first..T` only; columns before `first` read 0 and cost
/// nothing in the head. The RL losses need the response's columns alone, and the head (one
/// `hidden × vocab` matmul forward, three backward) is about a quarter of a training step's
/// multiplies: over a prompt twice the response's length, most of it would be thrown away.
pub fn token_logprobs_from(model: &CausalLm, input: &ForwardInput, first: usize, temperature: f64, with_entropy: bool) -> Result<TokenLogProbs> {
    let hidden = model.net.hidden_states(&model.config, input)?;
    let [b, t, h] = hidden.dims();
    let device = hidden.device();
    let first = first.clamp(1, t.max(1));
    let zeros = Tensor::<2>::zeros([b, first], &device);
    if first >= t {
        // Nothing asked for (or nothing predicts a first token).
        let zeros = Tensor::<2>::zeros([b, t], &device);
        return Ok(TokenLogProbs { logprobs: zeros.clone(), entropy: with_entropy.then_some(zeros) });
    }
    // Position j predicts token j+1: column c holds log p(ids[c]), from hidden position c-1.
    let cols = t - first;
    let n = b * cols;
    let pred = hidden.slice([0..b, first - 1..t - 1, 0..h]).reshape([n, h]);
    let next: Vec<u32> = input.ids.iter().flat_map(|r| r[first..].iter().copied()).collect();
    let out = head_logprobs(pred, model.net.head_weight(), &next, temperature)?;
    let column = |c: usize| out.clone().slice([0..n, c..c + 1]).reshape([b, cols]);
    let logprobs = Tensor::cat(vec![zeros.clone(), column(0)], 1);
    let entropy = with_entropy.then(|| Tensor::cat(vec![zeros, column(1)], 1));
    Ok(TokenLogProbs { logprobs, entropy })
}

/// Log-probabilities (and optionally entropies) of picked tokens, `[N]` in pick order.
pub struct PickedLogProbs {
    /// `log p(pick.target)` under `logits / temperature` at each pick's hidden state.
    pub logprobs: Tensor<1>,
    /// The predictive distribution's entropy there, if asked.
    pub entropy: Option<Tensor<1>>,
}

/// Scores the tokens `picks` name (a hidden state and the token it predicts), through the fused
/// LM head: the layout for [`ForwardInput::shared_prompts`], where a continuation's first token
/// is predicted by the prompt's last slot and the others by their own predecessors.
pub fn token_logprobs_at(model: &CausalLm, input: &ForwardInput, picks: &[Pick], temperature: f64, with_entropy: bool) -> Result<PickedLogProbs> {
    let hidden = model.net.hidden_states(&model.config, input)?;
    let [b, t, h] = hidden.dims();
    let device = hidden.device();
    if picks.is_empty() {
        let zeros = Tensor::<1>::zeros([0], &device);
        return Ok(PickedLogProbs { logprobs: zeros.clone(), entropy: with_entropy.then_some(zeros) });
    }
    if let Some(p) = picks.iter().find(|p| p.row >= b || p.col >= t) {
        return Err(EngineError::Request(format!("pick at row {}, column {} is outside the batch [{b}, {t}]", p.row, p.col)));
    }
    let n = picks.len();
    let idx: Vec<i64> = picks.iter().map(|p| (p.row * t + p.col) as i64).collect();
    let rows = hidden.reshape([b * t, h]).select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), &device));
    let targets: Vec<u32> = picks.iter().map(|p| p.target).collect();
    let out = head_logprobs(rows, model.net.head_weight(), &targets, temperature)?;
    let column = |c: usize| out.clone().slice([0..n, c..c + 1]).reshape([n]);
    Ok(PickedLogProbs { logprobs: column(0), entropy: with_entropy.then(|| column(1)) })
}

/// Replaces a rank's flat gradient with its sum over the data-parallel ranks.
pub type GradReduce<'a> = &'a mut dyn FnMut(&mut [f32]) -> std::result::Result<(), String>;

/// What one optimizer step reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepStats {
    /// Sum of the micro-batch losses (each already scaled by the caller).
    pub loss: f64,
    /// Global L2 norm of the accumulated gradient before clipping.
    pub grad_norm: f64,
    /// Micro-batches accumulated.
    pub micro_batches: usize,
    /// Whether the update was applied (skipped on a non-finite gradient norm).
    pub applied: bool,
}

/// A trainable module (policy or critic) with its AdamW state.
pub struct Trainer<M: Module> {
    /// The module on an autodiff device.
    pub model: M,
    /// AdamW's first and second moments by parameter (none for a parameter never stepped).
    exp_avg: GradientsParams,
    exp_avg_sq: GradientsParams,
    cfg: OptimConfig,
    /// Optimizer steps taken.
    pub steps: u64,
}

/// AdamW's state by parameter name, in Hugging Face layout: what a checkpoint stores, the same
/// for every engine (a run checkpointed on a GPU resumes on the CPU and the other way round).
#[derive(Debug, Clone, Default)]
pub struct OptimizerState {
    /// Steps taken (AdamW's bias correction).
    pub steps: u64,
    /// First moments.
    pub exp_avg: BTreeMap<String, HostTensor>,
    /// Second moments.
    pub exp_avg_sq: BTreeMap<String, HostTensor>,
}

/// The `format` metadata value of an optimizer-state file.
const OPTIM_FORMAT: &str = "reinforge-adamw-1";

impl OptimizerState {
    /// Writes [`Self::to_bytes`] to a file, atomically.
    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        crate::weights::write_atomic(path, &self.to_bytes(path)?)
    }

    /// `exp_avg/<name>` and `exp_avg_sq/<name>` tensors, with the step count in the metadata,
    /// as the bytes of one safetensors file (`label` names it in errors).
    pub fn to_bytes(&self, label: &std::path::Path) -> Result<Vec<u8>> {
        let mut all = BTreeMap::new();
        for (prefix, map) in [("exp_avg", &self.exp_avg), ("exp_avg_sq", &self.exp_avg_sq)] {
            for (k, t) in map {
                all.insert(format!("{prefix}/{k}"), t.clone());
            }
        }
        let meta = [("format".to_string(), OPTIM_FORMAT.to_string()), ("steps".to_string(), self.steps.to_string())].into_iter().collect();
        crate::weights::safetensors_bytes(label, &all, Some(meta))
    }

    /// Reads what [`Self::write`] wrote; `label` names the file in errors.
    pub fn read(bytes: &[u8], label: &std::path::Path) -> Result<OptimizerState> {
        let bad = |msg: String| EngineError::Weights { path: label.to_path_buf(), msg };
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let md = meta.metadata().clone().unwrap_or_default();
        if md.get("format").map(String::as_str) != Some(OPTIM_FORMAT) {
            return Err(bad(format!("not a reinforge optimizer state (metadata format is not {OPTIM_FORMAT})")));
        }
        let steps = md.get("steps").and_then(|s| s.parse().ok()).ok_or_else(|| bad("no step count in the metadata".into()))?;
        let mut st = OptimizerState { steps, ..Default::default() };
        for (name, t) in crate::weights::decode_all(bytes, label)? {
            if let Some(k) = name.strip_prefix("exp_avg_sq/") {
                st.exp_avg_sq.insert(k.to_string(), t);
            } else if let Some(k) = name.strip_prefix("exp_avg/") {
                st.exp_avg.insert(k.to_string(), t);
            }
        }
        Ok(st)
    }
}

/// A module that converts to and from Hugging Face tensors: what makes the optimizer state
/// engine-neutral.
pub trait HfModule: Module + Sized {
    /// The parameters (or same-shaped values mapped onto them) by HF name, in HF layout.
    fn hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>>;
    /// A module of this one's shape and parameter ids holding `tensors`, on `device`.
    fn like_from_hf(&self, tensors: BTreeMap<String, HostTensor>, device: &burn::tensor::Device) -> Result<Self>;
    /// Whether the tensor of this HF name is trained (with a LoRA adapter, only its factors).
    fn trains(&self, _name: &str) -> bool {
        true
    }
}

impl HfModule for CausalLm {
    fn hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        self.to_hf_tensors()
    }
    fn like_from_hf(&self, tensors: BTreeMap<String, HostTensor>, device: &burn::tensor::Device) -> Result<Self> {
        CausalLm::from_hf_tensors_with(self.config.clone(), self.lora.as_ref(), tensors, device)
    }
    fn trains(&self, name: &str) -> bool {
        self.lora.is_none() || crate::lora::is_lora_name(name)
    }
}

impl HfModule for crate::ValueModel {
    fn hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        self.to_hf_tensors()
    }
    fn like_from_hf(&self, tensors: BTreeMap<String, HostTensor>, device: &burn::tensor::Device) -> Result<Self> {
        crate::ValueModel::from_hf_tensors(self.config.clone(), tensors, device)
    }
}

/// One AdamW update of every parameter that has a gradient: PyTorch's formula (decoupled
/// weight decay, bias correction), written op for op as burn's own AdamW, so the numbers are
/// the same. By hand because burn keeps its optimizer's state private, and a checkpoint needs
/// it by parameter name to resume on another engine.
struct AdamWStep<'a> {
    grads: &'a mut GradientsParams,
    exp_avg: &'a mut GradientsParams,
    exp_avg_sq: &'a mut GradientsParams,
    cfg: &'a OptimConfig,
    lr: f64,
    time: i32,
}

impl burn::module::ModuleMapper for AdamWStep<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let require_grad = tensor.is_require_grad();
        let strategy = tensor.gradient_checkpointing_strategy();
        let value = tensor.inner();
        let (m, v) = match (self.exp_avg.remove::<D>(id), self.exp_avg_sq.remove::<D>(id)) {
            (Some(m), Some(v)) => (m.mul_scalar(b1).add(grad.clone().mul_scalar(1.0 - b1)), v.mul_scalar(b2).add(grad.square().mul_scalar(1.0 - b2))),
            _ => (grad.clone().mul_scalar(1.0 - b1), grad.square().mul_scalar(1.0 - b2)),
        };
        let m_hat = m.clone().div_scalar(1f32 - b1.powi(self.time));
        let v_hat = v.clone().div_scalar(1f32 - b2.powi(self.time));
        let delta = m_hat.div(v_hat.sqrt().add_scalar(self.cfg.eps));
        let decay = self.lr * self.cfg.weight_decay as f64;
        let decayed = if decay == 0.0 { value } else { value.mul_scalar(1.0 - decay) };
        let updated = decayed - delta.mul_scalar(self.lr);
        self.exp_avg.register::<D>(id, m);
        self.exp_avg_sq.register::<D>(id, v);
        let mut t = Tensor::from_inner(updated);
        if let Some(s) = strategy {
            t = t.with_gradient_checkpointing_strategy(s);
        }
        if require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Collects a module's parameter values by id, for the ids in `only`.
struct Collect<'a> {
    values: GradientsParams,
    only: &'a std::collections::HashSet<ParamId>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.only.contains(&param.id) {
            self.values.register::<D>(param.id, param.val().inner());
        }
    }
}

/// Ids of the parameters that take gradients (all of them, but a LoRA run's frozen base).
struct TrainedIds(std::collections::HashSet<ParamId>);

impl ModuleVisitor for TrainedIds {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if param.val().is_require_grad() {
            self.0.insert(param.id);
        }
    }
}

/// The parameters of `net` that take gradients.
pub fn trained_ids<M: Module>(net: &M) -> std::collections::HashSet<ParamId> {
    let mut v = TrainedIds(Default::default());
    net.visit(&mut v);
    v.0
}

impl<M: Module> Trainer<M> {
    /// Wraps a module whose parameters live on an autodiff device.
    pub fn new(model: M, cfg: OptimConfig) -> Result<Self> {
        if !model.devices().iter().all(|d| d.is_autodiff()) {
            return Err(EngineError::Request("Trainer needs a model on an autodiff device (DeviceSpec::training_device)".into()));
        }
        Ok(Self { exp_avg: GradientsParams::new(), exp_avg_sq: GradientsParams::new(), model, cfg, steps: 0 })
    }

    /// One optimizer step over `micro_batches` micro-batches: `loss_fn(i, &model)` returns
    /// micro-batch `i`'s scalar loss, already weighted by its share of the step; gradients add
    /// up across micro-batches before one clip and one AdamW update.
    pub fn step<F, E>(&mut self, micro_batches: usize, lr: f64, loss_fn: F) -> std::result::Result<StepStats, E>
    where
        F: FnMut(usize, &M) -> std::result::Result<Tensor<1>, E>,
        E: From<EngineError>,
    {
        self.step_reduced(micro_batches, lr, loss_fn, None)
    }

    /// [`Self::step`] for one data-parallel rank: after this rank's micro-batches, `reduce`
    /// replaces the flat gradient (every parameter in module order) with its sum over ranks,
    /// before the global-norm clip and AdamW — so every rank applies the same update.
    pub fn step_reduced<F, E>(
        &mut self,
        micro_batches: usize,
        lr: f64,
        mut loss_fn: F,
        reduce: Option<GradReduce<'_>>,
    ) -> std::result::Result<StepStats, E>
    where
        F: FnMut(usize, &M) -> std::result::Result<Tensor<1>, E>,
        E: From<EngineError>,
    {
        if micro_batches == 0 && reduce.is_none() {
            return Err(EngineError::Request("train step with no micro-batches".into()).into());
        }
        let mut acc = GradientsAccumulator::<M>::new();
        let mut stats = StepStats { micro_batches, ..Default::default() };
        for i in 0..micro_batches {
            let loss = loss_fn(i, &self.model)?;
            stats.loss += loss.clone().into_scalar::<f32>() as f64;
            let grads = loss.backward();
            acc.accumulate(&self.model, GradientsParams::from_grads(grads, &self.model));
        }
        let mut grads = acc.grads();
        if let Some(reduce) = reduce {
            grads = all_reduce_grads(&self.model, grads, reduce)?;
        }
        stats.grad_norm = global_grad_norm(&self.model, &grads);
        if !stats.grad_norm.is_finite() {
            // verl skips the update on a non-finite norm rather than poisoning the weights.
            tracing::warn!(grad_norm = stats.grad_norm, "non-finite gradient norm: skipping this update");
            return Ok(stats);
        }
        if let Some(max) = self.cfg.grad_clip {
            if stats.grad_norm > max {
                scale_grads(&self.model, &mut grads, max / (stats.grad_norm + 1e-6));
            }
        }
        self.steps += 1;
        let mut step = AdamWStep { grads: &mut grads, exp_avg: &mut self.exp_avg, exp_avg_sq: &mut self.exp_avg_sq, cfg: &self.cfg, lr, time: self.steps as i32 };
        self.model = self.model.clone().map(&mut step);
        stats.applied = true;
        Ok(stats)
    }

}

impl<M: HfModule> Trainer<M> {
    /// AdamW's moments by HF name (zeros for a parameter not stepped yet), for checkpoints;
    /// only the trained tensors (a LoRA run's factors, not its frozen base).
    pub fn optimizer_state(&self) -> Result<OptimizerState> {
        let trained = |mut t: BTreeMap<String, HostTensor>| {
            t.retain(|k, _| self.model.trains(k));
            t
        };
        let m = trained(self.model.clone().map(&mut GradMapper { grads: &self.exp_avg }).hf_tensors()?);
        let v = trained(self.model.clone().map(&mut GradMapper { grads: &self.exp_avg_sq }).hf_tensors()?);
        Ok(OptimizerState { steps: self.steps, exp_avg: m, exp_avg_sq: v })
    }

    /// Restores moments from [`Self::optimizer_state`] (of this engine or another): tensors
    /// are matched by name and shape; one the state lacks starts at zero.
    pub fn load_optimizer_state(&mut self, st: &OptimizerState) -> Result<()> {
        let device = self.model.devices().first().cloned().ok_or_else(|| EngineError::Request("model has no parameters".into()))?.inner();
        let shapes = self.model.hf_tensors()?;
        let fill = |src: &BTreeMap<String, HostTensor>| -> Result<BTreeMap<String, HostTensor>> {
            shapes
                .iter()
                .map(|(k, t)| match src.get(k) {
                    Some(x) if x.shape == t.shape => Ok((k.clone(), x.clone())),
                    Some(x) => Err(EngineError::Request(format!("optimizer state: `{k}` has shape {:?}, the model {:?}", x.shape, t.shape))),
                    None => Ok((k.clone(), HostTensor { shape: t.shape.clone(), data: vec![0.0; t.data.len()] })),
                })
                .collect()
        };
        // Frozen weights get no moments (their zeros above only complete the module's shape).
        let only = trained_ids(&self.model);
        let mut m = Collect { values: GradientsParams::new(), only: &only };
        self.model.like_from_hf(fill(&st.exp_avg)?, &device)?.visit(&mut m);
        let mut v = Collect { values: GradientsParams::new(), only: &only };
        self.model.like_from_hf(fill(&st.exp_avg_sq)?, &device)?.visit(&mut v);
        self.exp_avg = m.values;
        self.exp_avg_sq = v.values;
        self.steps = st.steps;
        Ok(())
    }
}

impl Trainer<CausalLm> {
    /// The same weights without autodiff, for rollouts (hybrid engine: the tensors are shared,
    /// nothing is copied or reloaded).
    pub fn inference_model(&self) -> CausalLm {
        self.model.valid()
    }
}

struct NormVisitor<'a> {
    grads: &'a GradientsParams,
    sum_sq: f64,
}

impl ModuleVisitor for NormVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            self.sum_sq += g.square().sum().into_scalar::<f32>() as f64;
        }
    }
}

/// L2 norm over every parameter's gradient together (PyTorch's `clip_grad_norm_` convention,
/// not burn's per-tensor clipping).
pub fn global_grad_norm<M: Module>(net: &M, grads: &GradientsParams) -> f64 {
    let mut v = NormVisitor { grads, sum_sq: 0.0 };
    net.visit(&mut v);
    v.sum_sq.sqrt()
}

struct ScaleVisitor<'a> {
    grads: &'a mut GradientsParams,
    scale: f64,
}

impl ModuleVisitor for ScaleVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register::<D>(param.id, g.mul_scalar(self.scale));
        }
    }
}

fn scale_grads<M: Module>(net: &M, grads: &mut GradientsParams, scale: f64) {
    let mut v = ScaleVisitor { grads, scale };
    net.visit(&mut v);
}

/// Flattens the trained parameters' gradients in module order (a missing gradient counts as
/// zeros, so ranks that saw different data still exchange buffers of one layout; frozen
/// weights are left out, so a LoRA run exchanges its factors' gradients only).
struct FlattenVisitor<'a> {
    grads: &'a GradientsParams,
    flat: Vec<f32>,
    trained: &'a std::collections::HashSet<ParamId>,
}

impl ModuleVisitor for FlattenVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !self.trained.contains(&param.id) {
            return;
        }
        let shape = param.val().dims().to_vec();
        match self.grads.get::<D>(param.id).map(|g| g.into_data().try_to_vec::<f32>()) {
            Some(Ok(v)) => self.flat.extend_from_slice(&v),
            _ => self.flat.extend(std::iter::repeat_n(0.0, shape.iter().product())),
        }
    }
}

struct UnflattenVisitor<'a> {
    flat: &'a [f32],
    offset: usize,
    grads: GradientsParams,
    device: burn::tensor::Device,
    trained: &'a std::collections::HashSet<ParamId>,
}

impl ModuleVisitor for UnflattenVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !self.trained.contains(&param.id) {
            return;
        }
        let shape: [usize; D] = param.val().dims();
        let n: usize = shape.iter().product();
        let data = TensorData::new(self.flat[self.offset..self.offset + n].to_vec(), shape);
        self.offset += n;
        self.grads.register::<D>(param.id, Tensor::<D>::from_data(data, &self.device));
    }
}

fn all_reduce_grads<M: Module>(
    net: &M,
    grads: GradientsParams,
    reduce: &mut dyn FnMut(&mut [f32]) -> std::result::Result<(), String>,
) -> Result<GradientsParams> {
    let trained = trained_ids(net);
    let mut f = FlattenVisitor { grads: &grads, flat: Vec::new(), trained: &trained };
    net.visit(&mut f);
    let mut flat = f.flat;
    reduce(&mut flat).map_err(|e| EngineError::Tensor(format!("gradient all-reduce: {e}")))?;
    // Gradients live on the inner (non-autodiff) device of the parameters.
    let device = net.devices().first().cloned().ok_or_else(|| EngineError::Request("model has no parameters".into()))?.inner();
    let mut u = UnflattenVisitor { flat: &flat, offset: 0, grads: GradientsParams::new(), device, trained: &trained };
    net.visit(&mut u);
    Ok(u.grads)
}

struct IdVisitor(Vec<ParamId>);

impl ModuleVisitor for IdVisitor {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(param.id);
    }
}

/// Ids of every float parameter (for tests and checkpoint bookkeeping).
pub fn param_ids<M: Module>(net: &M) -> Vec<ParamId> {
    let mut v = IdVisitor(Vec::new());
    net.visit(&mut v);
    v.0
}

/// Replaces every parameter of a module with its gradient (zeros where it has none), on the
/// gradients' device: the module then exports gradients with its own naming and layout.
struct GradMapper<'a> {
    grads: &'a GradientsParams,
}

impl burn::module::ModuleMapper for GradMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id;
        let value = param.val();
        let g = self.grads.get::<D>(id).unwrap_or_else(|| Tensor::zeros(value.dims(), &value.device().inner()));
        let mut p = Param::from_tensor(g);
        p.id = id;
        p
    }
}

/// Σ a·lp + Σ b·entropy over positions t ≥ 1 of `seqs` (padded to the longest), with the
/// per-row log-probs and entropies: the test loss both engines differentiate.
struct ReferenceLoss {
    loss: Tensor<1>,
    lp: Vec<Vec<f32>>,
    ent: Vec<Vec<f32>>,
}

fn reference_loss(model: &CausalLm, seqs: &[Vec<u32>], temperature: f64, a: &[Vec<f32>], b: &[Vec<f32>]) -> Result<ReferenceLoss> {
    let t = seqs.iter().map(Vec::len).max().unwrap_or(0);
    if t < 2 || seqs.len() != a.len() || seqs.len() != b.len() || seqs.iter().zip(a.iter().zip(b)).any(|(s, (x, y))| s.len() < 2 || x.len() + 1 != s.len() || y.len() + 1 != s.len()) {
        return Err(EngineError::Request("reference loss: every sequence needs ≥ 2 tokens and one coefficient per position after the first".into()));
    }
    let n = seqs.len();
    let ids: Vec<Vec<u32>> = seqs.iter().map(|s| s.iter().copied().chain(std::iter::repeat_n(0, t - s.len())).collect()).collect();
    let mask: Vec<Vec<bool>> = seqs.iter().map(|s| (0..t).map(|j| j < s.len()).collect()).collect();
    let coef = |c: &[Vec<f32>]| -> Vec<f32> {
        c.iter().flat_map(|row| std::iter::once(0.0).chain(row.iter().copied()).chain(std::iter::repeat_n(0.0, t - row.len() - 1))).collect()
    };
    let device = model.device();
    let out = token_logprobs(model, &ForwardInput::from_mask(ids, mask), temperature, true)?;
    let entropy = out.entropy.ok_or_else(|| EngineError::Tensor("no entropy".into()))?;
    let ca = Tensor::<2>::from_data(TensorData::new(coef(a), [n, t]), &device);
    let cb = Tensor::<2>::from_data(TensorData::new(coef(b), [n, t]), &device);
    let loss = (out.logprobs.clone() * ca).sum() + (entropy.clone() * cb).sum();
    let as_rows = |x: Tensor<2>| -> Result<Vec<Vec<f32>>> {
        let v = crate::model::host_vec(x)?;
        Ok(seqs.iter().enumerate().map(|(i, s)| v[i * t + 1..i * t + s.len()].to_vec()).collect())
    };
    Ok(ReferenceLoss { loss, lp: as_rows(out.logprobs)?, ent: as_rows(entropy)? })
}

/// The CPU engine's reference for other engines (`reinforge selftest --device cuda`): for
/// sequences `seqs`, the log-probabilities and entropies at every position t ≥ 1 (under
/// `logits / temperature`), and the gradient of Σ a·lp + Σ b·entropy over those positions
/// with respect to every weight, by HF name and in HF layout. `model` must be on an autodiff
/// device; `a[i]` and `b[i]` have one coefficient per position t ≥ 1 of `seqs[i]`.
#[allow(clippy::type_complexity)]
pub fn reference_gradients(
    model: &CausalLm,
    seqs: &[Vec<u32>],
    temperature: f64,
    a: &[Vec<f32>],
    b: &[Vec<f32>],
) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>, std::collections::BTreeMap<String, crate::HostTensor>)> {
    let r = reference_loss(model, seqs, temperature, a, b)?;
    let grads = GradientsParams::from_grads(r.loss.backward(), model);
    let gmodel = model.clone().map(&mut GradMapper { grads: &grads });
    Ok((r.lp, r.ent, gmodel.to_hf_tensors()?))
}

/// The CPU engine's reference optimizer step: one [`Trainer`] step (clip, AdamW at `lr`) of
/// the loss of [`reference_gradients`]; returns the updated weights and AdamW's state.
pub fn reference_step(
    model: CausalLm,
    optim: OptimConfig,
    lr: f64,
    seqs: &[Vec<u32>],
    temperature: f64,
    a: &[Vec<f32>],
    b: &[Vec<f32>],
) -> Result<(StepStats, std::collections::BTreeMap<String, crate::HostTensor>, OptimizerState)> {
    let mut trainer = Trainer::new(model, optim)?;
    let stats = trainer.step(1, lr, |_, m: &CausalLm| reference_loss(m, seqs, temperature, a, b).map(|r| r.loss))?;
    Ok((stats, trainer.model.to_hf_tensors()?, trainer.optimizer_state()?))
}
