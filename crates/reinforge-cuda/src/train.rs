//! A trainable model on the device: f32 master weights, f32 gradients and AdamW moments in
//! the model's flat layout, and the storage-type copy the kernels read. A step is
//! [`TrainState::zero_grads`], one [`TrainState::micro`] per micro-batch (forward, the
//! caller's loss on the host, backward adding into the gradients), then
//! [`TrainState::finish`] (optional all-reduce, global norm, clipping, AdamW).
//!
//! The loss lives on the host: the head's per-row outputs (log-probs and entropies, or
//! values) are a few floats per token, so the RL losses of `reinforge-algos` run unchanged on
//! them and hand back their gradients; the device never needs to know PPO.

use crate::error::{CudaError, Result};
use crate::gpu::{Buf, DType, DevPtr, Gpu};
use crate::model::{check_config, download_slots, download_slots_where, for_each_slot, DeviceModel, Head, Layout, Packed, RowGrads, RowOut, Slot};
use crate::ops::Ops;
use reinforge_engine::weights::WeightSet;
use reinforge_engine::{HostTensor, LoraConfig, ModelConfig, OptimConfig, OptimizerState, StepStats};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a data-parallel step sums its gradient over ranks.
pub enum GradReduce<'a> {
    /// Through the host: the gradient comes down, `f` sums it in place, it goes back up.
    Host(&'a mut dyn FnMut(&mut [f32]) -> std::result::Result<(), String>),
    /// On the GPUs, through NCCL.
    Nccl(&'a crate::nccl::Comm),
}

/// What to do when the optimizer's buffers do not fit.
const FIX_STATE: &str = "use a smaller model or a GPU with more memory (training keeps 18 bytes per parameter: f32 master, bf16 copy, f32 gradient, two f32 AdamW moments; sharding is not there yet)";

/// Elements of a layout that have an f32 master copy, gradients and moments: all of them, or
/// under LoRA the factors alone (the frozen base lives in the storage copy only).
fn kept(layout: &Layout) -> usize {
    if layout.frozen_base() {
        layout.trainable
    } else {
        layout.total
    }
}

/// A model with its optimizer, on the device.
pub struct TrainState {
    /// The weights the kernels read (storage type).
    pub model: DeviceModel,
    /// f32 master weights when the storage type is not f32 (else `model.params` is the master).
    master: Option<Buf>,
    grads: Buf,
    m: Buf,
    v: Buf,
    scratch: Buf,
    /// Optimizer steps taken.
    pub steps: u64,
    /// AdamW settings.
    pub optim: OptimConfig,
    /// Recompute each block's activations in the backward instead of keeping them.
    pub checkpointing: bool,
    /// Under LoRA in bf16, the frozen weights that bf16 does not hold exactly (a base model
    /// stored in f32), as given: checkpoints and exports keep the base model's own values,
    /// not their rounding. A bf16 base needs none.
    frozen_f32: BTreeMap<String, HostTensor>,
}

impl TrainState {
    /// Uploads weights for training (`value_head`: a critic).
    pub fn from_weights(gpu: &Arc<Gpu>, cfg: ModelConfig, weights: &mut WeightSet, dt: DType, value_head: bool, optim: OptimConfig, checkpointing: bool) -> Result<TrainState> {
        check_config(&cfg)?;
        let layout = Layout::new(&cfg, value_head);
        Self::with_layout(gpu, cfg, layout, weights, dt, optim, checkpointing)
    }

    /// Uploads a causal LM with a LoRA adapter for training: `weights` holds the base model's
    /// tensors and the adapter's factors (PEFT's names, `….lora_A.weight`); only the factors
    /// get master weights, gradients and AdamW moments.
    pub fn with_lora(gpu: &Arc<Gpu>, cfg: ModelConfig, lora: &LoraConfig, weights: &mut WeightSet, dt: DType, optim: OptimConfig, checkpointing: bool) -> Result<TrainState> {
        check_config(&cfg)?;
        let layout = Layout::with_lora(&cfg, lora);
        Self::with_layout(gpu, cfg, layout, weights, dt, optim, checkpointing)
    }

    fn with_layout(gpu: &Arc<Gpu>, cfg: ModelConfig, layout: Layout, weights: &mut WeightSet, dt: DType, optim: OptimConfig, checkpointing: bool) -> Result<TrainState> {
        let total = layout.total;
        let kept = kept(&layout);
        let (params, master) = if dt == DType::F32 {
            (gpu.alloc(total * 4, "f32 master weights", FIX_STATE)?, None)
        } else {
            (gpu.alloc(total * dt.size(), "model weights", FIX_STATE)?, Some(gpu.alloc(kept * 4, "f32 master weights", FIX_STATE)?))
        };
        let model = DeviceModel::with_params(gpu, cfg, layout, params, dt)?;
        let mut state = TrainState {
            grads: gpu.alloc(kept * 4, "gradients", FIX_STATE)?,
            m: gpu.alloc(kept * 4, "AdamW first moments", FIX_STATE)?,
            v: gpu.alloc(kept * 4, "AdamW second moments", FIX_STATE)?,
            scratch: gpu.alloc(Ops::sum_sq_scratch() * 4, "norm scratch", FIX_STATE)?,
            master,
            model,
            steps: 0,
            optim,
            checkpointing,
            frozen_f32: BTreeMap::new(),
        };
        state.upload(weights)?;
        Ok(state)
    }

    /// Writes HF-named weights into the master copy (what it holds) and the storage copy.
    fn upload(&mut self, weights: &mut WeightSet) -> Result<()> {
        let gpu = Arc::clone(&self.model.gpu);
        let (layout, dt) = (&self.model.layout, self.model.dt);
        let kept = kept(layout);
        let ops = Ops::new(&gpu, dt);
        let master = self.master.as_ref().map(|m| m.ptr);
        let params = self.model.params.ptr;
        // Frozen base weights (beyond the master copy) go through staging into the storage type.
        let largest = layout.slots.iter().filter(|s| s.offset >= kept).map(Slot::len).max();
        let staging = match (master, largest) {
            (Some(_), Some(n)) => Some(gpu.alloc(n * 4, "weight staging", "use a smaller model")?),
            _ => None,
        };
        let mut inexact = BTreeMap::new();
        for_each_slot(layout, &self.model.cfg, weights, |slot, data| match (master, &staging) {
            (None, _) => gpu.upload(params.add(slot.offset * 4), data),
            (Some(m), _) if slot.offset < kept => gpu.upload(m.add(slot.offset * 4), data),
            (Some(_), Some(st)) => {
                if data.iter().any(|&x| half::bf16::from_f32(x).to_f32() != x && !x.is_nan()) {
                    inexact.insert(slot.name.clone(), HostTensor { shape: slot.shape.clone(), data: data.to_vec() });
                }
                gpu.upload(st.ptr, data)?;
                ops.cast_from_f32(params.add(slot.offset * dt.size()), st.ptr, slot.len())
            }
            (Some(_), None) => Err(CudaError::Request(format!("no staging for `{}`", slot.name))),
        })?;
        self.frozen_f32 = inexact;
        if let Some(m) = master {
            ops.cast_from_f32(params, m, kept)?;
        }
        gpu.sync()
    }

    fn master_ptr(&self) -> DevPtr {
        self.master.as_ref().map_or(self.model.params.ptr, |m| m.ptr)
    }

    /// Elements the optimizer updates.
    fn trainable(&self) -> usize {
        self.model.layout.trainable
    }

    /// Starts a step: gradients to zero.
    pub fn zero_grads(&self) -> Result<()> {
        self.model.gpu.zero(self.grads.ptr, self.grads.bytes)
    }

    /// One micro-batch: forward over `batch`, the head over `rows`; `loss` turns the head's
    /// outputs into their gradients (and whatever it records); the backward adds this
    /// micro-batch's weight gradients to the step's.
    pub fn micro<E: From<CudaError>>(&mut self, batch: &Packed, rows: &[usize], head: Head<'_>, loss: impl FnOnce(&RowOut) -> std::result::Result<RowGrads, E>) -> std::result::Result<RowOut, E> {
        let (out, pass) = self.model.forward_train(batch, rows, head, self.checkpointing)?;
        let g = loss(&out)?;
        self.model.backward(pass, &g, self.grads.ptr, self.checkpointing)?;
        Ok(out)
    }

    /// Ends a step: `reduce` (data parallelism) replaces the flat f32 gradient with its sum
    /// over ranks; then the global L2 norm, clipping to `optim.grad_clip`, and AdamW at `lr`.
    /// A non-finite norm skips the update (as the CPU engine and verl do).
    pub fn finish(&mut self, lr: f64, micro_batches: usize, reduce: Option<GradReduce<'_>>) -> Result<StepStats> {
        let gpu = Arc::clone(&self.model.gpu);
        let n = self.trainable();
        match reduce {
            Some(GradReduce::Host(reduce)) => {
                let mut host = gpu.to_vec::<f32>(self.grads.ptr, n)?;
                reduce(&mut host).map_err(|e| CudaError::Request(format!("gradient all-reduce: {e}")))?;
                gpu.upload(self.grads.ptr, &host)?;
            }
            Some(GradReduce::Nccl(comm)) => comm.all_reduce_sum(self.grads.ptr, n, DType::F32)?,
            None => {}
        }
        let ops = Ops::new(&gpu, self.model.dt);
        let norm = ops.sum_sq(self.grads.ptr, n, self.scratch.ptr)?.sqrt();
        let mut stats = StepStats { micro_batches, grad_norm: norm, ..Default::default() };
        if !norm.is_finite() {
            tracing::warn!(grad_norm = norm, "non-finite gradient norm: skipping this update");
            return Ok(stats);
        }
        let gscale = match self.optim.grad_clip {
            Some(max) if norm > max => (max / (norm + 1e-6)) as f32,
            _ => 1.0,
        };
        self.steps += 1;
        let o = &self.optim;
        ops.adamw(self.master_ptr(), self.model.params.ptr, self.m.ptr, self.v.ptr, self.grads.ptr, n, lr as f32, o.beta1, o.beta2, o.eps, o.weight_decay, self.steps, gscale)?;
        gpu.sync()?;
        stats.applied = true;
        Ok(stats)
    }

    /// The f32 gradient of the step so far, by name (tests and the self-test): every trained
    /// tensor's (under LoRA, the factors').
    pub fn gradients(&self) -> Result<BTreeMap<String, HostTensor>> {
        let l = &self.model.layout;
        download_slots_where(&self.model.gpu, l, self.grads.ptr, DType::F32, |s| s.offset < kept(l))
    }

    /// The weights by name: the master copy's, and frozen base weights as they were given.
    pub fn to_hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        let (gpu, l) = (&self.model.gpu, &self.model.layout);
        match &self.master {
            None => download_slots(gpu, l, self.model.params.ptr, DType::F32),
            Some(m) => {
                let mut out = download_slots_where(gpu, l, m.ptr, DType::F32, |s| s.offset < kept(l))?;
                let frozen = |s: &Slot| s.offset >= kept(l) && !self.frozen_f32.contains_key(&s.name);
                out.extend(download_slots_where(gpu, l, self.model.params.ptr, self.model.dt, frozen)?);
                out.extend(self.frozen_f32.iter().map(|(k, t)| (k.clone(), t.clone())));
                Ok(out)
            }
        }
    }

    /// AdamW's moments by name (trained tensors only).
    pub fn optimizer_state(&self) -> Result<OptimizerState> {
        let gpu = &self.model.gpu;
        let l = &self.model.layout;
        let trained = |s: &Slot| s.offset < l.trainable;
        Ok(OptimizerState {
            steps: self.steps,
            exp_avg: download_slots_where(gpu, l, self.m.ptr, DType::F32, trained)?,
            exp_avg_sq: download_slots_where(gpu, l, self.v.ptr, DType::F32, trained)?,
        })
    }

    /// Restores AdamW's moments (a checkpoint's; every trained tensor must be there).
    pub fn load_optimizer_state(&mut self, s: &OptimizerState) -> Result<()> {
        let gpu = Arc::clone(&self.model.gpu);
        for slot in self.model.layout.slots.iter().filter(|s| s.offset < self.model.layout.trainable) {
            for (buf, map, what) in [(&self.m, &s.exp_avg, "exp_avg"), (&self.v, &s.exp_avg_sq, "exp_avg_sq")] {
                let t = map.get(&slot.name).ok_or_else(|| CudaError::Request(format!("optimizer state has no {what} for `{}`", slot.name)))?;
                if t.shape != slot.shape {
                    return Err(CudaError::Request(format!("optimizer state: `{}` has shape {:?}, the model {:?}", slot.name, t.shape, slot.shape)));
                }
                gpu.upload(buf.at(slot.offset, DType::F32), &t.data)?;
            }
        }
        self.steps = s.steps;
        gpu.sync()
    }

    /// Replaces the weights (master and storage copy) with HF-named tensors.
    pub fn load_weights(&mut self, tensors: BTreeMap<String, HostTensor>) -> Result<()> {
        self.upload(&mut WeightSet::from_map("<tensors>", tensors.into_iter().collect()))
    }

    /// Bytes of device memory the optimizer state holds (master, gradients, moments).
    pub fn state_bytes(&self) -> usize {
        self.master.as_ref().map_or(0, |m| m.bytes) + self.grads.bytes + self.m.bytes + self.v.bytes
    }
}
