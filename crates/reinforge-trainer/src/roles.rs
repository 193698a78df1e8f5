//! The roles of DESIGN.md §2 as worker groups, and their local (single-process) backend.
//!
//! Every call takes and returns plain host data ([`SeqBatch`], [`Mat`]) so that a remote
//! backend (Ray) can ship the same messages to worker processes. The local backend runs each
//! role in this process; actor and rollout share weights (the hybrid engine).

use crate::error::TrainError;
use reinforge_algos::burn_ops;
use reinforge_algos::{AggOptions, KlPenalty, LossAggMode, Mat, PolicyLossConfig, ValueLossConfig};
use reinforge_engine::{
    generate, token_logprobs, CausalLm, Completion, ForwardInput, OptimConfig, SamplingParams, Trainer, ValueModel,
};
use reinforge_metrics::Metrics;
use reinforge_tokenizer::Tokenizer;
use burn::tensor::{Device, Tensor};

/// Prompt + response sequences laid out for scoring and training: prompts left-padded to
/// `prompt_len`, responses right-padded to `response_len`.
#[derive(Debug, Clone)]
pub struct SeqBatch {
    /// `[N, prompt_len + response_len]` token ids.
    pub ids: Vec<Vec<u32>>,
    /// Same shape: true on real tokens.
    pub attention: Vec<Vec<bool>>,
    /// `[N, response_len]`: 1 on response tokens.
    pub response_mask: Mat,
    /// Width of the prompt part.
    pub prompt_len: usize,
    /// Width of the response part.
    pub response_len: usize,
}

impl SeqBatch {
    /// Lays out prompts and their completions.
    pub fn build(prompts: &[&[u32]], responses: &[&[u32]], pad_id: u32) -> Self {
        let p = prompts.iter().map(|x| x.len()).max().unwrap_or(0);
        let r = responses.iter().map(|x| x.len()).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(prompts.len());
        let mut attention = Vec::with_capacity(prompts.len());
        let mut rmask = Vec::with_capacity(prompts.len() * r);
        for (pr, re) in prompts.iter().zip(responses) {
            let mut row = vec![pad_id; p - pr.len()];
            let mut att = vec![false; p - pr.len()];
            row.extend_from_slice(pr);
            att.extend(std::iter::repeat_n(true, pr.len()));
            row.extend_from_slice(re);
            att.extend(std::iter::repeat_n(true, re.len()));
            row.extend(std::iter::repeat_n(pad_id, r - re.len()));
            att.extend(std::iter::repeat_n(false, r - re.len()));
            rmask.extend((0..r).map(|j| if j < re.len() { 1.0 } else { 0.0 }));
            ids.push(row);
            attention.push(att);
        }
        let n = ids.len();
        Self { ids, attention, response_mask: Mat::new(n, r, rmask).expect("shape by construction"), prompt_len: p, response_len: r }
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The model input for rows `rows`.
    pub fn input(&self, rows: &[usize]) -> ForwardInput {
        ForwardInput::from_mask(
            rows.iter().map(|&i| self.ids[i].clone()).collect(),
            rows.iter().map(|&i| self.attention[i].clone()).collect(),
        )
    }
}

/// Selected rows of a `[N, T]` matrix.
pub fn rows_of(m: &Mat, rows: &[usize]) -> Mat {
    let c = m.cols();
    let data = rows.iter().flat_map(|&r| m.data()[r * c..(r + 1) * c].iter().copied()).collect();
    Mat::new(rows.len(), c, data).expect("shape by construction")
}

/// Response columns `[prompt_len, prompt_len + response_len)` of a `[n, T]` tensor.
fn response_part(t: Tensor<2>, b: &SeqBatch) -> Tensor<2> {
    let [n, _] = t.dims();
    t.slice([0..n, b.prompt_len..b.prompt_len + b.response_len])
}

fn to_tensor(m: &Mat, device: &Device) -> Tensor<2> {
    burn_ops::mat_to_tensor(m, device)
}

/// Row-major `[n, r]` host matrix from a tensor.
fn to_mat(t: Tensor<2>) -> Result<Mat, TrainError> {
    Ok(burn_ops::tensor_to_mat(t)?)
}

/// Splits `rows` into chunks of `size`.
fn chunks(rows: &[usize], size: usize) -> Vec<Vec<usize>> {
    rows.chunks(size.max(1)).map(<[usize]>::to_vec).collect()
}

/// Generates responses (the rollout role).
pub trait RolloutGroup {
    /// `params.n` completions per prompt.
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError>;
}

/// The trained policy (the actor role).
pub trait ActorGroup {
    /// Per-token log-probs of the responses, no gradient.
    fn logprobs(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError>;
    /// One optimizer step over a mini-batch, with gradient accumulation over micro-batches.
    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError>;
}

/// What an actor update needs besides the sequences.
pub struct ActorMiniBatch<'a> {
    /// Rows of the batch in this mini-batch.
    pub rows: &'a [usize],
    /// `[N, R]` log-probs at rollout time.
    pub old_log_probs: &'a Mat,
    /// `[N, R]` advantages.
    pub advantages: &'a Mat,
    /// `[N, R]` reference log-probs (KL loss).
    pub ref_log_probs: Option<&'a Mat>,
}

/// The frozen reference policy.
pub trait RefGroup {
    /// Per-token log-probs of the responses.
    fn logprobs(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError>;
}

/// The value model.
pub trait CriticGroup {
    /// Per-token values of the responses.
    fn values(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError>;
    /// One optimizer step regressing values to returns.
    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64) -> Result<Metrics, TrainError>;
}

/// Policy-update settings resolved from the config.
#[derive(Clone)]
pub struct ActorSettings {
    /// Sampling temperature (log-probs are taken under `logits / temperature`).
    pub temperature: f64,
    /// Sequences per micro-batch.
    pub micro: usize,
    /// PPO loss settings.
    pub policy: PolicyLossConfig,
    /// Entropy bonus.
    pub entropy_coeff: f64,
    /// KL-loss estimator and coefficient, when on.
    pub kl_loss: Option<(KlPenalty, f64)>,
}

/// Actor and rollout in one process, sharing weights.
pub struct LocalActorRollout {
    /// The trainable policy.
    pub trainer: Trainer<CausalLm>,
    /// The no-autodiff view of the same weights used for generation.
    pub rollout_model: CausalLm,
    /// Decodes text for stop strings.
    pub tokenizer: Tokenizer,
    /// Update settings.
    pub settings: ActorSettings,
}

impl LocalActorRollout {
    /// Weight sync after an update: a pointer swap (the tensors are shared).
    pub fn sync_rollout(&mut self) {
        self.rollout_model = self.trainer.inference_model();
    }
}

impl RolloutGroup for LocalActorRollout {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, TrainError> {
        Ok(generate(&self.rollout_model, prompts, params, Some(&self.tokenizer))?.0)
    }
}

fn logprobs_of(model: &CausalLm, batch: &SeqBatch, micro: usize, temperature: f64) -> Result<Mat, TrainError> {
    let rows: Vec<usize> = (0..batch.len()).collect();
    let mut data = Vec::with_capacity(batch.len() * batch.response_len);
    for mb in chunks(&rows, micro) {
        let lp = token_logprobs(model, &batch.input(&mb), temperature, false)?.logprobs;
        data.extend_from_slice(to_mat(response_part(lp, batch))?.data());
    }
    Ok(Mat::new(batch.len(), batch.response_len, data)?)
}

impl ActorGroup for LocalActorRollout {
    fn logprobs(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError> {
        // The rollout view has no autodiff: no graph is recorded for this pass.
        logprobs_of(&self.rollout_model, batch, micro, self.settings.temperature)
    }

    fn update(&mut self, batch: &SeqBatch, mini: &ActorMiniBatch<'_>, lr: f64) -> Result<Metrics, TrainError> {
        let s = self.settings.clone();
        let device = self.trainer.model.device();
        let micro_rows = chunks(mini.rows, s.micro);
        let mask_all = rows_of(&batch.response_mask, mini.rows);
        // Normalise by the whole mini-batch so micro-batch losses add up to its loss.
        let agg = AggOptions {
            dp_size: 1,
            batch_num_tokens: Some(mask_all.data().iter().sum::<f64>()),
            global_batch_size: Some(mask_all.data().chunks(batch.response_len).filter(|r| r.iter().any(|&m| m > 0.0)).count() as f64),
            loss_scale_factor: None,
        };
        let policy_cfg = PolicyLossConfig { agg: agg.clone(), ..s.policy.clone() };
        let mode = s.policy.loss_agg_mode;
        let mut sums = Metrics::new();
        let stats = self.trainer.step(micro_rows.len(), lr, |i, model| {
            let rows = &micro_rows[i];
            let out = token_logprobs(model, &batch.input(rows), s.temperature, true)?;
            let lp = response_part(out.logprobs, batch);
            let mask = to_tensor(&rows_of(&batch.response_mask, rows), &device);
            let old = to_tensor(&rows_of(mini.old_log_probs, rows), &device);
            let adv = to_tensor(&rows_of(mini.advantages, rows), &device);
            let pl = burn_ops::policy_loss(old, lp.clone(), adv, mask.clone(), None, &policy_cfg)?;
            let share = rows.len() as f64 / mini.rows.len() as f64;
            let pg_loss = burn_ops::scalar(pl.loss.clone(), "pg_loss")?;
            let mut loss = pl.loss;
            if let Some(ent) = out.entropy {
                let ent = response_part(ent, batch);
                let ent_loss = burn_ops::agg_loss(ent, mask.clone(), mode, &agg)?;
                sums.accumulate("actor/entropy", burn_ops::scalar(ent_loss.clone(), "entropy")?);
                if s.entropy_coeff != 0.0 {
                    loss = loss - ent_loss.mul_scalar(s.entropy_coeff);
                }
            }
            if let (Some((pen, coef)), Some(r)) = (s.kl_loss, mini.ref_log_probs) {
                let ref_lp = to_tensor(&rows_of(r, rows), &device);
                let kl = burn_ops::kl_penalty(lp, ref_lp, pen)?;
                let kl_loss = burn_ops::agg_loss(kl, mask, mode, &agg)?;
                sums.accumulate("actor/kl_loss", burn_ops::scalar(kl_loss.clone(), "kl_loss")?);
                loss = loss + kl_loss.mul_scalar(coef);
            }
            for (k, v) in [
                ("actor/pg_loss", pg_loss),
                ("actor/pg_clipfrac", pl.metrics.pg_clipfrac * share),
                ("actor/ppo_kl", pl.metrics.ppo_kl * share),
                ("actor/pg_clipfrac_lower", pl.metrics.pg_clipfrac_lower * share),
            ] {
                sums.accumulate(k, v);
            }
            Ok::<_, TrainError>(loss)
        })?;
        sums.insert("actor/grad_norm", stats.grad_norm);
        sums.insert("actor/lr", lr);
        Ok(sums)
    }
}

/// The reference policy in this process.
pub struct LocalRef {
    /// Frozen weights (no autodiff).
    pub model: CausalLm,
    /// Temperature the actor uses, so log-probs are comparable.
    pub temperature: f64,
}

impl RefGroup for LocalRef {
    fn logprobs(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError> {
        logprobs_of(&self.model, batch, micro, self.temperature)
    }
}

/// The critic in this process.
pub struct LocalCritic {
    /// The value model and its optimizer.
    pub trainer: Trainer<ValueModel>,
    /// Sequences per micro-batch.
    pub micro: usize,
    /// Value-loss settings.
    pub loss: ValueLossConfig,
}

impl CriticGroup for LocalCritic {
    fn values(&mut self, batch: &SeqBatch, micro: usize) -> Result<Mat, TrainError> {
        let model = burn::module::Module::valid(&self.trainer.model);
        let rows: Vec<usize> = (0..batch.len()).collect();
        let mut data = Vec::with_capacity(batch.len() * batch.response_len);
        for mb in chunks(&rows, micro) {
            // The value of a response token is read at the position that predicts it.
            let v = model.values(&batch.input(&mb))?;
            let [n, t] = v.dims();
            let shifted = v.slice([0..n, batch.prompt_len - 1..t - 1]);
            data.extend_from_slice(to_mat(shifted)?.data());
        }
        Ok(Mat::new(batch.len(), batch.response_len, data)?)
    }

    fn update(&mut self, batch: &SeqBatch, rows: &[usize], values: &Mat, returns: &Mat, lr: f64) -> Result<Metrics, TrainError> {
        let device = self.trainer.model.net.embed_tokens.val().device();
        let micro_rows = chunks(rows, self.micro);
        let mask_all = rows_of(&batch.response_mask, rows);
        let cfg = ValueLossConfig {
            agg: AggOptions {
                dp_size: 1,
                batch_num_tokens: Some(mask_all.data().iter().sum::<f64>()),
                global_batch_size: Some(rows.len() as f64),
                loss_scale_factor: None,
            },
            ..self.loss.clone()
        };
        let mut m = Metrics::new();
        let stats = self.trainer.step(micro_rows.len(), lr, |i, model| {
            let r = &micro_rows[i];
            let v = model.values(&batch.input(r))?;
            let [n, t] = v.dims();
            let vpred = v.slice([0..n, batch.prompt_len - 1..t - 1]);
            let out = burn_ops::value_loss(
                vpred,
                to_tensor(&rows_of(returns, r), &device),
                to_tensor(&rows_of(values, r), &device),
                to_tensor(&rows_of(&batch.response_mask, r), &device),
                &cfg,
            )?;
            let share = r.len() as f64 / rows.len() as f64;
            m.accumulate("critic/vf_clipfrac", out.metrics.vf_clipfrac * share);
            m.accumulate("critic/vf_loss", burn_ops::scalar(out.loss.clone(), "vf_loss")?);
            Ok::<_, TrainError>(out.loss)
        })?;
        m.insert("critic/grad_norm", stats.grad_norm);
        m.insert("critic/lr", lr);
        Ok(m)
    }
}

/// AdamW settings for a role.
pub fn optim(weight_decay: f32, betas: [f32; 2], grad_clip: f64) -> OptimConfig {
    OptimConfig {
        beta1: betas[0],
        beta2: betas[1],
        eps: 1e-8,
        weight_decay,
        grad_clip: (grad_clip > 0.0).then_some(grad_clip),
    }
}

/// A `[n, r]` matrix of zeros.
pub fn zeros(n: usize, r: usize) -> Mat {
    Mat::new(n, r, vec![0.0; n * r]).expect("shape")
}

/// Loss aggregation mode from its config name (validated earlier).
pub fn agg_mode(name: &str) -> Result<LossAggMode, TrainError> {
    Ok(name.parse()?)
}
