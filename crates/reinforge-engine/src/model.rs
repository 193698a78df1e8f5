//! The decoder-only transformer (Llama family and Qwen2) on burn tensors.
//!
//! This forward serves training and log-probabilities (full sequences, autodiff when the
//! device has it); generation runs on the packed-weight twin in [`crate::decode`]. Layout follows transformers:
//! linear weights are `[out, in]` on disk and kept transposed (`[in, out]`) in memory so the
//! forward is a plain `x · W`.

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::lora::{Adapter, LoraConfig};
use crate::weights::{HostTensor, WeightSet};
use burn::module::{Module, Param, ParamId};
use crate::rope::{rope, rope_table};
use crate::swiglu::swiglu;
use burn::tensor::module::{attention, embedding};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

/// A linear projection with the weight stored `[in, out]`.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[in, out]`.
    pub weight: Param<Tensor<2>>,
    /// `[out]`, when the architecture has one here.
    pub bias: Option<Param<Tensor<1>>>,
    /// A LoRA adapter on this linear ([`crate::lora`]), when the model has one here.
    pub lora: Option<Lora>,
}

/// A LoRA adapter's factors on one linear: the linear computes `x·W + scale·(x·A)·B`.
#[derive(Module, Debug)]
pub struct Lora {
    /// `[in, r]` (PEFT's `lora_A.weight` transposed).
    pub a: Param<Tensor<2>>,
    /// `[r, out]` (PEFT's `lora_B.weight` transposed).
    pub b: Param<Tensor<2>>,
    /// `alpha / r`.
    pub scale: f64,
}

impl Linear {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let y = linear_rows(x.clone(), self.weight.val(), self.bias.as_ref().map(|b| b.val()));
        match &self.lora {
            // Through the rank-r bottleneck: two thin GEMMs, never the merged `[in, out]` update.
            Some(l) => y + linear_rows(linear_rows(x, l.a.val(), None), l.b.val(), None).mul_scalar(l.scale),
            None => y,
        }
    }

    /// `[in, out]`: the weight with the adapter merged in (`W + scale·A·B`), what a rollout
    /// engine or an export uses; the plain weight without one.
    pub fn effective_weight(&self) -> Tensor<2> {
        match &self.lora {
            Some(l) => self.weight.val() + l.a.val().matmul(l.b.val()).mul_scalar(l.scale),
            None => self.weight.val(),
        }
    }
}

/// `[B, T, in] · [in, out] (+ bias) → [B, T, out]` as one 2-D matmul over all `B·T` rows. A
/// 3-D input would be a batched matmul against the broadcast weight: one small GEMM per
/// sequence, each repacking the weight, and in the backward a `[B, in, out]` gradient summed
/// over the batch.
fn linear_rows(x: Tensor<3>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<3> {
    let [b, t, i] = x.dims();
    let y = crate::matmul::matmul(x.reshape([b * t, i]), weight);
    let y = match bias {
        Some(bias) => y + bias.unsqueeze::<2>(),
        None => y,
    };
    let [_, o] = y.dims();
    y.reshape([b, t, o])
}

/// Root-mean-square layer norm: `w * x / sqrt(mean(x²) + eps)`.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// `[hidden]`.
    pub weight: Param<Tensor<1>>,
    /// Added under the square root.
    pub eps: f64,
}

impl RmsNorm {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        crate::rmsnorm::rms_norm(x, self.weight.val(), self.eps)
    }
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct Block {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Output projection.
    pub o_proj: Linear,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// SwiGLU gate.
    pub gate_proj: Linear,
    /// SwiGLU up projection.
    pub up_proj: Linear,
    /// SwiGLU down projection.
    pub down_proj: Linear,
}

/// The trainable weights of a causal LM (what the optimizer sees).
#[derive(Module, Debug)]
pub struct Transformer {
    /// `[vocab, hidden]` when untied; `[hidden, vocab]` when tied, so the LM head is a plain
    /// matmul (burn's matmul would copy a transposed view every call: 113 MB per step for
    /// SmolLM2) and lookups select columns instead.
    pub embed_tokens: Param<Tensor<2>>,
    /// Whether the embeddings double as the LM head (layout above).
    pub tied: bool,
    /// The blocks.
    pub layers: Vec<Block>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Untied LM head (`[hidden, vocab]`); `None` when tied to the embeddings.
    pub lm_head: Option<Linear>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
}

/// What one forward call sees besides the token ids: positions and which cache slots are real.
pub struct ForwardInput {
    /// `[B, T]` token ids.
    pub ids: Vec<Vec<u32>>,
    /// `[B, T]` RoPE positions.
    pub positions: Vec<Vec<usize>>,
    /// `[B, T]` over the key slots: false for padding.
    pub key_valid: Vec<Vec<bool>>,
    /// `[B, T]` branch of each slot, or `None` for one causal sequence per row. A query sees
    /// the earlier keys of its own branch and of branch 0, the trunk (see
    /// [`ForwardInput::shared_prompts`]).
    pub branch: Option<Vec<Vec<u32>>>,
}

/// One prompt and the continuations sampled from it, for [`ForwardInput::shared_prompts`].
#[derive(Debug, Clone)]
pub struct SharedPrompt<'a> {
    /// The prompt's tokens (no padding); at least one.
    pub prompt: &'a [u32],
    /// Each continuation's tokens (no padding).
    pub continuations: Vec<&'a [u32]>,
}

/// One token to score: the hidden state at `(row, col)` predicts `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Batch row.
    pub row: usize,
    /// Column whose hidden state predicts the token.
    pub col: usize,
    /// The token.
    pub target: u32,
}

impl ForwardInput {
    /// A left- or right-padded batch with its attention mask, positions from `cumsum(mask)-1`.
    pub fn from_mask(ids: Vec<Vec<u32>>, mask: Vec<Vec<bool>>) -> Self {
        let positions = mask
            .iter()
            .map(|row| {
                let mut p = 0usize;
                row.iter()
                    .map(|&m| {
                        let here = p.saturating_sub(1);
                        if m {
                            p += 1;
                            p - 1
                        } else {
                            here
                        }
                    })
                    .collect()
            })
            .collect();
        Self { ids, positions, key_valid: mask, branch: None }
    }

    /// One row per group: its prompt once (branch 0), then each continuation (branch `i + 1`)
    /// at the positions it has after the prompt alone, seeing the prompt and its own earlier
    /// tokens only; rows right-padded with `pad_id`. Every output equals the one of
    /// `prompt + continuation` as its own sequence (up to float rounding), while the prompt's
    /// work is done once per group instead of once per continuation: for GRPO's n samples of a
    /// prompt about twice the prompt's length, that halves a training step's multiplies.
    ///
    /// Also returns what scores each continuation's tokens, in order (group by group,
    /// continuation by continuation, token by token): for [`crate::token_logprobs_at`].
    pub fn shared_prompts(groups: &[SharedPrompt<'_>], pad_id: u32) -> Result<(Self, Vec<Pick>)> {
        if groups.iter().any(|g| g.prompt.is_empty()) {
            return Err(EngineError::Request("shared-prompt rows need a prompt of at least one token".into()));
        }
        let width = groups.iter().map(|g| g.prompt.len() + g.continuations.iter().map(|c| c.len()).sum::<usize>()).max().unwrap_or(0);
        let mut input = Self { ids: vec![], positions: vec![], key_valid: vec![], branch: Some(vec![]) };
        let mut picks = Vec::new();
        for (row, g) in groups.iter().enumerate() {
            let p = g.prompt.len();
            let mut ids = g.prompt.to_vec();
            let mut positions: Vec<usize> = (0..p).collect();
            let mut branch = vec![0u32; p];
            for (i, c) in g.continuations.iter().enumerate() {
                let start = ids.len();
                for (k, &tok) in c.iter().enumerate() {
                    // The first token is predicted by the prompt's last one, the others by
                    // their own predecessor in this continuation.
                    picks.push(Pick { row, col: if k == 0 { p - 1 } else { start + k - 1 }, target: tok });
                }
                ids.extend_from_slice(c);
                positions.extend(p..p + c.len());
                branch.extend(std::iter::repeat_n(i as u32 + 1, c.len()));
            }
            let real = ids.len();
            ids.resize(width, pad_id);
            // A padding slot repeats the last position and sits in no branch (it is masked).
            let last = positions.last().copied().unwrap_or(0);
            positions.resize(width, last);
            branch.resize(width, u32::MAX);
            input.key_valid.push((0..width).map(|j| j < real).collect());
            input.ids.push(ids);
            input.positions.push(positions);
            if let Some(b) = input.branch.as_mut() {
                b.push(branch);
            }
        }
        Ok((input, picks))
    }

    /// Whether query slot `q` may not attend to key slot `j` of row `r`: a later slot, a padding
    /// key (except a slot's own, so no row is fully masked: its NaN would reach real rows
    /// through 0·NaN in the value product), or another continuation's token.
    fn masked(&self, r: usize, q: usize, j: usize) -> bool {
        if j > q || (!self.key_valid[r][j] && j != q) {
            return true;
        }
        match &self.branch {
            Some(b) => j != q && b[r][j] != 0 && b[r][j] != b[r][q],
            None => false,
        }
    }
}

/// A loaded model: its config and its weights.
#[derive(Module, Debug)]
pub struct CausalLm {
    /// Shapes and numerics.
    #[module(skip)]
    pub config: ModelConfig,
    /// Weights.
    pub net: Transformer,
    /// The LoRA adapter's shape, when the linears carry one (the other weights are then frozen).
    #[module(skip)]
    pub lora: Option<LoraConfig>,
}

impl CausalLm {
    /// Loads config and weights from a Hugging Face directory onto `device` (a directory with
    /// a LoRA adapter is refused: see [`WeightSet::load_dir`]).
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_from(dir, WeightSet::load_dir, device)
    }

    /// The base weights of a directory that also holds a LoRA adapter (a LoRA run's
    /// checkpoint), without it; the caller attaches it ([`Self::with_lora`]).
    pub fn load_base(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_from(dir, WeightSet::load_base_dir, device)
    }

    /// The config first: a directory without one is told so before its weights are read.
    fn load_from(dir: &Path, weights: fn(&Path) -> Result<WeightSet>, device: &Device) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let mut weights = weights(dir)?;
        let net = Transformer::from_weights(&config, &mut weights, device, 0)?;
        let extra: Vec<String> = weights
            .remaining()
            .into_iter()
            .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
            .collect();
        if !extra.is_empty() {
            tracing::warn!(dir = %dir.display(), "ignoring {} unexpected tensors, e.g. {}", extra.len(), extra[0]);
        }
        Ok(Self { config, net, lora: None })
    }

    /// A randomly initialised model (HF's init: N(0, 0.02) matrices, unit norms, zero biases).
    pub fn random(config: ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        let mut weights = WeightSet::from_map("<random init>", random_hf_tensors(&config, seed));
        let net = Transformer::from_weights(&config, &mut weights, device, 0)?;
        Ok(Self { config, net, lora: None })
    }

    /// Builds a model from HF-named host tensors (checkpoints, exports).
    pub fn from_hf_tensors(config: ModelConfig, tensors: BTreeMap<String, HostTensor>, device: &Device) -> Result<Self> {
        let mut weights = WeightSet::from_map("<tensors>", tensors.into_iter().collect());
        let net = Transformer::from_weights(&config, &mut weights, device, 0)?;
        Ok(Self { config, net, lora: None })
    }

    /// [`Self::from_hf_tensors`] for tensors that may hold a LoRA adapter's factors (a
    /// checkpoint's, an optimizer state's): with `lora`, they become the adapter.
    pub fn from_hf_tensors_with(config: ModelConfig, lora: Option<&LoraConfig>, mut tensors: BTreeMap<String, HostTensor>, device: &Device) -> Result<Self> {
        let factors = crate::lora::split_off(&mut tensors);
        let base = Self::from_hf_tensors(config, tensors, device)?;
        match lora {
            Some(cfg) => base.with_lora(&Adapter { config: cfg.clone(), tensors: factors }),
            None if !factors.is_empty() => Err(EngineError::Request("LoRA factors given for a model without an adapter".into())),
            None => Ok(base),
        }
    }

    /// Freezes every weight and adds `adapter` on the linears it targets: every factor its
    /// config implies must be there with its shape, and nothing else.
    pub fn with_lora(mut self, adapter: &Adapter) -> Result<Self> {
        if self.lora.is_some() {
            return Err(EngineError::Request("the model already has a LoRA adapter".into()));
        }
        adapter.check(&self.config)?;
        let cfg = &adapter.config;
        let device = self.device();
        let mut factors = adapter.tensors.clone();
        self.net = self.net.map(&mut Freeze);
        for (l, block) in self.net.layers.iter_mut().enumerate() {
            for (path, lin) in block.linears_mut() {
                if !cfg.adapts(path) {
                    continue;
                }
                let name = format!("model.layers.{l}.{path}");
                let (an, bn) = (format!("{name}.lora_A.weight"), format!("{name}.lora_B.weight"));
                let mut take = |n: &str| factors.remove(n).ok_or_else(|| EngineError::Request(format!("the LoRA adapter has no `{n}`")));
                let (a, b) = (take(&an)?, take(&bn)?);
                lin.lora = Some(Lora { a: transposed(a, &device, &an, 0), b: transposed(b, &device, &bn, 0), scale: cfg.scale() });
            }
        }
        self.lora = Some(cfg.clone());
        Ok(self)
    }

    /// Freezes every weight and adds a fresh adapter ([`Adapter::fresh`]: PEFT's init, `A`
    /// drawn from `seed`, `B` zero, so the model starts as the base model).
    pub fn with_fresh_lora(self, cfg: &LoraConfig, seed: u64) -> Result<Self> {
        let adapter = Adapter::fresh(&self.config, cfg, seed);
        self.with_lora(&adapter)
    }

    /// Elements of the adapter's factors (what trains), 0 without one.
    pub fn lora_params(&self) -> usize {
        let dims = |p: &Param<Tensor<2>>| p.val().dims().iter().product::<usize>();
        self.net.layers.iter().flat_map(|b| b.linears()).filter_map(|(_, l)| l.lora.as_ref()).map(|l| dims(&l.a) + dims(&l.b)).sum()
    }

    /// The adapter's current factors (PEFT layout), when the model has one.
    pub fn adapter(&self) -> Result<Option<Adapter>> {
        let Some(cfg) = &self.lora else { return Ok(None) };
        let mut all = self.to_hf_tensors()?;
        Ok(Some(Adapter { config: cfg.clone(), tensors: crate::lora::split_off(&mut all) }))
    }

    /// The weights by HF name with any adapter merged into them: a plain HF model's tensors,
    /// for rollout engines and exports.
    pub fn merged_hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        self.net.hf_tensors(&self.config, true)
    }

    /// Writes an HF model directory's weights and config (tokenizer files are the caller's).
    pub fn save_hf(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| EngineError::Io { path: dir.to_path_buf(), source })?;
        crate::weights::write_safetensors(&dir.join("model.safetensors"), &self.merged_hf_tensors()?, None)?;
        let cfg = serde_json::to_vec_pretty(&self.config.to_hf_json()).map_err(|e| EngineError::Tensor(e.to_string()))?;
        crate::weights::write_atomic(&dir.join("config.json"), &cfg)
    }

    /// Runs the transformer and returns logits `[B, T, V]`.
    pub fn forward(&self, input: &ForwardInput) -> Result<Tensor<3>> {
        let hidden = self.net.hidden_states(&self.config, input)?;
        Ok(self.net.logits(hidden))
    }

    /// The weights as HF-named host tensors (`[out, in]` layout), for export and checkpoints.
    /// The logits of each sequence's every position (`len × vocab` floats per sequence, on the
    /// host), from one right-padded batch: the reference other engines are compared with.
    pub fn logits_of(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let t = seqs.iter().map(Vec::len).max().unwrap_or(0);
        if t == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let ids: Vec<Vec<u32>> = seqs.iter().map(|s| s.iter().copied().chain(std::iter::repeat_n(0, t - s.len())).collect()).collect();
        let mask: Vec<Vec<bool>> = seqs.iter().map(|s| (0..t).map(|j| j < s.len()).collect()).collect();
        let v = self.config.vocab_size;
        let all = host_vec(self.forward(&ForwardInput::from_mask(ids, mask))?)?;
        Ok(seqs.iter().enumerate().map(|(i, s)| all[i * t * v..(i * t + s.len()) * v].to_vec()).collect())
    }

    /// With an adapter, its factors come as PEFT names them (`….q_proj.lora_A.weight`, `[r, in]`)
    /// next to the frozen base weights.
    pub fn to_hf_tensors(&self) -> Result<BTreeMap<String, HostTensor>> {
        self.net.hf_tensors(&self.config, false)
    }

    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.net.embed_tokens.val().device()
    }
}

/// Stops gradients of every parameter it maps (a LoRA run's base weights).
struct Freeze;

impl burn::module::ModuleMapper for Freeze {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.set_require_grad(false)
    }
}

impl Block {
    /// The linears by their path inside the block (`self_attn.q_proj`, …), in [`crate::lora::TARGETS`] order.
    pub fn linears(&self) -> [(&'static str, &Linear); 7] {
        [
            ("self_attn.q_proj", &self.q_proj),
            ("self_attn.k_proj", &self.k_proj),
            ("self_attn.v_proj", &self.v_proj),
            ("self_attn.o_proj", &self.o_proj),
            ("mlp.gate_proj", &self.gate_proj),
            ("mlp.up_proj", &self.up_proj),
            ("mlp.down_proj", &self.down_proj),
        ]
    }

    /// [`Self::linears`], mutable.
    pub fn linears_mut(&mut self) -> [(&'static str, &mut Linear); 7] {
        [
            ("self_attn.q_proj", &mut self.q_proj),
            ("self_attn.k_proj", &mut self.k_proj),
            ("self_attn.v_proj", &mut self.v_proj),
            ("self_attn.o_proj", &mut self.o_proj),
            ("mlp.gate_proj", &mut self.gate_proj),
            ("mlp.up_proj", &mut self.up_proj),
            ("mlp.down_proj", &mut self.down_proj),
        ]
    }
}

/// A parameter whose id is derived from its HF name (and a per-model salt), so a model
/// rebuilt from a checkpoint gets the same ids and its saved optimizer state applies again.
fn named<const D: usize>(t: Tensor<D>, name: &str, salt: u64) -> Param<Tensor<D>> {
    // FNV-1a: stable across runs and Rust versions, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut p = Param::from_tensor(t);
    p.id = ParamId::from(h);
    p
}

fn param1(t: HostTensor, device: &Device, name: &str, salt: u64) -> Param<Tensor<1>> {
    let n = t.data.len();
    named(Tensor::from_data(TensorData::new(t.data, [n]), device), name, salt)
}

/// HF `[out, in]` → our `[in, out]`.
fn transposed(t: HostTensor, device: &Device, name: &str, salt: u64) -> Param<Tensor<2>> {
    let (o, i) = (t.shape[0], t.shape[1]);
    named(Tensor::from_data(TensorData::new(transpose_rows(&t.data, o, i), [i, o]), device), name, salt)
}

/// Row-major `[rows, cols]` → row-major `[cols, rows]`.
fn transpose_rows(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// A tensor's values on the host, row-major.
pub(crate) fn host_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data().try_into_vec().map_err(|e| EngineError::Tensor(format!("{e:?}")))
}

fn host(t: Tensor<2>, transpose: bool) -> Result<HostTensor> {
    let [a, b] = t.dims();
    let data = host_vec(t)?;
    if !transpose {
        return Ok(HostTensor { shape: vec![a, b], data });
    }
    Ok(HostTensor { shape: vec![b, a], data: transpose_rows(&data, a, b) })
}

fn host1(t: Tensor<1>) -> Result<HostTensor> {
    let [n] = t.dims();
    Ok(HostTensor { shape: vec![n], data: host_vec(t)? })
}

impl Transformer {
    /// Builds the module from HF-named tensors, checking every shape against the config.
    pub fn from_weights(cfg: &ModelConfig, w: &mut WeightSet, device: &Device, salt: u64) -> Result<Self> {
        let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let lin = |w: &mut WeightSet, name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
            let (wn, bn) = (format!("{name}.weight"), format!("{name}.bias"));
            let weight = transposed(w.take(&wn, &[out, inp])?, device, &wn, salt);
            let bias = if bias { Some(param1(w.take(&bn, &[out])?, device, &bn, salt)) } else { None };
            Ok(Linear { weight, bias, lora: None })
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let q_proj = lin(w, &format!("{p}.self_attn.q_proj"), qd, h, cfg.qkv_bias)?;
            let k_proj = lin(w, &format!("{p}.self_attn.k_proj"), kvd, h, cfg.qkv_bias)?;
            let v_proj = lin(w, &format!("{p}.self_attn.v_proj"), kvd, h, cfg.qkv_bias)?;
            let o_proj = lin(w, &format!("{p}.self_attn.o_proj"), h, qd, cfg.o_bias)?;
            let gate_proj = lin(w, &format!("{p}.mlp.gate_proj"), i, h, cfg.mlp_bias)?;
            let up_proj = lin(w, &format!("{p}.mlp.up_proj"), i, h, cfg.mlp_bias)?;
            let down_proj = lin(w, &format!("{p}.mlp.down_proj"), h, i, cfg.mlp_bias)?;
            layers.push(Block {
                input_layernorm: RmsNorm {
                    weight: {
                        let n = format!("{p}.input_layernorm.weight");
                        param1(w.take(&n, &[h])?, device, &n, salt)
                    },
                    eps: cfg.rms_norm_eps,
                },
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                post_attention_layernorm: RmsNorm {
                    weight: {
                        let n = format!("{p}.post_attention_layernorm.weight");
                        param1(w.take(&n, &[h])?, device, &n, salt)
                    },
                    eps: cfg.rms_norm_eps,
                },
                gate_proj,
                up_proj,
                down_proj,
            });
        }
        let embed = w.take("model.embed_tokens.weight", &[v, h])?;
        let en = "model.embed_tokens.weight";
        let embed_tokens = if cfg.tie_word_embeddings {
            transposed(embed, device, en, salt)
        } else {
            named(Tensor::from_data(TensorData::new(embed.data, [v, h]), device), en, salt)
        };
        let nn = "model.norm.weight";
        let norm = RmsNorm { weight: param1(w.take(nn, &[h])?, device, nn, salt), eps: cfg.rms_norm_eps };
        let lm_head = if cfg.tie_word_embeddings {
            // Some exporters write a copy of the tied head; it must not become a second parameter.
            if w.contains("lm_head.weight") {
                w.take("lm_head.weight", &[v, h])?;
            }
            None
        } else {
            Some(lin(w, "lm_head", v, h, false)?)
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            tied: cfg.tie_word_embeddings,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            rope_theta: cfg.rope_theta,
        })
    }

    /// The residual stream after the final norm, `[B, T, hidden]`.
    pub fn hidden_states(&self, cfg: &ModelConfig, input: &ForwardInput) -> Result<Tensor<3>> {
        let device = self.embed_tokens.val().device();
        let b = input.ids.len();
        let t = input.ids.first().map_or(0, Vec::len);
        if b == 0 || t == 0 {
            return Err(EngineError::Request("empty batch".into()));
        }
        if input.ids.iter().any(|r| r.len() != t) || input.positions.iter().any(|r| r.len() != t) {
            return Err(EngineError::Request("ragged batch: every row must have the same length (pad it)".into()));
        }
        if input.key_valid.len() != b || input.key_valid.iter().any(|r| r.len() != t) {
            return Err(EngineError::Request(format!("key mask must be [{b}, {t}]")));
        }
        if input.branch.as_ref().is_some_and(|br| br.len() != b || br.iter().any(|r| r.len() != t)) {
            return Err(EngineError::Request(format!("branches must be [{b}, {t}]")));
        }
        if let Some(&bad) = input.ids.iter().flatten().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(EngineError::Request(format!("token id {bad} is outside the vocabulary (size {})", cfg.vocab_size)));
        }
        let (nh, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let g = nh / kvh;

        let ids: Vec<i64> = input.ids.iter().flatten().map(|&x| x as i64).collect();
        let mut x = if self.tied {
            let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [b * t]), &device);
            let cols = self.embed_tokens.val().select(1, ids);
            let [hd_, _] = cols.dims();
            cols.transpose().reshape([b, t, hd_])
        } else {
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t]), &device);
            embedding(self.embed_tokens.val(), ids)
        };

        let angles = rope_table(&input.positions, hd, self.rope_theta, &device);
        let mask = attention_mask(input, g, &device).expand([b, kvh, g * t, t]);

        for block in &self.layers {
            let h = block.input_layernorm.forward(x.clone());
            // RoPE on the projections' own `[B·T, heads · hd]` rows, before the heads split off.
            let rotated = |y: Tensor<3>, heads: usize| rope(y.reshape([b * t, heads * hd]), angles.clone()).reshape([b, t, heads, hd]).swap_dims(1, 2);
            let q = rotated(block.q_proj.forward(h.clone()), nh);
            let k = rotated(block.k_proj.forward(h.clone()), kvh);
            let v = block.v_proj.forward(h).reshape([b, t, kvh, hd]).swap_dims(1, 2);
            // GQA without copying keys: the g query heads that share a KV head become extra
            // query rows against that head (row = group_member * T + t).
            let q = q.reshape([b, kvh, g * t, hd]);
            let a = attention(q, k, v, Some(mask.clone()), None, AttentionModuleOptions::default());
            let a = a.reshape([b, nh, t, hd]).swap_dims(1, 2).reshape([b, t, nh * hd]);
            x = x + block.o_proj.forward(a);
            let h = block.post_attention_layernorm.forward(x.clone());
            let m = swiglu(block.gate_proj.forward(h.clone()), block.up_proj.forward(h));
            x = x + block.down_proj.forward(m);
        }
        Ok(self.norm.forward(x))
    }

    /// The LM head's weight, `[hidden, vocab]` (tied or not; neither architecture has a bias).
    pub fn head_weight(&self) -> Tensor<2> {
        match &self.lm_head {
            Some(head) => head.weight.val(),
            None => self.embed_tokens.val(),
        }
    }

    /// LM-head projection of normed hidden states.
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => linear_rows(hidden, self.embed_tokens.val(), None),
        }
    }

    /// Exports weights under their HF names in HF layout (what a model without LoRA has).
    pub fn to_hf_tensors(&self, cfg: &ModelConfig) -> Result<BTreeMap<String, HostTensor>> {
        self.hf_tensors(cfg, false)
    }

    /// The weights under their HF names in HF layout; LoRA adapters merged into their linears
    /// (`merged`) or exported beside them as PEFT names their factors.
    pub fn hf_tensors(&self, cfg: &ModelConfig, merged: bool) -> Result<BTreeMap<String, HostTensor>> {
        let mut out = BTreeMap::new();
        let put_lin = |out: &mut BTreeMap<String, HostTensor>, name: String, l: &Linear| -> Result<()> {
            let w = if merged { l.effective_weight() } else { l.weight.val() };
            out.insert(format!("{name}.weight"), host(w, true)?);
            if let Some(b) = &l.bias {
                out.insert(format!("{name}.bias"), host1(b.val())?);
            }
            if let (Some(lora), false) = (&l.lora, merged) {
                out.insert(format!("{name}.lora_A.weight"), host(lora.a.val(), true)?);
                out.insert(format!("{name}.lora_B.weight"), host(lora.b.val(), true)?);
            }
            Ok(())
        };
        for (i, blk) in self.layers.iter().enumerate() {
            for (path, lin) in blk.linears() {
                put_lin(&mut out, format!("model.layers.{i}.{path}"), lin)?;
            }
            let p = format!("model.layers.{i}");
            out.insert(format!("{p}.input_layernorm.weight"), host1(blk.input_layernorm.weight.val())?);
            out.insert(format!("{p}.post_attention_layernorm.weight"), host1(blk.post_attention_layernorm.weight.val())?);
        }
        out.insert("model.embed_tokens.weight".into(), host(self.embed_tokens.val(), self.tied)?);
        out.insert("model.norm.weight".into(), host1(self.norm.weight.val())?);
        if let Some(head) = &self.lm_head {
            put_lin(&mut out, "lm_head".into(), head)?;
        }
        debug_assert_eq!(cfg.num_layers, self.layers.len());
        Ok(out)
    }
}

/// A model directory's weights, or — for a directory with only `config.json` — HF-style
/// random weights drawn with `seed`; `true` when they are random. Benchmarks and the
/// self-test take a model's shape this way.
pub fn weights_or_random(dir: &Path, cfg: &ModelConfig, seed: u64) -> Result<(std::collections::HashMap<String, HostTensor>, bool)> {
    if dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file() {
        Ok((WeightSet::load_dir(dir)?.into_map(), false))
    } else {
        Ok((random_hf_tensors(cfg, seed), true))
    }
}

/// Tensors with more values than this are drawn in chunks of this many, each chunk from its own
/// stream of the seed, on all cores; smaller ones in order from the seed's first stream. A
/// 1.5B model's 1.5e9 values take about 30 s on one core, and a benchmark draws them in every
/// process; tiny models (every test's, the quickstart's) have no tensor this large, so their
/// weights are what one stream in order gives.
const RANDOM_CHUNK: usize = 1 << 20;

/// HF-style random weights for every tensor the config implies (deterministic in `seed`).
pub fn random_hf_tensors(cfg: &ModelConfig, seed: u64) -> std::collections::HashMap<String, HostTensor> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    use rayon::prelude::*;
    let normal = Normal::new(0.0f32, 0.02).expect("valid normal");
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    // The normal-initialised matrices, in the order they are drawn.
    let mut mats: Vec<(String, usize, usize)> = vec![("model.embed_tokens.weight".into(), v, h)];
    let mut out = std::collections::HashMap::new();
    let ones = |n: usize| HostTensor { shape: vec![n], data: vec![1.0; n] };
    let zeros = |n: usize| HostTensor { shape: vec![n], data: vec![0.0; n] };
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        for (name, o, inp, bias) in [
            ("self_attn.q_proj", qd, h, cfg.qkv_bias),
            ("self_attn.k_proj", kvd, h, cfg.qkv_bias),
            ("self_attn.v_proj", kvd, h, cfg.qkv_bias),
            ("self_attn.o_proj", h, qd, cfg.o_bias),
            ("mlp.gate_proj", i, h, cfg.mlp_bias),
            ("mlp.up_proj", i, h, cfg.mlp_bias),
            ("mlp.down_proj", h, i, cfg.mlp_bias),
        ] {
            mats.push((format!("{p}.{name}.weight"), o, inp));
            if bias {
                out.insert(format!("{p}.{name}.bias"), zeros(o));
            }
        }
        out.insert(format!("{p}.input_layernorm.weight"), ones(h));
        out.insert(format!("{p}.post_attention_layernorm.weight"), ones(h));
    }
    out.insert("model.norm.weight".into(), ones(h));
    if !cfg.tie_word_embeddings {
        mats.push(("lm_head.weight".into(), v, h));
    }
    let mut first = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (t, (name, rows, cols)) in mats.into_iter().enumerate() {
        let n = rows * cols;
        let data = if n <= RANDOM_CHUNK {
            (0..n).map(|_| normal.sample(&mut first)).collect()
        } else {
            let mut data = vec![0f32; n];
            data.par_chunks_mut(RANDOM_CHUNK).enumerate().for_each(|(c, chunk)| {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                // Stream 0 is the in-order draws'; tensor t's chunk c has its own.
                rng.set_stream(((t as u64 + 1) << 32) | c as u64);
                chunk.iter_mut().for_each(|x| *x = normal.sample(&mut rng));
            });
            data
        };
        out.insert(name, HostTensor { shape: vec![rows, cols], data });
    }
    out
}

/// `[B, 1, g*T, T]`, true where attention is forbidden ([`ForwardInput::masked`]).
fn attention_mask(input: &ForwardInput, g: usize, device: &Device) -> Tensor<4, Bool> {
    let b = input.ids.len();
    let t = input.ids[0].len();
    let mut m = Vec::with_capacity(b * g * t * t);
    for r in 0..b {
        for _ in 0..g {
            for q in 0..t {
                m.extend((0..t).map(|j| input.masked(r, q, j)));
            }
        }
    }
    Tensor::from_data(TensorData::new(m, [b, 1, g * t, t]), device)
}

#[cfg(test)]
mod random_init_tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    fn config(vocab: usize, hidden: usize) -> ModelConfig {
        let json = format!(
            r#"{{"model_type": "qwen2", "hidden_size": {hidden}, "intermediate_size": {}, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": {vocab}, "max_position_embeddings": 64,
            "tie_word_embeddings": false}}"#,
            2 * hidden
        );
        ModelConfig::from_json_str(&json, std::path::Path::new("config.json")).expect("config")
    }

    #[test]
    fn small_tensors_are_one_stream_in_order_and_large_ones_chunked_deterministically() {
        // Every tensor small: the draws are the seed's one stream, tensor after tensor (what
        // tests and the quickstart were written against).
        let cfg = config(98, 64);
        let got = random_hf_tensors(&cfg, 5);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let normal = Normal::new(0.0f32, 0.02).expect("normal");
        let mut names = vec!["model.embed_tokens.weight".to_string()];
        for l in 0..2 {
            for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                names.push(format!("model.layers.{l}.{m}.weight"));
            }
        }
        names.push("lm_head.weight".into());
        for name in &names {
            let t = &got[name];
            let want: Vec<f32> = (0..t.data.len()).map(|_| normal.sample(&mut rng)).collect();
            assert_eq!(t.data, want, "{name}");
        }
        assert_eq!(got["model.layers.1.self_attn.q_proj.bias"].data, vec![0.0; 64]);
        assert_eq!(got["model.norm.weight"].data, vec![1.0; 64]);

        // An embedding of 2.5 chunks: the same for the same seed, each chunk its own draws,
        // normal(0, 0.02) throughout, and the small tensors after it still the first stream's.
        let cfg = config(40_960, 64);
        let (a, b) = (random_hf_tensors(&cfg, 5), random_hf_tensors(&cfg, 5));
        let e = &a["model.embed_tokens.weight"].data;
        assert_eq!(e.len(), 40_960 * 64);
        assert_eq!(e, &b["model.embed_tokens.weight"].data);
        assert_ne!(e[..1000], e[RANDOM_CHUNK..RANDOM_CHUNK + 1000]);
        assert_ne!(e[..1000], random_hf_tensors(&cfg, 6)["model.embed_tokens.weight"].data[..1000]);
        let tail = &e[2 * RANDOM_CHUNK..];
        let mean = tail.iter().map(|&x| x as f64).sum::<f64>() / tail.len() as f64;
        let std = (tail.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / tail.len() as f64).sqrt();
        assert!(mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3, "mean {mean}, std {std}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let q: Vec<f32> = (0..64 * 64).map(|_| normal.sample(&mut rng)).collect();
        assert_eq!(a["model.layers.0.self_attn.q_proj.weight"].data, q);
    }
}
