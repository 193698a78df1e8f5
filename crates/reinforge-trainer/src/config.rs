//! The run configuration: TOML sections named like verl's, dotted command-line overrides,
//! unknown keys reported with the nearest valid key, and validation before any work starts.

use crate::roles::MicroBatching;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Errors in the config: each says which key, where, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The config file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// TOML syntax error.
    #[error("{path}: invalid TOML: {msg}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// The parser's message.
        msg: String,
    },
    /// A key that does not exist.
    #[error("{origin}: unknown key `{key}`{suggestion}")]
    UnknownKey {
        /// File or override that named it.
        origin: String,
        /// Full dotted key.
        key: String,
        /// ` — did you mean `x`?` or the list of valid keys.
        suggestion: String,
    },
    /// A key with a value of the wrong type or out of range.
    #[error("{origin}: `{key}`: {msg}")]
    BadValue {
        /// File or override.
        origin: String,
        /// Full dotted key.
        key: String,
        /// What is wrong.
        msg: String,
    },
    /// A malformed `key=value` override.
    #[error("override `{0}` must look like section.key=value (e.g. actor.lr=1e-6)")]
    Override(String),
    /// Values that are fine alone but not together.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// Synthetic prompts generated at start-up instead of read from files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GenerateSpec {
    /// `arith` or `countdown`.
    pub kind: String,
    /// Rows to generate.
    pub n: usize,
    /// Generator seed.
    #[serde(default)]
    pub seed: u64,
    /// Generator options (see `reinforge data gen --help`).
    #[serde(default = "empty_table")]
    pub params: toml::Table,
}

fn empty_table() -> toml::Table {
    toml::Table::new()
}

/// `[data]`: where prompts come from and how they are batched.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Parquet/JSONL/JSON files in verl's schema.
    pub train_files: Vec<PathBuf>,
    /// Validation files.
    pub val_files: Vec<PathBuf>,
    /// Generate the training set instead of reading files.
    pub generate: Option<GenerateSpec>,
    /// Generate the validation set instead of reading files.
    pub val_generate: Option<GenerateSpec>,
    /// Column holding the chat messages.
    pub prompt_key: String,
    /// Prompts longer than this (in tokens, after the chat template) are filtered out.
    pub max_prompt_length: usize,
    /// New tokens per response at most.
    pub max_response_length: usize,
    /// Prompts per step.
    pub train_batch_size: usize,
    /// Prompts per generation round with `algorithm.filter_groups` (verl's name); unset,
    /// `train_batch_size`.
    pub gen_batch_size: Option<usize>,
    /// Prompts per validation batch (all at once when unset).
    pub val_batch_size: Option<usize>,
    /// Shuffle each epoch (seeded).
    pub shuffle: bool,
    /// Loader seed.
    pub seed: u64,
    /// `fail` (default) or `skip` malformed rows.
    pub on_bad_row: String,
    /// Use at most this many training rows.
    pub max_samples: Option<usize>,
    /// Apply the chat template (false: the first message's content is the raw prompt).
    pub apply_chat_template: bool,
    /// Extra variables for the chat template (verl's name; HF's `apply_chat_template`
    /// keyword arguments), e.g. `{ enable_thinking = false }` for Qwen3.
    pub apply_chat_template_kwargs: toml::Table,
    /// `data_source` for rows without one (it picks the rule reward; unused by a reward model).
    pub default_data_source: Option<String>,
    /// Whether a row without `reward_model.ground_truth` is malformed (a reward model or a
    /// reward server that needs no answer: set false).
    pub require_ground_truth: bool,
    /// Read the ground truth from this top-level column instead of
    /// `reward_model.ground_truth` (OpenRLHF's `--label_key`).
    pub label_key: Option<String>,
    /// Read a ground truth string that holds a JSON object as that object (a struct stored
    /// in a string column). Unset: yes, except for Python and OpenRLHF-protocol rewards,
    /// which get the string as verl and OpenRLHF pass it.
    pub decode_json_ground_truth: Option<bool>,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            train_files: Vec::new(),
            val_files: Vec::new(),
            generate: None,
            val_generate: None,
            prompt_key: "prompt".into(),
            max_prompt_length: 512,
            max_response_length: 256,
            train_batch_size: 16,
            gen_batch_size: None,
            val_batch_size: None,
            shuffle: true,
            seed: 1,
            on_bad_row: "fail".into(),
            max_samples: None,
            apply_chat_template: true,
            apply_chat_template_kwargs: toml::Table::new(),
            default_data_source: None,
            require_ground_truth: true,
            label_key: None,
            decode_json_ground_truth: None,
        }
    }
}

/// `[actor]`: the trained policy and its PPO update.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ActorConfig {
    /// Known model name or HF directory.
    pub model: String,
    /// `pretrained` (load weights) or `random` (config + tokenizer only, N(0, 0.02) init).
    pub init: String,
    /// Seed for `init = "random"`.
    pub init_seed: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps.
    pub lr_warmup_steps: usize,
    /// Warmup as a fraction of the run's steps, when `lr_warmup_steps` is 0 (verl's
    /// `lr_warmup_steps_ratio`, OpenRLHF's `--lr_warmup_ratio`).
    pub lr_warmup_ratio: f64,
    /// `constant` or `cosine` after warmup.
    pub lr_scheduler: String,
    /// Cosine floor as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW betas.
    pub betas: [f32; 2],
    /// Global grad-norm clip (0 = off).
    pub grad_clip: f64,
    /// Prompts per optimizer step (× rollout.n sequences).
    pub ppo_mini_batch_size: usize,
    /// Sequences per optimizer step, when a mini-batch is not whole prompts (Search-R1 counts
    /// its mini-batch so; a prompt's samples may then fall in two mini-batches, which changes
    /// nothing since advantages are computed before); overrides `ppo_mini_batch_size`.
    pub ppo_mini_batch_sequences: Option<usize>,
    /// Sequences per forward/backward (gradient accumulation unit).
    pub ppo_micro_batch_size: usize,
    /// Micro-batches by tokens instead of sequences (verl's name): in batch order, as many
    /// sequences as fit `ppo_max_token_len_per_gpu`, for the update and the old and reference
    /// log-prob passes; `ppo_micro_batch_size` is then unused.
    pub use_dynamic_bsz: bool,
    /// Tokens (prompt + response, per rank) per micro-batch with `use_dynamic_bsz`.
    pub ppo_max_token_len_per_gpu: usize,
    /// Passes over each batch.
    pub ppo_epochs: usize,
    /// Shuffle sequences before splitting into mini-batches.
    pub shuffle: bool,
    /// PPO clip ε.
    pub clip_ratio: f64,
    /// Lower clip (default `clip_ratio`).
    pub clip_ratio_low: Option<f64>,
    /// Upper clip (default `clip_ratio`).
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip constant (> 1).
    pub clip_ratio_c: f64,
    /// token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm, token-sum.
    pub loss_agg_mode: String,
    /// `[actor.policy_loss]`: which policy loss, and its own settings (verl's section).
    pub policy_loss: PolicyLossSection,
    /// SAPO's gate temperature for tokens with a positive advantage.
    pub tau_pos: f64,
    /// SAPO's gate temperature for the others.
    pub tau_neg: f64,
    /// Entropy bonus coefficient.
    pub entropy_coeff: f64,
    /// KL to the reference as a loss term.
    pub use_kl_loss: bool,
    /// Its coefficient.
    pub kl_loss_coef: f64,
    /// Its estimator (kl, abs, mse, low_var_kl, with optional `+`).
    pub kl_loss_type: String,
    /// Recompute activations in backward to save memory.
    pub gradient_checkpointing: bool,
    /// Compute each prompt once for all its samples in a micro-batch (log-probs and update;
    /// on the CUDA engine the critic's values and update too), where that costs less than one
    /// row per sample; the numbers are the same up to rounding.
    pub share_prompts: bool,
    /// LoRA rank (verl's `lora_rank`, OpenRLHF's `--lora_rank`): with r > 0 only a rank-r
    /// adapter on `target_modules` trains, the model's own weights stay frozen; 0 = full
    /// fine-tuning.
    pub lora_rank: usize,
    /// LoRA's `alpha`: the adapter's update is scaled by `lora_alpha / lora_rank`.
    pub lora_alpha: f64,
    /// The linears LoRA adapts: `all-linear` (every one but the LM head) or names among
    /// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; a string or a list.
    #[serde(deserialize_with = "one_or_many")]
    pub target_modules: Vec<String>,
    /// A PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`) to start
    /// from instead of a fresh adapter (verl's `lora_adapter_path`): LoRA is then on, with the
    /// adapter's own rank, alpha and targets.
    pub lora_adapter_path: Option<PathBuf>,
}

impl Default for ActorConfig {
    fn default() -> Self {
        Self {
            model: String::new(),
            init: "pretrained".into(),
            init_seed: 0,
            lr: 1e-6,
            lr_warmup_steps: 0,
            lr_warmup_ratio: 0.0,
            lr_scheduler: "constant".into(),
            min_lr_ratio: 0.0,
            weight_decay: 0.01,
            betas: [0.9, 0.999],
            grad_clip: 1.0,
            ppo_mini_batch_size: 16,
            ppo_mini_batch_sequences: None,
            ppo_micro_batch_size: 8,
            use_dynamic_bsz: false,
            ppo_max_token_len_per_gpu: 16384,
            ppo_epochs: 1,
            shuffle: false,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
            loss_agg_mode: "token-mean".into(),
            policy_loss: PolicyLossSection::default(),
            tau_pos: 1.0,
            tau_neg: 1.05,
            entropy_coeff: 0.0,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_loss_type: "low_var_kl".into(),
            gradient_checkpointing: false,
            share_prompts: true,
            lora_rank: 0,
            lora_alpha: 16.0,
            target_modules: vec!["all-linear".into()],
            lora_adapter_path: None,
        }
    }
}

/// `[actor.policy_loss]`: verl's `policy_loss` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyLossSection {
    /// vanilla, dppo_tv, dppo_kl, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, dro, cispo.
    pub loss_mode: String,
    /// clip_cov: share of the valid tokens whose gradient is dropped.
    pub clip_cov_ratio: f64,
    /// clip_cov: lower bound of a candidate's advantage–log-prob covariance.
    pub clip_cov_lb: f64,
    /// clip_cov: upper bound of it.
    pub clip_cov_ub: f64,
    /// kl_cov: share of the valid tokens that get the KL term.
    pub kl_cov_ratio: f64,
    /// kl_cov: coefficient of that term.
    pub ppo_kl_coef: f64,
    /// dro: weight of the squared log ratio (required with `dro`).
    pub dro_beta: Option<f64>,
}

impl Default for PolicyLossSection {
    fn default() -> Self {
        let d = reinforge_algos::PolicyLossConfig::default();
        Self {
            loss_mode: d.loss_mode.as_str().into(),
            clip_cov_ratio: d.clip_cov_ratio,
            clip_cov_lb: d.clip_cov_lb,
            clip_cov_ub: d.clip_cov_ub,
            kl_cov_ratio: d.kl_cov_ratio,
            ppo_kl_coef: d.ppo_kl_coef,
            dro_beta: d.dro_beta,
        }
    }
}

/// `[rollout]`: sampling for training and validation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Samples per prompt.
    pub n: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Extra stop strings.
    pub stop: Vec<String>,
    /// Validation temperature (0 = greedy).
    pub val_temperature: f32,
    /// Validation's nucleus mass (verl's `val_kwargs.top_p`); unset, `top_p`.
    pub val_top_p: Option<f32>,
    /// Validation's top-k (verl's `val_kwargs.top_k`; 0 = off); unset, `top_k`.
    pub val_top_k: Option<usize>,
    /// Validation samples per prompt (pass@k uses them).
    pub val_n: usize,
    /// Fraction of the GPU's memory the process may fill, the rollout's KV cache included
    /// (verl's name; the CUDA engine only).
    pub gpu_memory_utilization: f64,
    /// Decode kernel by kernel instead of replaying each step as a CUDA graph (verl's name,
    /// after vLLM's; the CUDA engine only).
    pub enforce_eager: bool,
    /// Queue each decode step before the host has read the last one's tokens, so the GPU does
    /// not wait for the host between steps (vLLM's name; the CUDA engine only). Each row gets
    /// the same inputs either way.
    pub async_scheduling: bool,
    /// Sequences decoded at once at most (verl's name, after vLLM's; the CUDA engine only,
    /// which decodes 1024 at once at most): the others wait for running ones to finish.
    pub max_num_seqs: usize,
    /// Prompt tokens one prefill pass takes at most (verl's name, after vLLM's; the CUDA
    /// engine only): more prompts than that are prefilled in turns between decode steps.
    pub max_num_batched_tokens: usize,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            n: 4,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            val_temperature: 0.0,
            val_top_p: None,
            val_top_k: None,
            val_n: 1,
            gpu_memory_utilization: 0.5,
            enforce_eager: false,
            async_scheduling: true,
            max_num_seqs: reinforge_cuda::rollout::DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: reinforge_cuda::rollout::DEFAULT_MAX_NUM_BATCHED_TOKENS,
        }
    }
}

impl RolloutConfig {
    /// The temperature actor, rollout and reference log-probs are taken at: the sampling one,
    /// kept above 0 so greedy rollouts (`temperature = 0`) still give finite log-probs.
    pub fn logprob_temperature(&self) -> f64 {
        self.temperature.max(1e-6) as f64
    }
}

/// `[ref]`: the frozen reference policy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RefConfig {
    /// Force on/off; by default on exactly when a KL term needs it.
    pub enable: Option<bool>,
}

/// `[critic]`: the value model (GAE only).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CriticConfig {
    /// Force on/off; by default on exactly when `algorithm.adv_estimator = "gae"`.
    pub enable: Option<bool>,
    /// Backbone (default: the actor's model).
    pub model: Option<String>,
    /// Learning rate.
    pub lr: f64,
    /// Linear warmup steps.
    pub lr_warmup_steps: usize,
    /// Warmup as a fraction of the run's steps, when `lr_warmup_steps` is 0.
    pub lr_warmup_ratio: f64,
    /// Value clip range.
    pub cliprange_value: f64,
    /// Sequences per forward/backward.
    pub ppo_micro_batch_size: usize,
    /// Micro-batches by tokens (as `actor.use_dynamic_bsz`), for the update and the values pass.
    pub use_dynamic_bsz: bool,
    /// Tokens per micro-batch with `use_dynamic_bsz`.
    pub ppo_max_token_len_per_gpu: usize,
    /// Global grad-norm clip (0 = off).
    pub grad_clip: f64,
    /// Loss aggregation.
    pub loss_agg_mode: String,
    /// AdamW weight decay.
    pub weight_decay: f32,
}

impl Default for CriticConfig {
    fn default() -> Self {
        Self {
            enable: None,
            model: None,
            lr: 1e-5,
            lr_warmup_steps: 0,
            lr_warmup_ratio: 0.0,
            cliprange_value: 0.5,
            ppo_micro_batch_size: 8,
            use_dynamic_bsz: false,
            ppo_max_token_len_per_gpu: 32768,
            grad_clip: 1.0,
            loss_agg_mode: "token-mean".into(),
            weight_decay: 0.01,
        }
    }
}

/// `[reward]`: which reward function scores responses (see reinforge-reward's kinds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// Reward kind: router (by data_source), countdown, math, qa_em, qa_f1, format, length,
    /// remote, combined.
    pub kind: String,
    /// That kind's parameters.
    pub params: toml::Table,
    /// Whiten scores over each batch before advantages.
    pub normalize: bool,
    /// `[reward.overlong_buffer]`: DAPO's penalty on responses that run into the length limit.
    pub overlong_buffer: OverlongBuffer,
    /// ProRL's "stop properly" penalty (OpenRLHF's `--stop_properly_penalty_coef`) on
    /// responses cut at the length limit: in [0, 1] it scales their score, below 0 it
    /// replaces it. Applied after the overlong penalty, as OpenRLHF does. Unset: off.
    pub stop_properly_penalty_coef: Option<f64>,
    /// `[reward.val]`: the reward validation scores with, when it is not this one (Search-R1
    /// validates with plain EM while training with format scores). Unset: the same.
    pub val: Option<ValReward>,
}

/// Whether a reward `kind` with `params` is, or routes or adds up to, a Python function or
/// an OpenRLHF reward server.
fn spec_reads_stored(kind: &str, params: &toml::Table) -> bool {
    let nested = |v: &toml::Value| {
        v.as_table().is_some_and(|t| {
            let kind = t.get("kind").and_then(toml::Value::as_str).unwrap_or_default();
            let empty = toml::Table::new();
            spec_reads_stored(kind, t.get("params").and_then(toml::Value::as_table).unwrap_or(&empty))
        })
    };
    let list = |key: &str| params.get(key).and_then(toml::Value::as_array).is_some_and(|items| items.iter().any(|i| i.get("reward").is_some_and(nested)));
    match kind {
        "python" => true,
        "remote" => params.get("protocol").and_then(toml::Value::as_str) == Some("openrlhf"),
        "router" => list("routes") || params.get("default").is_some_and(nested),
        "combined" => list("components"),
        _ => false,
    }
}

/// A reward for validation only: a kind and its parameters, as `[reward]` names them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ValReward {
    /// Reward kind.
    pub kind: String,
    /// That kind's parameters.
    #[serde(default)]
    pub params: toml::Table,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self { kind: "router".into(), params: toml::Table::new(), normalize: false, overlong_buffer: OverlongBuffer::default(), stop_properly_penalty_coef: None, val: None }
    }
}

impl RewardConfig {
    /// Whether the reward training (`validation = false`) or validation scores with is, or
    /// routes to, user code written against verl's or OpenRLHF's data (a `python` function,
    /// an OpenRLHF reward server): its dataset then keeps ground truths as stored.
    pub fn reads_stored_ground_truth(&self, validation: bool) -> bool {
        match (&self.val, validation) {
            (Some(v), true) => spec_reads_stored(&v.kind, &v.params),
            _ => spec_reads_stored(&self.kind, &self.params),
        }
    }

    /// A response's score after the length penalties: `raw` the reward's, `tokens` its
    /// length, `limit` the data's response limit, `truncated` whether it was cut there.
    pub fn shaped(&self, raw: f64, tokens: usize, limit: usize, truncated: bool) -> f64 {
        let score = raw + self.overlong_buffer.penalty(tokens, limit).unwrap_or(0.0);
        match self.stop_properly_penalty_coef {
            Some(c) if truncated && c < 0.0 => c,
            Some(c) if truncated => score * c,
            _ => score,
        }
    }
}

/// DAPO's soft overlong punishment (verl's `dapo` reward manager, `overlong_buffer_cfg`): a
/// training response longer than `max_resp_len - len` tokens loses `penalty_factor` × the
/// share of the last `len` tokens it used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OverlongBuffer {
    /// On or off.
    pub enable: bool,
    /// Tokens before the limit where the penalty starts.
    pub len: usize,
    /// The penalty at the limit.
    pub penalty_factor: f64,
    /// The limit (verl's `max_resp_len`); unset, `data.max_response_length`.
    pub max_resp_len: Option<usize>,
}

impl Default for OverlongBuffer {
    fn default() -> Self {
        Self { enable: false, len: 0, penalty_factor: 1.0, max_resp_len: None }
    }
}

impl OverlongBuffer {
    /// The penalty (≤ 0) of a response of `tokens` tokens when on, with `limit` the data's
    /// response limit; `None` when off.
    pub fn penalty(&self, tokens: usize, limit: usize) -> Option<f64> {
        if !self.enable {
            return None;
        }
        let expected = self.max_resp_len.unwrap_or(limit) as f64 - self.len as f64;
        let exceed = tokens as f64 - expected;
        Some((-exceed / self.len as f64 * self.penalty_factor).min(0.0))
    }
}

/// `[algorithm.kl_ctrl]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KlCtrlConfig {
    /// `fixed` or `adaptive`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Initial coefficient.
    pub kl_coef: f64,
    /// Adaptive target.
    pub target_kl: f64,
    /// Adaptive horizon.
    pub horizon: f64,
}

impl Default for KlCtrlConfig {
    fn default() -> Self {
        Self { kind: "fixed".into(), kl_coef: 0.001, target_kl: 0.1, horizon: 10000.0 }
    }
}

/// `[algorithm]`: advantages and KL.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmConfig {
    /// gae, grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax.
    pub adv_estimator: String,
    /// Discount.
    pub gamma: f64,
    /// GAE λ.
    pub lam: f64,
    /// GRPO divides by the group std (false = Dr.GRPO).
    pub norm_adv_by_std_in_grpo: bool,
    /// Subtract β·KL from token rewards.
    pub use_kl_in_reward: bool,
    /// Estimator for the in-reward KL.
    pub kl_penalty: String,
    /// KL coefficient controller.
    pub kl_ctrl: KlCtrlConfig,
    /// `[algorithm.filter_groups]`: DAPO's dynamic sampling.
    pub filter_groups: FilterGroups,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        Self {
            adv_estimator: "grpo".into(),
            gamma: 1.0,
            lam: 1.0,
            norm_adv_by_std_in_grpo: true,
            use_kl_in_reward: false,
            kl_penalty: "kl".into(),
            kl_ctrl: KlCtrlConfig::default(),
            filter_groups: FilterGroups::default(),
        }
    }
}

/// DAPO's dynamic sampling (verl's `algorithm.filter_groups`): a prompt whose samples all
/// score alike teaches nothing under a group baseline, so it is dropped and more prompts are
/// generated until the step has `data.train_batch_size` prompts that differ.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterGroups {
    /// On or off.
    pub enable: bool,
    /// What must differ within a group: `acc` or `score` (the reward's score, or the entry of
    /// that name a reward returns: a Python function's dict, OpenRLHF's `scores`), `seq_reward`
    /// (the score with the overlong penalty), `seq_final_reward` (the same: without a KL
    /// in the reward).
    pub metric: String,
    /// Generation rounds a step may take before it fails (0: no limit).
    pub max_num_gen_batches: usize,
    /// OpenRLHF's rule instead of verl's: keep a prompt when the mean of its samples' metric
    /// lies strictly inside `(lo, hi)` (`--dynamic_filtering_reward_range`).
    pub reward_range: Option<[f64; 2]>,
}

impl Default for FilterGroups {
    fn default() -> Self {
        Self { enable: false, metric: "acc".into(), max_num_gen_batches: 0, reward_range: None }
    }
}

impl FilterGroups {
    /// The metrics verl's DAPO trainer reads.
    pub const METRICS: [&'static str; 4] = ["acc", "score", "seq_reward", "seq_final_reward"];

    /// Whether the metric is the score before the overlong penalty.
    pub fn uses_raw_score(&self) -> bool {
        matches!(self.metric.as_str(), "acc" | "score")
    }

    /// Whether a prompt whose samples have `values` is kept: verl's rule (they differ, or
    /// there is one sample), or with `reward_range` OpenRLHF's (their mean inside it).
    pub fn keeps(&self, values: &[f64]) -> bool {
        match self.reward_range {
            Some([lo, hi]) => {
                let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
                lo < mean && mean < hi
            }
            None => values.len() <= 1 || values.iter().any(|&v| v != values[0]),
        }
    }
}

/// `[trainer]`: the run itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerConfig {
    /// The W&B project and the MLflow experiment (verl's name).
    pub project_name: String,
    /// Name used in the output directory, and the run's name in W&B and MLflow.
    pub experiment_name: String,
    /// Where checkpoints and metrics go (default `runs/<experiment_name>`).
    pub default_local_dir: Option<PathBuf>,
    /// Passes over the training set.
    pub total_epochs: usize,
    /// Stop after this many steps (overrides epochs when smaller).
    pub total_steps: Option<usize>,
    /// Checkpoint every N steps (0 = only at the end and on Ctrl-C; verl's -1 reads as 0).
    #[serde(deserialize_with = "frequency")]
    pub save_freq: usize,
    /// Validate every N steps (0 = never; verl's -1 reads as 0).
    #[serde(deserialize_with = "frequency")]
    pub test_freq: usize,
    /// Validate before the first step.
    pub val_before_train: bool,
    /// Validate once and stop without training (verl's name): the model's weights, or the
    /// latest checkpoint's when the run directory has one (`trainer.resume`).
    pub val_only: bool,
    /// Keep the newest N checkpoints (0 = all).
    pub max_ckpt_to_keep: usize,
    /// Seed for sampling and shuffling.
    pub seed: u64,
    /// `cpu`, `cuda[:N]` (the CUDA engine), or `cuda-emu` (the CUDA engine's kernels
    /// emulated on the CPU: slow, for testing without a GPU).
    pub device: String,
    /// Storage type of weights and activations on the CUDA engine: `auto` (bf16), `bf16` or
    /// `f32`; master weights and AdamW state are f32 either way. The CPU engine computes in f32.
    pub dtype: String,
    /// Where metrics go: any of console, jsonl, tensorboard, wandb (the `wandb` package in a
    /// sidecar; WANDB_MODE, WANDB_API_KEY as usual), mlflow (MLFLOW_TRACKING_URI's server).
    pub logger: Vec<String>,
    /// Times the run restarts itself from its last checkpoint after losing a worker rank
    /// (cluster runs; 0 = stop at the first loss).
    pub max_restarts: usize,
    /// Seconds without a heartbeat after which another run may take over this run's
    /// directory (heartbeats go every quarter of it).
    pub lease_timeout_s: f64,
    /// Check every node before placing workers on a cluster (the fast part of
    /// `reinforge doctor`); a failed check stops the run before anything starts.
    pub preflight: bool,
    /// A step counts as stalled after max(3 × the slowest step so far, this many seconds).
    pub stall_timeout_s: f64,
    /// On a stall: `warn` (report the phases and dump the stuck ranks' stacks) or `restart`
    /// (the same, then restart from the last checkpoint, as after a lost node).
    pub on_stall: String,
    /// Serve the run's live page while it trains (`reinforge dashboard RUN_DIR` serves it
    /// afterwards, or from another machine).
    pub dashboard: bool,
    /// Address the page binds: 127.0.0.1 (this machine; tunnel to see it elsewhere), or an
    /// interface's, which needs the cluster token (it is put in the printed URL).
    pub dashboard_host: String,
    /// The page's port (when taken, any free one; the URL is printed).
    pub dashboard_port: u16,
    /// Training samples (prompt, response, reward, and the turns of a multi-turn one) written
    /// to `samples.jsonl` each step.
    pub log_train_samples: usize,
    /// Validation generations written to `samples.jsonl` each validation (verl's name).
    pub log_val_generations: usize,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            project_name: "reinforge".into(),
            experiment_name: "run".into(),
            default_local_dir: None,
            total_epochs: 1,
            total_steps: None,
            save_freq: 0,
            test_freq: 0,
            val_before_train: false,
            val_only: false,
            max_ckpt_to_keep: 3,
            seed: 1,
            device: "cpu".into(),
            dtype: "auto".into(),
            logger: vec!["console".into(), "jsonl".into(), "tensorboard".into()],
            lease_timeout_s: 60.0,
            max_restarts: 3,
            preflight: true,
            stall_timeout_s: 600.0,
            on_stall: "warn".into(),
            dashboard: true,
            dashboard_host: "127.0.0.1".into(),
            dashboard_port: 8266,
            log_train_samples: 4,
            log_val_generations: 8,
        }
    }
}

/// A list given as one string or as a list of strings (`target_modules = "all-linear"`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    OneOrMany::deserialize(d)
        .map(|v| match v {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        })
        .map_err(|_| serde::de::Error::custom("expected a string or a list of strings, e.g. \"all-linear\" or [\"q_proj\", \"v_proj\"]"))
}

/// A step frequency that also takes verl's "never" (`-1`, any negative number) as 0, so
/// commands from verl's guides work as they are.
fn frequency<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let v = i64::deserialize(d)?;
    Ok(usize::try_from(v).unwrap_or(0))
}

/// The names `trainer.logger` takes.
pub const LOGGERS: &[&str] = &["console", "jsonl", "tensorboard", "wandb", "mlflow"];

/// How many ranks a role gets on a cluster: `nnodes × gpus_per_node`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolePlacement {
    /// Nodes the role spans.
    pub nnodes: usize,
    /// Ranks per node: GPUs when `trainer.device` is cuda, else CPU ranks of
    /// `cluster.cpus_per_rank` CPUs each.
    pub gpus_per_node: usize,
    /// GPUs per generation engine (rollout only; 1 = no tensor parallelism).
    pub tensor_parallel_size: usize,
}

impl Default for RolePlacement {
    fn default() -> Self {
        Self { nnodes: 1, gpus_per_node: 1, tensor_parallel_size: 1 }
    }
}

impl RolePlacement {
    /// Ranks in the role.
    pub fn world(&self) -> usize {
        self.nnodes * self.gpus_per_node
    }
}

/// `[cluster]`: where the roles run (OpenRLHF's placement options, verl's names).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `local` (every role in this process) or `ray` (worker groups placed by Ray).
    pub backend: String,
    /// Ray address for placing workers: `auto` (inside a Ray job or on a node of the cluster)
    /// or `HOST:PORT` of the head's GCS.
    pub address: String,
    /// CPUs Ray reserves for each rank.
    pub cpus_per_rank: f64,
    /// Every role in the actor's processes (rollout shares the actor's weights).
    pub colocate_all: bool,
    /// The reference in the actor's processes.
    pub colocate_actor_ref: bool,
    /// The reward model in the critic's processes.
    pub colocate_critic_reward: bool,
    /// TCP port the controller listens on for its workers (0: any free port; set one when a
    /// firewall must name it).
    pub controller_port: u16,
    /// Seconds to wait for Ray to place every group.
    pub placement_timeout_s: u64,
    /// Seconds to wait for every worker to connect and load its models.
    pub startup_timeout_s: u64,
    /// Seconds between a worker's heartbeats to the controller.
    pub heartbeat_interval_s: f64,
    /// Seconds without a heartbeat after which a worker counts as lost (a network cut, a
    /// frozen node or process) and the run stops naming it.
    pub heartbeat_timeout_s: f64,
    /// After losing a worker, seconds to wait for the cluster to have room for every worker
    /// group again (a node coming back) before giving up.
    pub recovery_wait_s: u64,
    /// The elastic floor: after losing a node, the run may go on with every worker group
    /// spread over fewer nodes, down to this many (fewer data-parallel ranks, the same global
    /// batch). 0: every group needs all its nodes.
    pub min_nodes: usize,
    /// After losing a node, seconds to wait for the whole placement before going on with
    /// fewer nodes (`min_nodes`).
    pub elastic_wait_s: u64,
    /// How data-parallel GPU ranks sum their gradients: `nccl` (on the GPUs, where every rank
    /// has NCCL; else through the host, with a warning) or `host` (always through the host).
    pub gpu_collectives: String,
    /// Seconds a GPU rank waits for the others to form an NCCL communicator (verl's
    /// `nccl_timeout`): past it the join fails — gradients then go through the host — instead
    /// of waiting forever for a rank that died before joining.
    pub nccl_timeout_s: f64,
    /// Where the actor trains (data-parallel ranks).
    pub actor: RolePlacement,
    /// Where generation runs when not colocated with the actor.
    pub rollout: RolePlacement,
    /// Where the reference runs when not colocated.
    #[serde(rename = "ref")]
    pub reference: RolePlacement,
    /// Where the critic trains.
    pub critic: RolePlacement,
    /// Where a reward model scores (rule rewards are computed by the controller).
    pub reward: RolePlacement,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            backend: "local".into(),
            address: "auto".into(),
            cpus_per_rank: 1.0,
            colocate_all: false,
            colocate_actor_ref: false,
            colocate_critic_reward: false,
            controller_port: 0,
            placement_timeout_s: 120,
            startup_timeout_s: 600,
            heartbeat_interval_s: 1.0,
            heartbeat_timeout_s: 6.0,
            recovery_wait_s: 600,
            min_nodes: 0,
            elastic_wait_s: 30,
            gpu_collectives: "nccl".into(),
            nccl_timeout_s: 600.0,
            actor: RolePlacement::default(),
            rollout: RolePlacement::default(),
            reference: RolePlacement::default(),
            critic: RolePlacement::default(),
            reward: RolePlacement::default(),
        }
    }
}

/// `[tools]`: tools the policy calls while it generates (multi-turn rollouts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// `[tools.search]`: Search-R1's retrieval tool.
    pub search: SearchConfig,
    /// `[tools.calls]`: verl's tool agent (function calls in Hermes `<tool_call>` blocks).
    pub calls: ToolCallsConfig,
}

/// `[tools.calls]`: verl's tool-calling multi-turn rollouts (`actor_rollout_ref.rollout.
/// multi_turn.*`, the `tool_agent` loop). The prompt shows the tools' schemas; the policy calls
/// them in `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks; each answer comes back
/// as a `tool` message rendered by the chat template, inside `data.max_response_length`, and
/// the losses do not train on it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ToolCallsConfig {
    /// Tool-calling rollouts (verl's `multi_turn.enable`).
    pub enable: bool,
    /// verl's tool config YAML (`tools: [{class_name, config, tool_schema}]`).
    pub tool_config_path: String,
    /// How calls are written: `hermes` (verl's default).
    pub format: String,
    /// Assistant turns per trajectory (0: no limit; verl's null).
    pub max_assistant_turns: usize,
    /// Tool turns per trajectory (0: no limit).
    pub max_user_turns: usize,
    /// Calls run per turn.
    pub max_parallel_calls: usize,
    /// Characters of a tool response kept.
    pub max_tool_response_length: usize,
    /// `left`, `right` or `middle`: which part of a long response is cut.
    pub tool_response_truncate_side: String,
    /// verl's interaction config YAML (a simulated user answering turns without tool calls;
    /// empty: none).
    pub interaction_config_path: String,
}

impl DataConfig {
    /// `apply_chat_template_kwargs` as template variables (what the prompt and the tool
    /// agent's messages are rendered with).
    pub fn template_variables(&self) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        match serde_json::to_value(&self.apply_chat_template_kwargs) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            _ => Err("data.apply_chat_template_kwargs: not representable as template variables".into()),
        }
    }
}

impl Default for ToolCallsConfig {
    fn default() -> Self {
        Self {
            enable: false,
            tool_config_path: String::new(),
            format: "hermes".into(),
            max_assistant_turns: 0,
            max_user_turns: 0,
            max_parallel_calls: 1,
            max_tool_response_length: 256,
            tool_response_truncate_side: "middle".into(),
            interaction_config_path: String::new(),
        }
    }
}

impl ToolCallsConfig {
    /// The rollout settings: the tool config read and checked.
    pub fn settings(&self, data: &DataConfig) -> Result<crate::tool_calls::ToolCallSettings, String> {
        use crate::tool_calls::TruncateSide;
        let truncate_side = match self.tool_response_truncate_side.as_str() {
            "left" => TruncateSide::Left,
            "right" => TruncateSide::Right,
            "middle" => TruncateSide::Middle,
            other => return Err(format!("tools.calls.tool_response_truncate_side = `{other}`: use left, right or middle")),
        };
        if self.format != "hermes" {
            return Err(format!("tools.calls.format = `{}`: calls are read in the hermes format (<tool_call>{{\"name\": …, \"arguments\": …}}</tool_call>)", self.format));
        }
        if self.tool_config_path.is_empty() && self.interaction_config_path.is_empty() {
            return Err("tools.calls.tool_config_path is not set: give verl's tool config YAML (tools: [{class_name, config, tool_schema}]), or an interaction_config_path".into());
        }
        let tools = match self.tool_config_path.as_str() {
            "" => Vec::new(),
            p => crate::tool_calls::load_tool_config(std::path::Path::new(p)).map_err(|e| format!("tools.calls.tool_config_path: {e}"))?,
        };
        let interactions = match self.interaction_config_path.as_str() {
            "" => Vec::new(),
            p => crate::tool_calls::load_interaction_config(std::path::Path::new(p)).map_err(|e| format!("tools.calls.interaction_config_path: {e}"))?,
        };
        let chat_template_kwargs = data.template_variables()?;
        Ok(crate::tool_calls::ToolCallSettings {
            tools,
            interactions,
            max_assistant_turns: Some(self.max_assistant_turns).filter(|&n| n > 0),
            max_user_turns: Some(self.max_user_turns).filter(|&n| n > 0),
            max_parallel_calls: self.max_parallel_calls,
            max_tool_response_length: self.max_tool_response_length,
            truncate_side,
            response_length: data.max_response_length,
            chat_template_kwargs,
        })
    }
}

/// `[tools.search]`: Search-R1's multi-turn rollouts. The policy writes
/// `<search>query</search>`; the queries of every live trajectory go to the retrieval server
/// in one request per turn; the passages come back as `<information>…</information>` tokens
/// that the losses do not train on (`state_masking`); `<answer>…</answer>` ends a trajectory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Multi-turn rollouts with retrieval (Search-R1's `do_search`).
    pub enable: bool,
    /// The retrieval server (Search-R1's `retriever.url`): the node-local one on a cluster.
    pub url: String,
    /// Passages per search (Search-R1's `retriever.topk`).
    pub topk: usize,
    /// Search rounds before the last, search-free turn (Search-R1's `max_turns`).
    pub max_turns: usize,
    /// Observation tokens kept per search (Search-R1's `data.max_obs_length`).
    pub max_obs_length: usize,
    /// Prompt tokens kept, from the end (Search-R1's `data.max_start_length`; none: all).
    pub max_start_length: Option<usize>,
    /// Leave observation tokens out of the policy loss, KL, entropy and the critic's values
    /// (Search-R1's `actor.state_masking`).
    pub state_masking: bool,
    /// Seconds one retrieval request may take.
    pub timeout_s: f64,
    /// Retries of a failed request (backoff 0.5 s, doubling) before the run stops.
    pub retries: u32,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            enable: false,
            url: "http://127.0.0.1:8000/retrieve".into(),
            topk: 3,
            max_turns: 2,
            max_obs_length: 500,
            max_start_length: None,
            state_masking: true,
            timeout_s: 30.0,
            retries: 3,
        }
    }
}

/// The whole run configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// `[data]`.
    pub data: DataConfig,
    /// `[actor]`.
    pub actor: ActorConfig,
    /// `[rollout]`.
    pub rollout: RolloutConfig,
    /// `[ref]`.
    #[serde(rename = "ref")]
    pub reference: RefConfig,
    /// `[critic]`.
    pub critic: CriticConfig,
    /// `[reward]`.
    pub reward: RewardConfig,
    /// `[algorithm]`.
    pub algorithm: AlgorithmConfig,
    /// `[trainer]`.
    pub trainer: TrainerConfig,
    /// `[cluster]`.
    pub cluster: ClusterConfig,
    /// `[tools]`.
    pub tools: ToolsConfig,
}

/// Every dotted key the config accepts, for suggestions (derived from the defaults, so it
/// cannot drift from the structs; optional keys that default to `None` are listed by hand).
pub fn known_keys() -> Vec<String> {
    let mut keys = Vec::new();
    if let Ok(toml::Value::Table(t)) = toml::Value::try_from(TrainConfig::default()) {
        collect(&t, "", &mut keys);
    }
    for k in [
        "data.generate", "data.val_generate", "data.val_batch_size", "data.max_samples", "data.default_data_source", "actor.clip_ratio_low",
        "actor.clip_ratio_high", "ref.enable", "critic.enable", "critic.model", "trainer.default_local_dir",
        "trainer.total_steps", "tools.search.max_start_length", "rollout.val_top_p", "rollout.val_top_k",
        "actor.policy_loss.dro_beta", "reward.overlong_buffer.max_resp_len", "data.gen_batch_size", "actor.ppo_mini_batch_sequences",
        "algorithm.filter_groups.reward_range", "data.label_key", "reward.stop_properly_penalty_coef", "data.apply_chat_template_kwargs",
        "reward.val.kind", "reward.val.params",
        "data.decode_json_ground_truth",
    ] {
        keys.push(k.into());
    }
    keys
}

fn collect(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(sub) if !key.ends_with(".params") => collect(sub, &key, out),
            _ => out.push(key),
        }
    }
}

fn suggest(key: &str) -> String {
    let keys = known_keys();
    let best = keys
        .iter()
        .map(|k| (strsim::normalized_levenshtein(k, key), k))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, k)) if score > 0.5 => format!("; did you mean `{k}`? (`reinforge config show` lists every key)"),
        _ => "; `reinforge config show` lists every key".into(),
    }
}

/// Sets `path = value` inside a TOML table, creating sections as needed.
fn set_dotted(root: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), ConfigError> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::Override(path.into()));
    }
    let mut table = root;
    for p in &parts[..parts.len() - 1] {
        let entry = table.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::BadValue {
                    origin: "override".into(),
                    key: path.into(),
                    msg: format!("`{p}` is a value, not a section"),
                })
            }
        };
    }
    table.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// Parses an override's value as TOML (numbers, booleans, arrays, quoted strings), falling
/// back to a bare string so `actor.model=/path/x` needs no quotes.
fn parse_value(raw: &str) -> toml::Value {
    match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    }
}

impl TrainConfig {
    /// Reads a TOML file, applies `key=value` overrides, and validates the result.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.into(), source })?;
        Self::from_str_with(&text, &path.display().to_string(), overrides)
    }

    /// Like [`Self::load`] from a string; `origin` names it in errors.
    pub fn from_str_with(text: &str, origin: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax { path: origin.into(), msg: e.to_string() })?;
        // The file alone must be valid first, so a typo is blamed on the file, not an override.
        Self::from_table(table.clone(), origin)?;
        for o in overrides {
            let (k, v) = o.split_once('=').ok_or_else(|| ConfigError::Override(o.clone()))?;
            set_dotted(&mut table, k.trim(), parse_value(v.trim()))?;
        }
        let origin = if overrides.is_empty() { origin.to_string() } else { format!("{origin} + overrides") };
        let cfg = Self::from_table(table, &origin)?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn from_table(table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        let de = toml::Value::Table(table);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let msg = e.inner().to_string();
            if let Some(rest) = msg.strip_prefix("unknown field `") {
                let field = rest.split('`').next().unwrap_or("");
                let key = if path.is_empty() || path == "." {
                    field.to_string()
                } else if path == field || path.ends_with(&format!(".{field}")) {
                    path
                } else {
                    format!("{path}.{field}")
                };
                let suggestion = suggest(&key);
                ConfigError::UnknownKey { origin: origin.into(), key, suggestion }
            } else {
                ConfigError::BadValue { origin: origin.into(), key: path, msg }
            }
        })
    }

    /// The resolved config as TOML (what `reinforge config show` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}"))
    }

    /// The most tokens after the prompt a rollout can make: one response, or with
    /// `[tools.search]` `max_turns + 1` turns of `data.max_response_length` tokens and
    /// `max_turns` observations.
    pub fn max_trajectory_length(&self) -> usize {
        let (d, t) = (&self.data, &self.tools.search);
        if t.enable {
            (t.max_turns + 1) * d.max_response_length + t.max_turns * t.max_obs_length
        } else {
            d.max_response_length
        }
    }

    /// The longest prompt the policy sees.
    pub fn max_prompt_tokens(&self) -> usize {
        match self.tools.search.max_start_length.filter(|_| self.tools.search.enable) {
            Some(s) => s.min(self.data.max_prompt_length),
            None => self.data.max_prompt_length,
        }
    }

    /// How the actor's update and the old and reference log-prob passes form micro-batches.
    pub fn actor_micro(&self) -> MicroBatching {
        let a = &self.actor;
        MicroBatching::new(a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, a.ppo_micro_batch_size, self.packs_shared_prompts())
    }

    /// How the critic's update and values pass form micro-batches.
    pub fn critic_micro(&self) -> MicroBatching {
        let c = &self.critic;
        MicroBatching::new(c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu, c.ppo_micro_batch_size, self.packs_shared_prompts())
    }

    /// Whether token budgets count a shared prompt once: the CUDA engine packs each prompt
    /// once for its samples (actor, reference and critic, `actor.share_prompts`); the CPU
    /// engine's rows are padded, so there every sample counts its whole prompt.
    fn packs_shared_prompts(&self) -> bool {
        self.actor.share_prompts && self.trainer.device.parse::<reinforge_engine::DeviceSpec>().is_ok_and(|d| d.is_cuda())
    }

    /// Whether the critic role runs.
    pub fn critic_enabled(&self) -> bool {
        self.critic.enable.unwrap_or(self.algorithm.adv_estimator == "gae")
    }

    /// Whether a step computes old-policy log-probs in a pass of their own. Not when every
    /// batch is used once, on-policy (one epoch, one mini-batch) and no KL is in the reward:
    /// the old policy is then the one the update starts from, its log-probs are the update's
    /// own (the ratio is exactly 1), and the pass would cost a forward over the batch for
    /// nothing (TRL skips it too).
    pub fn old_log_probs_needed(&self) -> bool {
        self.actor.ppo_epochs != 1 || self.mini_batch_seqs() < self.data.train_batch_size * self.rollout.n || self.algorithm.use_kl_in_reward
    }

    /// Prompts one generation call samples for: `data.gen_batch_size` with dynamic sampling,
    /// else `data.train_batch_size`.
    pub fn generation_batch(&self) -> usize {
        self.data.gen_batch_size.filter(|_| self.algorithm.filter_groups.enable).unwrap_or(self.data.train_batch_size)
    }

    /// Sequences per optimizer step: `actor.ppo_mini_batch_sequences`, else
    /// `actor.ppo_mini_batch_size × rollout.n`.
    pub fn mini_batch_seqs(&self) -> usize {
        self.actor.ppo_mini_batch_sequences.unwrap_or(self.actor.ppo_mini_batch_size * self.rollout.n)
    }

    /// Whether the reference role runs.
    pub fn ref_enabled(&self) -> bool {
        self.reference.enable.unwrap_or(self.actor.use_kl_loss || self.algorithm.use_kl_in_reward)
    }

    /// Output directory.
    pub fn out_dir(&self) -> PathBuf {
        self.trainer.default_local_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&self.trainer.experiment_name))
    }

    /// Checks combinations before any model is loaded.
    // `!(x > 0.0)` rather than `x <= 0.0`: NaN must fail the checks too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let (d, a, r) = (&self.data, &self.actor, &self.rollout);
        if !["warn", "restart"].contains(&self.trainer.on_stall.as_str()) {
            return bad(format!("trainer.on_stall = `{}`: use `warn` or `restart`", self.trainer.on_stall));
        }
        if self.trainer.stall_timeout_s.is_nan() || self.trainer.stall_timeout_s <= 0.0 {
            return bad(format!("trainer.stall_timeout_s = {}: use a number of seconds > 0", self.trainer.stall_timeout_s));
        }
        if a.model.is_empty() {
            return bad("actor.model is empty: name a model (e.g. smollm2-135m-instruct) or an HF directory".into());
        }
        if !["pretrained", "random"].contains(&a.init.as_str()) {
            return bad(format!("actor.init = `{}`: use `pretrained` or `random`", a.init));
        }
        if d.train_files.is_empty() && d.generate.is_none() {
            return bad("no training data: set data.train_files or [data.generate]".into());
        }
        if !d.apply_chat_template_kwargs.is_empty() && !d.apply_chat_template {
            return bad("data.apply_chat_template_kwargs are chat-template variables, but data.apply_chat_template = false: drop them or apply the template".into());
        }
        if let Some(k) = d.apply_chat_template_kwargs.keys().find(|k| ["messages", "tools", "documents", "add_generation_prompt"].contains(&k.as_str())) {
            return bad(format!("data.apply_chat_template_kwargs.{k}: `{k}` is set by the loader, not a free template variable"));
        }
        if self.trainer.val_only && d.val_files.is_empty() && d.val_generate.is_none() {
            return bad("trainer.val_only validates and stops, but there is no validation data: set data.val_files or [data.val_generate]".into());
        }
        // Sampling settings fail here, by key, not at the first rollout once the model is loaded.
        use reinforge_engine::SamplingParams;
        for (key, t) in [("rollout.temperature", r.temperature), ("rollout.val_temperature", r.val_temperature)] {
            if !SamplingParams::temperature_ok(t) {
                return bad(format!("{key} = {t}: use 0 (greedy) or a positive temperature"));
            }
        }
        for (key, p) in [("rollout.top_p", Some(r.top_p)), ("rollout.val_top_p", r.val_top_p)] {
            if let Some(p) = p.filter(|&p| !SamplingParams::top_p_ok(p)) {
                return bad(format!("{key} = {p}: use a nucleus mass in (0, 1] (1 keeps every token)"));
            }
        }
        if d.train_batch_size == 0 || a.ppo_mini_batch_size == 0 || a.ppo_micro_batch_size == 0 || r.n == 0 {
            return bad("data.train_batch_size, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size and rollout.n must be ≥ 1".into());
        }
        let group = matches!(
            self.algorithm.adv_estimator.as_str(),
            "grpo" | "rloo" | "reinforce_plus_plus_baseline"
        );
        if group && r.n < 2 {
            return bad(format!("algorithm.adv_estimator = `{}` compares samples of one prompt: set rollout.n ≥ 2", self.algorithm.adv_estimator));
        }
        match a.ppo_mini_batch_sequences {
            Some(s) if s == 0 || (d.train_batch_size * r.n) % s != 0 => {
                return bad(format!(
                    "actor.ppo_mini_batch_sequences = {s}: the step's {} sequences (data.train_batch_size × rollout.n) must split into whole mini-batches of it",
                    d.train_batch_size * r.n
                ));
            }
            Some(_) => {}
            None if d.train_batch_size % a.ppo_mini_batch_size != 0 => {
                return bad(format!(
                    "data.train_batch_size ({}) must be divisible by actor.ppo_mini_batch_size ({})",
                    d.train_batch_size, a.ppo_mini_batch_size
                ));
            }
            None => {}
        }
        let mini_seqs = self.mini_batch_seqs();
        if let Some(micro) = self.actor_micro().fixed_seqs().filter(|m| !mini_seqs.is_multiple_of(*m)) {
            return bad(format!("the mini-batch (actor.ppo_mini_batch_size × rollout.n, or actor.ppo_mini_batch_sequences: {mini_seqs} sequences) must be divisible by actor.ppo_micro_batch_size ({micro})"));
        }
        if let Some(micro) = self.critic_micro().fixed_seqs().filter(|m| self.critic_enabled() && !mini_seqs.is_multiple_of((*m).max(1))) {
            return bad(format!("the mini-batch (actor.ppo_mini_batch_size × rollout.n, or actor.ppo_mini_batch_sequences: {mini_seqs} sequences) must be divisible by critic.ppo_micro_batch_size ({micro})"));
        }
        // As verl asserts: a budget below the longest sequence would put every long one in a
        // micro-batch of its own, over the budget the user set to bound memory.
        let longest = self.max_prompt_tokens() + self.max_trajectory_length();
        for (role, on, max) in [
            ("actor", a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu),
            ("critic", self.critic.use_dynamic_bsz && self.critic_enabled(), self.critic.ppo_max_token_len_per_gpu),
        ] {
            if on && max < longest {
                return bad(format!(
                    "{role}.ppo_max_token_len_per_gpu = {max} is less than the longest sequence ({longest} tokens: data.max_prompt_length + the response's maximum): set it to at least {longest}, or lower data.max_response_length"
                ));
            }
        }
        let est: reinforge_algos::AdvantageEstimator = self
            .algorithm
            .adv_estimator
            .parse()
            .map_err(|e: reinforge_algos::AlgoError| ConfigError::Invalid(format!("algorithm.adv_estimator: {e}")))?;
        let _ = est;
        if self.algorithm.adv_estimator == "gae" && self.critic.enable == Some(false) {
            return bad("algorithm.adv_estimator = `gae` needs a critic: remove critic.enable = false".into());
        }
        if self.reference.enable == Some(false) && (a.use_kl_loss || self.algorithm.use_kl_in_reward) {
            return bad("a KL term (actor.use_kl_loss or algorithm.use_kl_in_reward) needs the reference: remove ref.enable = false".into());
        }
        for (k, v) in [("actor.loss_agg_mode", &a.loss_agg_mode), ("critic.loss_agg_mode", &self.critic.loss_agg_mode)] {
            v.parse::<reinforge_algos::LossAggMode>().map_err(|e| ConfigError::Invalid(format!("{k}: {e}")))?;
        }
        for (k, v) in [("actor.kl_loss_type", &a.kl_loss_type), ("algorithm.kl_penalty", &self.algorithm.kl_penalty)] {
            v.parse::<reinforge_algos::KlPenalty>().map_err(|e| ConfigError::Invalid(format!("{k}: {e}")))?;
        }
        if !["fixed", "adaptive"].contains(&self.algorithm.kl_ctrl.kind.as_str()) {
            return bad(format!("algorithm.kl_ctrl.type = `{}`: use `fixed` or `adaptive`", self.algorithm.kl_ctrl.kind));
        }
        if !["constant", "cosine"].contains(&a.lr_scheduler.as_str()) {
            return bad(format!("actor.lr_scheduler = `{}`: use `constant` or `cosine`", a.lr_scheduler));
        }
        for (k, v) in [("actor.lr_warmup_ratio", a.lr_warmup_ratio), ("critic.lr_warmup_ratio", self.critic.lr_warmup_ratio)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{k} = {v}: use a fraction of the run in [0, 1]"));
            }
        }
        if !(a.lr > 0.0) || !(a.clip_ratio > 0.0) || a.clip_ratio_c <= 1.0 {
            return bad("actor.lr and actor.clip_ratio must be > 0 and actor.clip_ratio_c > 1".into());
        }
        let fg = &self.algorithm.filter_groups;
        if fg.enable {
            if !FilterGroups::METRICS.contains(&fg.metric.as_str()) {
                return bad(format!("algorithm.filter_groups.metric = `{}`: use one of {}", fg.metric, FilterGroups::METRICS.join(", ")));
            }
            if fg.metric == "seq_final_reward" && self.algorithm.use_kl_in_reward {
                return bad("algorithm.filter_groups.metric = `seq_final_reward` with algorithm.use_kl_in_reward: groups are filtered before log-probs exist; use `seq_reward`".into());
            }
            if self.tools.search.enable || self.tools.calls.enable {
                return bad("algorithm.filter_groups with multi-turn rollouts (tools.search.enable, tools.calls.enable) is not supported; turn one of them off".into());
            }
            if let Some([lo, hi]) = fg.reward_range {
                if !(lo < hi) {
                    return bad(format!("algorithm.filter_groups.reward_range = [{lo}, {hi}]: the low end must be below the high end"));
                }
            }
            if d.gen_batch_size == Some(0) {
                return bad("data.gen_batch_size must be ≥ 1 (prompts per generation round)".into());
            }
        } else if d.gen_batch_size.is_some_and(|g| g != d.train_batch_size) {
            return bad(format!(
                "data.gen_batch_size = {} only applies with algorithm.filter_groups.enable = true (without it each step generates data.train_batch_size prompts); remove it or enable the filter",
                d.gen_batch_size.unwrap_or_default()
            ));
        }
        if let Some(c) = self.reward.stop_properly_penalty_coef.filter(|c| !c.is_finite() || *c > 1.0) {
            return bad(format!("reward.stop_properly_penalty_coef = {c}: use a scale in [0, 1] or a negative reward that replaces a truncated response's"));
        }
        let ob = &self.reward.overlong_buffer;
        if ob.enable {
            let limit = ob.max_resp_len.unwrap_or(d.max_response_length);
            if ob.len == 0 || ob.len > limit {
                return bad(format!(
                    "reward.overlong_buffer.len = {}: use 1..={limit} tokens (the penalty ramps over the last `len` tokens before the response limit, {limit})",
                    ob.len
                ));
            }
        }
        let policy = crate::build::policy_loss_config(a)?;
        policy.validate().map_err(|e| ConfigError::Invalid(format!("actor.{}", e.to_string().trim_start_matches("compute_policy_loss: "))))?;
        if !["fail", "skip"].contains(&d.on_bad_row.as_str()) {
            return bad(format!("data.on_bad_row = `{}`: use `fail` or `skip`", d.on_bad_row));
        }
        if d.max_response_length == 0 {
            return bad("data.max_response_length must be ≥ 1".into());
        }
        let t = &self.tools.search;
        if t.enable {
            if !t.url.starts_with("http://") {
                return bad(format!("tools.search.url = `{}`: use the retrieval server's http:// URL (e.g. http://127.0.0.1:8000/retrieve)", t.url));
            }
            if t.topk == 0 || t.max_obs_length == 0 || t.max_start_length == Some(0) {
                return bad("tools.search.topk, max_obs_length and max_start_length must be ≥ 1".into());
            }
            if !(t.timeout_s > 0.0 && t.timeout_s <= 3600.0) || t.retries > 20 {
                return bad(format!("tools.search.timeout_s = {} and retries = {}: use seconds in (0, 3600] and at most 20 retries", t.timeout_s, t.retries));
            }
        }
        let c = &self.tools.calls;
        if (c.enable || self.tools.search.enable) && self.algorithm.adv_estimator == "remax" {
            return bad("algorithm.adv_estimator = `remax` with multi-turn rollouts (tools.calls, tools.search) is not supported: its greedy baseline is single-turn; use grpo or rloo".into());
        }
        if c.enable {
            if self.tools.search.enable {
                return bad("tools.search.enable and tools.calls.enable: one multi-turn loop per run; turn one of them off".into());
            }
            if !d.apply_chat_template {
                return bad("tools.calls.enable needs data.apply_chat_template = true: tool schemas and tool messages are rendered by the chat template".into());
            }
            if c.max_parallel_calls == 0 {
                return bad("tools.calls.max_parallel_calls must be ≥ 1".into());
            }
            c.settings(d).map_err(ConfigError::Invalid)?;
        }
        for l in &self.trainer.logger {
            if !LOGGERS.contains(&l.as_str()) {
                return bad(format!("trainer.logger: unknown logger `{l}` ({})", LOGGERS.join(", ")));
            }
        }
        if !(self.rollout.gpu_memory_utilization > 0.0 && self.rollout.gpu_memory_utilization <= 1.0) {
            return bad(format!(
                "rollout.gpu_memory_utilization = {}: use a fraction in (0, 1] of the GPU's memory (verl's default 0.5)",
                self.rollout.gpu_memory_utilization
            ));
        }
        if !(self.trainer.lease_timeout_s >= 0.2 && self.trainer.lease_timeout_s <= 86_400.0) {
            return bad(format!(
                "trainer.lease_timeout_s = {}: use seconds between 0.2 and 86400 (default 60; raise it for file systems that stall)",
                self.trainer.lease_timeout_s
            ));
        }
        let device = self
            .trainer
            .device
            .parse::<reinforge_engine::DeviceSpec>()
            .map_err(|e| ConfigError::Invalid(format!("trainer.device: {e}")))?;
        let r = &self.rollout;
        let most = reinforge_cuda::rollout::MAX_NUM_SEQS;
        if r.max_num_seqs == 0 || r.max_num_batched_tokens == 0 {
            return bad(format!(
                "rollout.max_num_seqs = {} and rollout.max_num_batched_tokens = {}: both must be at least 1 (defaults 1024 sequences and 8192 tokens, verl's)",
                r.max_num_seqs, r.max_num_batched_tokens
            ));
        }
        let at_once = r.max_num_seqs.min(most);
        if device.is_cuda() && r.n.max(r.val_n) > at_once {
            return bad(format!(
                "rollout.n = {} (val_n = {}) is above the {at_once} sequences the GPU decodes at once (rollout.max_num_seqs = {}, at most {most}): a prompt's samples decode together; raise max_num_seqs or lower n",
                r.n, r.val_n, r.max_num_seqs
            ));
        }
        self.actor_lora()?;
        match crate::cuda::dtype_named(&self.trainer.dtype) {
            None => return bad(format!("trainer.dtype = `{}`: use `auto`, `bf16` or `f32`", self.trainer.dtype)),
            Some(reinforge_cuda::DType::Bf16) if !device.is_cuda() && self.trainer.dtype != "auto" => {
                return bad("trainer.dtype = bf16 needs trainer.device = cuda: the CPU engine computes in f32 (use `auto` or `f32`)".into())
            }
            Some(_) => {}
        }
        self.validate_cluster()?;
        if self.trainer.total_epochs == 0 && self.trainer.total_steps.is_none() {
            return bad("trainer.total_epochs is 0 and trainer.total_steps unset: nothing to train".into());
        }
        Ok(())
    }

    /// The LoRA adapter shape `[actor]` asks for (`actor.lora_rank > 0`; an
    /// `actor.lora_adapter_path` brings its own), or `None`.
    pub fn actor_lora(&self) -> Result<Option<reinforge_engine::LoraConfig>, ConfigError> {
        let a = &self.actor;
        if a.lora_rank == 0 {
            return Ok(None);
        }
        reinforge_engine::LoraConfig::new(a.lora_rank, a.lora_alpha, &a.target_modules).map(Some).map_err(|e| ConfigError::Invalid(format!("actor: {e}")))
    }

    /// Whether `[reward]` scores with a model anywhere (a `reward_model` kind, also inside
    /// `combined` or `router`): that part runs on worker ranks on a cluster.
    pub fn reward_uses_model(&self) -> bool {
        fn walk(v: &toml::Value) -> bool {
            match v {
                toml::Value::Table(t) => t.get("kind").and_then(|k| k.as_str()) == Some("reward_model") || t.values().any(walk),
                toml::Value::Array(a) => a.iter().any(walk),
                _ => false,
            }
        }
        self.reward.kind == "reward_model" || self.reward.params.values().any(walk)
    }

    /// Checks `[cluster]`: placements that cannot work are errors before anything starts.
    // `!(x > 0.0)` rather than `x <= 0.0`: NaN must fail the checks too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let c = &self.cluster;
        if !["local", "ray"].contains(&c.backend.as_str()) {
            return bad(format!("cluster.backend = `{}`: use `local` or `ray`", c.backend));
        }
        if !["nccl", "host"].contains(&c.gpu_collectives.as_str()) {
            return bad(format!("cluster.gpu_collectives = `{}`: use `nccl` (the default) or `host`", c.gpu_collectives));
        }
        // Checked for local runs too: a single-GPU run's gradient settings read it.
        if !(c.nccl_timeout_s > 0.0 && c.nccl_timeout_s <= 1e7) {
            return bad(format!("cluster.nccl_timeout_s = {}: use a number of seconds from 0 to 10⁷ (default 600)", c.nccl_timeout_s));
        }
        if c.backend == "local" {
            return Ok(());
        }
        if !(c.cpus_per_rank > 0.0) {
            return bad("cluster.cpus_per_rank must be > 0".into());
        }
        if !(c.heartbeat_interval_s >= 0.05 && c.heartbeat_timeout_s >= 2.0 * c.heartbeat_interval_s) {
            return bad(format!(
                "cluster.heartbeat_interval_s = {} and cluster.heartbeat_timeout_s = {}: the interval must be ≥ 0.05 s and the timeout at least twice the interval (defaults 1 and 6)",
                c.heartbeat_interval_s, c.heartbeat_timeout_s
            ));
        }
        if c.colocate_critic_reward && !(self.critic_enabled() && self.reward_uses_model()) {
            return bad("cluster.colocate_critic_reward puts a reward model with the critic: it needs both (a `reward_model` reward and algorithm.adv_estimator = \"gae\")".into());
        }
        for (name, p) in [("actor", &c.actor), ("rollout", &c.rollout), ("ref", &c.reference), ("critic", &c.critic), ("reward", &c.reward)] {
            if p.nnodes == 0 || p.gpus_per_node == 0 {
                return bad(format!("cluster.{name}.nnodes and cluster.{name}.gpus_per_node must be ≥ 1"));
            }
        }
        let tp = c.rollout.tensor_parallel_size;
        if tp == 0 || !c.rollout.gpus_per_node.is_multiple_of(tp) {
            return bad(format!(
                "cluster.rollout.tensor_parallel_size ({tp}) must divide cluster.rollout.gpus_per_node ({}): an engine's GPUs sit on one node",
                c.rollout.gpus_per_node
            ));
        }
        if tp > 1 {
            return bad(format!(
                "cluster.rollout.tensor_parallel_size = {tp}: the Reinforge engine has no tensor parallelism yet; use 1 and more engines (gpus_per_node)"
            ));
        }
        let mini = self.mini_batch_seqs();
        let check_dp = |role: &str, world: usize, micro: MicroBatching| {
            let seqs = micro.fixed_seqs().map_or(1, |n| n.max(1));
            if !mini.is_multiple_of(world) || !(mini / world).is_multiple_of(seqs) {
                return bad(format!(
                    "{role} runs on {world} data-parallel ranks (cluster.{role}.nnodes × gpus_per_node): the mini-batch (actor.ppo_mini_batch_size × rollout.n, or actor.ppo_mini_batch_sequences: {mini}) must split into {world} equal shares divisible by the micro-batch size ({seqs})"
                ));
            }
            Ok(())
        };
        check_dp("actor", c.actor.world(), self.actor_micro())?;
        if self.critic_enabled() {
            check_dp("critic", c.critic.world(), self.critic_micro())?;
        }
        let widest = self.widest_group_nodes();
        if c.min_nodes > widest {
            return bad(format!(
                "cluster.min_nodes = {} is more than the {widest} node(s) the widest worker group spans (cluster.<role>.nnodes): use 1 to {widest}, or 0 to need every node",
                c.min_nodes
            ));
        }
        Ok(())
    }

    /// The most nodes any worker group of this config spans.
    pub fn widest_group_nodes(&self) -> usize {
        crate::remote::plan(self).iter().map(|g| g.spec.nnodes).max().unwrap_or(1)
    }

    /// This config with every worker group spread over at most `nodes` nodes (same ranks per
    /// node, so fewer data-parallel ranks; the same global batch), when that is a valid
    /// placement: the elastic floor's fallback after a lost node (`cluster.min_nodes`).
    pub fn on_fewer_nodes(&self, nodes: usize) -> Option<TrainConfig> {
        let mut c = self.clone();
        let cl = &mut c.cluster;
        for p in [&mut cl.actor, &mut cl.rollout, &mut cl.reference, &mut cl.critic, &mut cl.reward] {
            p.nnodes = p.nnodes.min(nodes.max(1));
        }
        (c.cluster != self.cluster && c.validate_cluster().is_ok()).then_some(c)
    }

    /// Warmup steps of a run of `total` steps: `steps`, or `ratio` of the run when `steps` is
    /// 0 (rounded down, as verl does).
    pub fn warmup_steps(steps: usize, ratio: f64, total: usize) -> usize {
        if steps > 0 {
            steps
        } else {
            (ratio * total as f64).floor() as usize
        }
    }

    /// Learning rate at `step` (0-based) of `total` for a schedule.
    pub fn lr_at(peak: f64, warmup: usize, scheduler: &str, min_ratio: f64, step: usize, total: usize) -> f64 {
        if warmup > 0 && step < warmup {
            return peak * (step + 1) as f64 / warmup as f64;
        }
        match scheduler {
            "cosine" => {
                let span = total.saturating_sub(warmup).max(1) as f64;
                let progress = ((step - warmup.min(step)) as f64 / span).min(1.0);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                peak * (min_ratio + (1.0 - min_ratio) * cos)
            }
            _ => peak,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[data]
generate = { kind = "arith", n = 64 }
train_batch_size = 8
[actor]
model = "some/dir"
ppo_mini_batch_size = 4
ppo_micro_batch_size = 8
[rollout]
n = 4
"#;

    #[test]
    fn impossible_placements_are_refused_with_the_numbers() {
        let err = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            match TrainConfig::from_str_with(BASE, "t.toml", &o).and_then(|c| c.validate().map(|_| c)) {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            }
        };
        let ray = "cluster.backend=\"ray\"";
        assert_eq!(err(&[ray]), "");
        // Sampling settings are refused before a model is loaded, by their keys.
        assert!(err(&["rollout.top_p=1.5"]).contains("rollout.top_p = 1.5: use a nucleus mass in (0, 1]"));
        assert!(err(&["rollout.val_top_p=0"]).contains("rollout.val_top_p = 0: use a nucleus mass"));
        assert!(err(&["rollout.temperature=-1"]).contains("rollout.temperature = -1: use 0 (greedy) or a positive temperature"));
        assert!(err(&["rollout.val_temperature=nan"]).contains("rollout.val_temperature = NaN"));
        assert_eq!(err(&["rollout.val_top_p=0.9", "rollout.val_top_k=20", "rollout.val_temperature=0.6"]), "");
        assert!(err(&["cluster.backend=\"slurm\""]).contains("use `local` or `ray`"));
        // mini-batch = 4 prompts × 4 samples = 16 sequences, micro 8: 2 ranks fit, 3 do not.
        assert_eq!(err(&[ray, "cluster.actor.gpus_per_node=2"]), "");
        let e = err(&[ray, "cluster.actor.gpus_per_node=3"]);
        assert!(e.contains("3 data-parallel ranks") && e.contains("ppo_mini_batch_sequences: 16)"), "{e}");
        let e = err(&[ray, "cluster.actor.nnodes=4"]);
        assert!(e.contains("4 data-parallel ranks"), "{e}");
        let e = err(&[ray, "cluster.rollout.gpus_per_node=8", "cluster.rollout.tensor_parallel_size=3"]);
        assert!(e.contains("tensor_parallel_size (3) must divide cluster.rollout.gpus_per_node (8)"), "{e}");
        let e = err(&[ray, "cluster.rollout.gpus_per_node=8", "cluster.rollout.tensor_parallel_size=2"]);
        assert!(e.contains("no tensor parallelism yet"), "{e}");
        assert!(err(&[ray, "cluster.actor.nnodes=0"]).contains("must be ≥ 1"));
        assert!(err(&[ray, "cluster.cpus_per_rank=0"]).contains("cpus_per_rank"));
        let e = err(&[ray, "cluster.nccl_timeout_s=0"]);
        assert!(e.contains("cluster.nccl_timeout_s = 0: use a number of seconds from 0 to 10⁷"), "{e}");
        assert!(err(&["cluster.nccl_timeout_s=-1"]).contains("cluster.nccl_timeout_s = -1"));
        assert!(err(&["cluster.nccl_timeout_s=1e30"]).contains("cluster.nccl_timeout_s"));
        // The local backend ignores placements.
        assert_eq!(err(&["cluster.actor.gpus_per_node=3"]), "");
        let e = err(&[ray, "cluster.actor.nnodes=2", "cluster.min_nodes=3"]);
        assert!(e.contains("cluster.min_nodes = 3 is more than the 2 node(s)"), "{e}");
        assert_eq!(err(&[ray, "cluster.actor.nnodes=2", "cluster.min_nodes=2"]), "");
    }

    #[test]
    fn fewer_nodes_keep_ranks_per_node_and_must_split_the_batch() {
        let cfg = |o: &[&str]| {
            let mut v = vec!["cluster.backend=\"ray\"".to_string()];
            v.extend(o.iter().map(|s| s.to_string()));
            TrainConfig::from_str_with(BASE, "t.toml", &v).unwrap()
        };
        // 16 sequences per mini-batch, micro-batch 8: 2 actor ranks per node on 1 node is valid.
        let c = cfg(&["cluster.actor.nnodes=2", "cluster.actor.gpus_per_node=1", "cluster.rollout.nnodes=2"]);
        assert_eq!(c.widest_group_nodes(), 2);
        let one = c.on_fewer_nodes(1).expect("one node holds both groups");
        assert_eq!((one.cluster.actor.nnodes, one.cluster.actor.gpus_per_node, one.cluster.rollout.nnodes), (1, 1, 1));
        assert_eq!(one.widest_group_nodes(), 1);
        // Nothing to shrink: no alternative.
        assert!(c.on_fewer_nodes(2).is_none());
        // 4 nodes × 1 rank → 3 nodes: 16 sequences do not split over 3 ranks.
        let c = cfg(&["cluster.actor.nnodes=4", "cluster.actor.gpus_per_node=1", "actor.ppo_micro_batch_size=4"]);
        assert!(c.on_fewer_nodes(3).is_none());
        assert_eq!(c.on_fewer_nodes(2).map(|c| c.cluster.actor.world()), Some(2));
    }

    #[test]
    fn loads_with_defaults_and_overrides() {
        let c = TrainConfig::from_str_with(BASE, "t.toml", &["actor.lr=3e-4".into(), "trainer.experiment_name=abc".into()]).unwrap();
        assert_eq!(c.actor.lr, 3e-4);
        assert_eq!(c.trainer.experiment_name, "abc");
        assert_eq!(c.algorithm.adv_estimator, "grpo");
        assert_eq!(c.out_dir(), PathBuf::from("runs/abc"));
        // Round trip through `config show`.
        let again = TrainConfig::from_str_with(&c.to_toml(), "shown", &[]).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn unknown_keys_suggest_the_nearest() {
        let e = TrainConfig::from_str_with(&format!("{BASE}\n[trainer]\nsave_frq = 3\n"), "t.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key `trainer.save_frq`") && e.contains("did you mean `trainer.save_freq`"), "{e}");
        // Keys that default to None are known too (they are listed by hand).
        let e = TrainConfig::from_str_with(BASE, "t.toml", &["rollout.val_topp=0.9".into()]).unwrap_err().to_string();
        assert!(e.contains("did you mean `rollout.val_top_p`"), "{e}");
        for k in ["rollout.val_top_p", "rollout.val_top_k", "data.val_batch_size", "actor.clip_ratio_high"] {
            assert!(known_keys().iter().any(|x| x == k), "{k}");
        }
    }

    #[test]
    fn verl_never_frequencies_are_accepted() {
        // As verl's multi-node guide writes them.
        let c = TrainConfig::from_str_with(BASE, "t.toml", &["trainer.save_freq=-1".into(), "trainer.test_freq=-1".into()]).unwrap();
        assert_eq!((c.trainer.save_freq, c.trainer.test_freq), (0, 0));
        let c = TrainConfig::from_str_with(BASE, "t.toml", &["trainer.save_freq=7".into()]).unwrap();
        assert_eq!(c.trainer.save_freq, 7);
        let e = TrainConfig::from_str_with(BASE, "t.toml", &["actor.lrr=1".into()]).unwrap_err().to_string();
        assert!(e.contains("`actor.lrr`") && e.contains("`actor.lr`"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t.toml", &["actorlr".into()]).unwrap_err().to_string();
        assert!(e.contains("section.key=value"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t.toml", &["actor.lr=fast".into()]).unwrap_err().to_string();
        assert!(e.contains("actor.lr"), "{e}");
    }

    #[test]
    fn validation_catches_impossible_batches() {
        let e = TrainConfig::from_str_with(BASE, "t", &["data.train_batch_size=6".into()]).unwrap_err().to_string();
        assert!(e.contains("divisible by actor.ppo_mini_batch_size"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t", &["actor.ppo_micro_batch_size=5".into()]).unwrap_err().to_string();
        assert!(e.contains("ppo_micro_batch_size"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t", &["rollout.n=1".into()]).unwrap_err().to_string();
        assert!(e.contains("rollout.n ≥ 2"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t", &["cluster.gpu_collectives=\"gloo\"".into()]).unwrap_err().to_string();
        assert!(e.contains("cluster.gpu_collectives = `gloo`") && e.contains("`host`"), "{e}");
        let c = TrainConfig::from_str_with(BASE, "t", &["cluster.gpu_collectives=\"host\"".into(), "rollout.enforce_eager=true".into(), "rollout.async_scheduling=false".into()]).unwrap();
        assert!(c.rollout.enforce_eager && !c.rollout.async_scheduling && c.cluster.gpu_collectives == "host");
        let c = TrainConfig::from_str_with(BASE, "t", &["rollout.max_num_seqs=8".into(), "rollout.max_num_batched_tokens=512".into()]).unwrap();
        assert_eq!((c.rollout.max_num_seqs, c.rollout.max_num_batched_tokens), (8, 512));
        for bad in ["rollout.max_num_seqs=0", "rollout.max_num_batched_tokens=0"] {
            let e = TrainConfig::from_str_with(BASE, "t", &[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("rollout.max_num_seqs = ") && e.contains("both must be at least 1"), "{bad}: {e}");
        }
        // As verl configs may have it (vLLM takes any): the GPU then decodes 1024 at once.
        assert!(TrainConfig::from_str_with(BASE, "t", &["rollout.max_num_seqs=2048".into()]).is_ok());
        // A prompt's samples decode together on a GPU: n above the limit is refused there only.
        let few = ["rollout.max_num_seqs=2".to_string(), "rollout.n=4".into()];
        assert!(TrainConfig::from_str_with(BASE, "t", &few).is_ok());
        let on_gpu: Vec<String> = few.iter().cloned().chain(["trainer.device=\"cuda-emu\"".into()]).collect();
        let e = TrainConfig::from_str_with(BASE, "t", &on_gpu).unwrap_err().to_string();
        assert!(e.contains("rollout.n = 4 (val_n = 1) is above the 2 sequences the GPU decodes at once"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t", &["algorithm.adv_estimator=gae".into(), "critic.enable=false".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a critic"), "{e}");
        let e = TrainConfig::from_str_with(BASE, "t", &["algorithm.adv_estimator=ppo2".into()]).unwrap_err().to_string();
        assert!(e.contains("adv_estimator"), "{e}");
        let c = TrainConfig::from_str_with(BASE, "t", &["algorithm.adv_estimator=gae".into()]).unwrap();
        assert!(c.critic_enabled() && !c.ref_enabled());
    }

    #[test]
    fn lora_settings_are_checked_before_a_run_starts() {
        let load = |o: &[&str]| TrainConfig::from_str_with(BASE, "t", &o.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let c = load(&["actor.lora_rank=8", "actor.target_modules=[\"q_proj\", \"self_attn.v_proj\"]"]).unwrap();
        let l = c.actor_lora().unwrap().unwrap();
        assert_eq!((l.rank, l.alpha, l.targets.clone()), (8, 16.0, vec!["q_proj".to_string(), "v_proj".into()]));
        assert_eq!(load(&["actor.lora_rank=8"]).unwrap().actor_lora().unwrap().unwrap().targets.len(), 7, "all-linear by default");
        assert!(load(&[]).unwrap().actor_lora().unwrap().is_none());
        for (o, says) in [
            (&["actor.lora_rank=8", "actor.target_modules=\"lm_head\""][..], "`lm_head` is not a linear"),
            (&["actor.lora_rank=8", "actor.lora_alpha=0"][..], "lora_alpha must be a positive number"),
        ] {
            let e = load(o).unwrap_err().to_string();
            assert!(e.contains(says), "{o:?}: {e}");
        }
    }

    #[test]
    fn lr_schedule() {
        assert_eq!(TrainConfig::lr_at(1.0, 2, "constant", 0.0, 0, 10), 0.5);
        assert_eq!(TrainConfig::lr_at(1.0, 2, "constant", 0.0, 5, 10), 1.0);
        assert!((TrainConfig::lr_at(1.0, 0, "cosine", 0.1, 10, 10) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn python_rewards_anywhere_in_the_spec_keep_ground_truths_as_stored() {
        let reward = |text: &str| -> RewardConfig { toml::from_str(text).unwrap() };
        assert!(!reward("kind = \"router\"").reads_stored_ground_truth(false));
        assert!(reward("kind = \"python\"\nparams = { path = \"r.py\" }").reads_stored_ground_truth(false));
        assert!(reward("kind = \"remote\"\nparams = { url = \"http://h:1/r\", protocol = \"openrlhf\" }").reads_stored_ground_truth(false));
        assert!(!reward("kind = \"remote\"\nparams = { url = \"http://h:1/r\" }").reads_stored_ground_truth(false));
        let routed = "kind = \"router\"\n[[params.routes]]\ndata_sources = [\"x\"]\nreward = { kind = \"python\", params = { path = \"r.py\" } }";
        assert!(reward(routed).reads_stored_ground_truth(false));
        let by_default = "kind = \"router\"\n[params.default]\nkind = \"combined\"\nparams = { components = [{ weight = 1.0, reward = { kind = \"python\", params = { path = \"r.py\" } } }] }";
        assert!(reward(by_default).reads_stored_ground_truth(false));
        // Validation follows [reward.val] when it is set.
        let val = reward("kind = \"python\"\nparams = { path = \"r.py\" }\n[val]\nkind = \"math\"");
        assert!(val.reads_stored_ground_truth(false) && !val.reads_stored_ground_truth(true));
    }
}
