//! Differentiable burn versions of the training losses, for the actor and critic updates.
//!
//! burn 0.22 tensors carry their backend in the [`Device`] at run time (`Tensor<D, K>` has no
//! backend type parameter), so these functions work on any device: plain `Device::flex()` for
//! evaluation, `Device::flex().autodiff()` for training. Inputs that are data, not parameters
//! (old log-probs, advantages, masks, returns, old values, IS weights) are detached here so a
//! caller cannot accidentally backpropagate into them.
//!
//! The semantics match the f64 reference functions in [`crate::loss`], [`crate::kl`] and
//! [`crate::stats`] exactly (same clamps, same `+1e-8`, same NaN-safety); the tests check the
//! values against those and the gradients against their finite differences.

use burn::tensor::activation::{log_softmax, sigmoid, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::error::{AlgoError, Result};
use crate::kl::{KlEstimator, KlPenalty, K3_LOG_RATIO_CLAMP, K3_OUTPUT_CLAMP};
use crate::loss::{
    AggOptions, LossAggMode, PolicyLossConfig, PolicyLossMode, ValueLossConfig, LOG_RATIO_CLAMP,
};
use crate::mat::{Labels, Logits, Mat};
use crate::stats::COUNT_EPS;

/// Copies a [`Mat`] to a `(rows, cols)` float tensor on `device` (f32 on flex).
pub fn mat_to_tensor(m: &Mat, device: &Device) -> Tensor<2> {
    let data: Vec<f32> = m.data().iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, [m.rows(), m.cols()]), device)
}

/// Copies [`Logits`] to a `(batch, seq, vocab)` float tensor on `device`.
pub fn logits_to_tensor(l: &Logits, device: &Device) -> Tensor<3> {
    let (b, t, v) = l.shape();
    let data: Vec<f32> = l.data().iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, [b, t, v]), device)
}

/// Copies [`Labels`] to a `(rows, cols)` int tensor on `device`.
pub fn labels_to_tensor(l: &Labels, device: &Device) -> Tensor<2, Int> {
    let (r, c) = l.shape();
    Tensor::from_data(TensorData::new(l.data().to_vec(), [r, c]), device)
}

/// Reads a 2-D float tensor back into a [`Mat`].
pub fn tensor_to_mat(t: Tensor<2>) -> Result<Mat> {
    let [r, c] = t.dims();
    let data = t
        .try_into_vec_as::<f64>()
        .map_err(|e| AlgoError::TensorRead {
            op: "tensor_to_mat",
            msg: e.to_string(),
        })?;
    Mat::new(r, c, data)
}

/// Reads a one-element tensor back as f64.
pub fn scalar(t: Tensor<1>, op: &'static str) -> Result<f64> {
    t.try_into_scalar::<f64>()
        .map_err(|e| AlgoError::TensorRead {
            op,
            msg: e.to_string(),
        })
}

fn check_dims<const D: usize>(
    op: &'static str,
    expected: [usize; D],
    name: &str,
    t: &Tensor<D>,
) -> Result<()> {
    let got = t.dims();
    if got == expected {
        Ok(())
    } else {
        Err(AlgoError::shape(
            op,
            format!("`{name}` has shape {got:?} but expected {expected:?}"),
        ))
    }
}

/// `where(mask != 0, values, 0) * mask`: the NaN-safe masking verl uses in `masked_sum`.
fn masked<const D: usize>(values: Tensor<D>, mask: Tensor<D>) -> Tensor<D> {
    values.mask_fill(mask.clone().equal_elem(0.0), 0.0) * mask
}

/// Sum of the masked entries (NaN-safe for masked-out slots); errors on a shape mismatch.
pub fn masked_sum<const D: usize>(values: Tensor<D>, mask: Tensor<D>) -> Result<Tensor<1>> {
    check_dims("masked_sum", values.dims(), "mask", &mask)?;
    Ok(sum_masked(values, mask))
}

/// [`masked_sum`] for callers that have already checked the shapes.
fn sum_masked<const D: usize>(values: Tensor<D>, mask: Tensor<D>) -> Tensor<1> {
    masked(values, mask).sum()
}

/// `masked_sum / (mask.sum() + 1e-8)` over the whole tensor; an empty mask gives 0.
pub fn masked_mean<const D: usize>(values: Tensor<D>, mask: Tensor<D>) -> Result<Tensor<1>> {
    check_dims("masked_mean", values.dims(), "mask", &mask)?;
    let count = mask.clone().sum().add_scalar(COUNT_EPS);
    Ok(sum_masked(values, mask).div(count))
}

/// Reduces a `(B, T)` loss to a scalar exactly like [`crate::loss::agg_loss`].
pub fn agg_loss(
    loss_mat: Tensor<2>,
    loss_mask: Tensor<2>,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<Tensor<1>> {
    const OP: &str = "agg_loss";
    let dims = loss_mat.dims();
    check_dims(OP, dims, "loss_mask", &loss_mask)?;
    let loss_mask = loss_mask.detach();
    let dp = opts.dp_size as f64;
    match mode {
        LossAggMode::TokenMean => {
            let total = sum_masked(loss_mat, loss_mask.clone());
            let loss = match opts.batch_num_tokens {
                Some(n) => total.div_scalar(n),
                None if opts.dp_size > 1 => {
                    return Err(AlgoError::invalid(
                        OP,
                        "token-mean with dp_size > 1 needs the global `batch_num_tokens`",
                    ))
                }
                None => total.div(loss_mask.sum()),
            };
            Ok(loss.mul_scalar(dp))
        }
        LossAggMode::TokenSum => Ok(sum_masked(loss_mat, loss_mask).mul_scalar(dp)),
        LossAggMode::SeqMeanTokenSum
        | LossAggMode::SeqMeanTokenSumNorm
        | LossAggMode::SeqMeanTokenMean => {
            // Plain multiply (not NaN-safe) per row, as verl does.
            let row_sum = (loss_mat * loss_mask.clone()).sum_dim(1);
            let count = loss_mask.clone().sum_dim(1);
            let seq_loss = if mode == LossAggMode::SeqMeanTokenMean {
                row_sum.div(count.clone().add_scalar(COUNT_EPS))
            } else {
                row_sum
            };
            let seq_mask = count.greater_elem(0.0).float();
            let total = sum_masked(seq_loss, seq_mask.clone());
            let mut loss = match opts.global_batch_size {
                Some(n) => total.div_scalar(n),
                None if opts.dp_size > 1 => {
                    return Err(AlgoError::invalid(
                        OP,
                        format!("{mode} with dp_size > 1 needs the global `global_batch_size`"),
                    ))
                }
                None => total.div(seq_mask.sum()),
            }
            .mul_scalar(dp);
            if mode == LossAggMode::SeqMeanTokenSumNorm {
                loss = loss.div_scalar(opts.loss_scale_factor.unwrap_or(dims[1] as f64));
            }
            Ok(loss)
        }
    }
}

/// Metrics of the policy loss, read back to the host; a mode reports what verl's reports
/// (`None`: that mode has no such metric).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolicyLossMetrics {
    /// Masked fraction of tokens where the ratio clip was active (Clip-Cov: tokens whose
    /// gradient was dropped).
    pub pg_clipfrac: Option<f64>,
    /// Masked mean of `old_log_prob - log_prob` (KL-Cov: of its absolute value).
    pub ppo_kl: Option<f64>,
    /// Masked fraction of tokens where the dual-clip cap was active (GMPO: clipped tokens
    /// with a negative advantage).
    pub pg_clipfrac_lower: Option<f64>,
}

/// The differentiable policy loss and its metrics.
#[derive(Debug, Clone)]
pub struct PolicyLoss {
    /// The aggregated loss (shape `[1]`); call `.backward()` on it.
    pub loss: Tensor<1>,
    /// The loss before aggregation (weighted, unmasked): `[B, T]` per token, or `[B, 1]` per
    /// sequence for `geo_mean`.
    pub pg_losses: Tensor<2>,
    /// Clip fractions and approximate KL.
    pub metrics: PolicyLossMetrics,
}

/// The detached inputs of a policy loss, `log_prob` the one differentiable tensor.
struct LossInputs {
    old: Tensor<2>,
    lp: Tensor<2>,
    adv: Tensor<2>,
    mask: Tensor<2>,
    weights: Option<Tensor<2>>,
}

impl LossInputs {
    fn weighted(&self, pg_losses: Tensor<2>) -> Tensor<2> {
        match &self.weights {
            Some(w) => pg_losses * w.clone(),
            None => pg_losses,
        }
    }

    fn mean(&self, values: Tensor<2>) -> Result<f64> {
        scalar(masked_mean(values.detach(), self.mask.clone())?, "policy_loss")
    }
}

/// verl's policy loss `config.loss_mode` (`vanilla`: PPO clip with dual clip), differentiable
/// in `log_prob`; all other inputs are detached. `vanilla` has the semantics of
/// [`crate::loss::compute_policy_loss`]; every mode is checked against verl's torch code.
pub fn policy_loss(
    old_log_prob: Tensor<2>,
    log_prob: Tensor<2>,
    advantages: Tensor<2>,
    response_mask: Tensor<2>,
    rollout_is_weights: Option<Tensor<2>>,
    config: &PolicyLossConfig,
) -> Result<PolicyLoss> {
    const OP: &str = "policy_loss";
    config.validate()?;
    let dims = log_prob.dims();
    check_dims(OP, dims, "old_log_prob", &old_log_prob)?;
    check_dims(OP, dims, "advantages", &advantages)?;
    check_dims(OP, dims, "response_mask", &response_mask)?;
    if let Some(w) = &rollout_is_weights {
        check_dims(OP, dims, "rollout_is_weights", w)?;
    }
    let x = LossInputs {
        old: old_log_prob.detach(),
        lp: log_prob,
        adv: advantages.detach(),
        mask: response_mask.detach(),
        weights: rollout_is_weights.map(Tensor::detach),
    };
    match config.loss_mode {
        PolicyLossMode::Vanilla => vanilla(x, config),
        PolicyLossMode::Gspo => gspo(x, config),
        PolicyLossMode::Sapo => sapo(x, config),
        PolicyLossMode::Gpg => {
            let pg = x.weighted(x.lp.clone().neg() * x.adv.clone());
            let loss = agg_loss(pg.clone(), x.mask, config.loss_agg_mode, &config.agg)?;
            Ok(PolicyLoss { loss, pg_losses: pg, metrics: PolicyLossMetrics::default() })
        }
        PolicyLossMode::ClipCov => clip_cov(x, config),
        PolicyLossMode::KlCov => kl_cov(x, config),
        PolicyLossMode::GeoMean => geo_mean(x, config),
        PolicyLossMode::DppoTv | PolicyLossMode::DppoKl => dppo(x, config),
        PolicyLossMode::Dro => {
            let beta = config.dro_beta.unwrap_or_default();
            let log_ratio = x.lp.clone() - x.old.clone();
            let gain = x.lp.clone() * x.adv.clone() - log_ratio.clone().square().mul_scalar(0.5 * beta);
            let pg = x.weighted(gain.neg());
            let loss = agg_loss(pg.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
            let metrics = PolicyLossMetrics { ppo_kl: Some(x.mean(log_ratio.neg())?), ..Default::default() };
            Ok(PolicyLoss { loss, pg_losses: pg, metrics })
        }
        PolicyLossMode::Cispo => cispo(x, config),
    }
}

fn vanilla(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let (low, high) = config.clip_range();
    let log_ratio = (x.lp.clone() - x.old.clone()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.clone().exp();
    let neg_adv = x.adv.clone().neg();
    let l1 = neg_adv.clone() * ratio.clone();
    let l2 = neg_adv.clone() * ratio.clamp(1.0 - low, 1.0 + high);
    let clip1 = l1.clone().max_pair(l2.clone());
    let l3 = neg_adv.mul_scalar(config.clip_ratio_c);
    let clip2 = clip1.clone().min_pair(l3.clone());
    let negative = x.adv.clone().lower_elem(0.0);
    let pg_losses = x.weighted(clip1.clone().mask_where(negative.clone(), clip2));
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    // Metrics never need gradients; `mean` detaches so they add nothing to the graph.
    let clipped = l2.greater(l1).float();
    let dual = clip1.greater(l3).float().mul(negative.float());
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(clipped)?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(x.mean(dual)?),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

/// Per-row masked token mean `[B, T] → [B, 1]` with `count` (`[B, 1]`) as divisor.
fn row_mean(values: Tensor<2>, mask: &Tensor<2>, count: Tensor<2>) -> Tensor<2> {
    (values * mask.clone()).sum_dim(1).div(count)
}

fn gspo(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    // Ratios past e^10 only blow the loss up: verl clamps the log there.
    const LOG_SEQ_RATIO_MAX: f64 = 10.0;
    let (low, high) = config.clip_range();
    let [b, t] = x.lp.dims();
    let log_ratio = x.lp.clone() - x.old.clone();
    let lengths = x.mask.clone().sum_dim(1).clamp_min(1.0);
    let seq = row_mean(log_ratio.clone(), &x.mask, lengths).detach().expand([b, t]);
    // The value is the sequence ratio on every token; each token's gradient is its own
    // log-prob's (verl's `sg[s_i] · π / sg[π]`).
    let token = (x.lp.clone() - x.lp.clone().detach() + seq).clamp_max(LOG_SEQ_RATIO_MAX);
    let ratio = token.exp();
    let neg_adv = x.adv.clone().neg();
    let l1 = neg_adv.clone() * ratio.clone();
    let l2 = neg_adv * ratio.clamp(1.0 - low, 1.0 + high);
    let pg_losses = x.weighted(l1.clone().max_pair(l2.clone()));
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(l2.greater(l1).float())?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(0.0),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

fn sapo(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let log_ratio = (x.lp.clone() - x.old.clone()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.clone().exp();
    let tau = Tensor::<2>::full(x.lp.dims(), config.tau_neg, &x.lp.device())
        .mask_fill(x.adv.clone().greater_elem(0.0), config.tau_pos);
    // The gate 4/τ · σ(τ (r − 1)) has slope 1 at r = 1, like the unclipped ratio.
    let gate = sigmoid((ratio.sub_scalar(1.0)) * tau.clone()) * tau.recip().mul_scalar(4.0);
    let pg_losses = x.weighted(gate.neg() * x.adv.clone());
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), LossAggMode::SeqMeanTokenMean, &config.agg)?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(0.0),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(0.0),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

fn cispo(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let (low, high) = config.clip_range();
    let log_ratio = (x.lp.clone() - x.old.clone()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.clone().exp();
    let clipped = ratio.clone().clamp(1.0 - low, 1.0 + high);
    let changed = ratio.not_equal(clipped.clone()).float();
    let pg_losses = x.weighted(clipped.detach().neg() * x.adv.clone() * x.lp.clone());
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(changed)?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(0.0),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

fn geo_mean(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let (low, high) = config.clip_range();
    let log_ratio = x.lp.clone() - x.old.clone();
    let clamped = log_ratio.clone().clamp(-low, high);
    // Clip only in the direction that would grow the objective: sign(A) · min(sign(A) · x,
    // sign(A) · clip(x)).
    let sign = x.adv.clone().sign();
    let kept = sign.clone() * (sign.clone() * log_ratio.clone()).min_pair(sign * clamped.clone());
    let count = x.mask.clone().sum_dim(1).add_scalar(COUNT_EPS);
    let ratio = row_mean(kept, &x.mask, count.clone()).exp();
    let seq_adv = row_mean(x.adv.clone(), &x.mask, count.clone());
    let mut pg_losses = seq_adv.neg() * ratio;
    if let Some(w) = &x.weights {
        // Token weights become a sequence weight by their geometric mean, as in verl.
        pg_losses = pg_losses * row_mean(w.clone().add_scalar(1e-10).log(), &x.mask, count).exp();
    }
    let rows = config.agg.global_rows.unwrap_or(pg_losses.dims()[0] as f64);
    let loss = pg_losses.clone().sum().div_scalar(rows).mul_scalar(config.agg.dp_size as f64);
    let changed = log_ratio.clone().not_equal(clamped);
    let up = changed.clone().float() * x.adv.clone().greater_elem(0.0).float();
    let down = changed.float() * x.adv.clone().lower_elem(0.0).float();
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(up)?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(x.mean(down)?),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

fn dppo(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    // `clip_ratio*` bound the divergence here, not the ratio.
    let (low, high) = config.clip_range();
    let log_ratio = (x.lp.clone() - x.old.clone()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.clone().exp();
    // Truncated importance sampling in place of the dual clip.
    let truncated = ratio.clone().clamp_max(config.clip_ratio_c).detach();
    let (prob, old_prob) = (x.lp.clone().detach().exp(), x.old.clone().exp());
    let (up_ok, down_ok) = if config.loss_mode == PolicyLossMode::DppoTv {
        let moved = prob - old_prob;
        (moved.clone().lower_equal_elem(high).float(), moved.greater_equal_elem(-low).float())
    } else {
        // Added after the `1 -`: in f32, 1 + 1e-8 is 1 and a probability of 1 would divide by 0.
        const EPS: f64 = 1e-8;
        let complement = |p: Tensor<2>| p.neg().add_scalar(1.0);
        let binary_kl = old_prob.clone() * (x.old.clone() - x.lp.clone().detach())
            + complement(old_prob.clone())
                * (complement(old_prob.clone()).add_scalar(EPS) / complement(prob.clone()).add_scalar(EPS)).log();
        let fell = prob.clone().lower_equal(old_prob.clone()).float();
        let rose = prob.greater_equal(old_prob).float();
        (
            binary_kl.clone().lower_equal_elem(high).float().max_pair(fell),
            binary_kl.lower_equal_elem(low).float().max_pair(rose),
        )
    };
    let valid = down_ok.mask_where(x.adv.clone().greater_elem(0.0), up_ok);
    let pg_losses = x.weighted(x.adv.clone().neg() * truncated * x.lp.clone() * valid.clone());
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    let truncated_kept = ratio.greater_elem(config.clip_ratio_c).float() * valid.clone();
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(valid.neg().add_scalar(1.0))?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: Some(x.mean(truncated_kept)?),
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

/// Host copies of the detached inputs the covariance modes select tokens by.
struct HostInputs {
    adv: Mat,
    lp: Mat,
    mask: Mat,
}

impl HostInputs {
    fn of(x: &LossInputs) -> Result<Self> {
        Ok(Self {
            adv: tensor_to_mat(x.adv.clone())?,
            lp: tensor_to_mat(x.lp.clone().detach())?,
            mask: tensor_to_mat(x.mask.clone())?,
        })
    }

    /// Indices (row-major) of the valid tokens.
    fn valid(&self) -> Vec<usize> {
        (0..self.mask.len()).filter(|&k| self.mask.data()[k] > 0.0).collect()
    }

    /// A tensor shaped like the batch with `value` at `picked` and `rest` elsewhere.
    fn marks(&self, picked: &[usize], value: f64, rest: f64, device: &Device) -> Tensor<2> {
        let mut m = Mat::full(self.mask.rows(), self.mask.cols(), rest);
        for &k in picked {
            m.data_mut()[k] = value;
        }
        mat_to_tensor(&m, device)
    }
}

fn clip_cov(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let (low, high) = config.clip_range();
    let device = x.lp.device();
    let log_ratio = x.lp.clone() - x.old.clone();
    let ratio = log_ratio.clone().exp();
    let neg_adv = x.adv.clone().neg();
    let l1 = neg_adv.clone() * ratio.clone();
    let l2 = neg_adv * ratio.clamp(1.0 - low, 1.0 + high);
    let host = HostInputs::of(&x)?;
    let clipped = tensor_to_mat(l2.clone().greater(l1.clone()).float())?;
    let valid = host.valid();
    let candidates = clip_cov_candidates(&host, &clipped, config)?;
    let want = ((config.clip_cov_ratio * valid.len() as f64) as usize).max(1);
    let picked = pick_seeded(candidates, want, &host);
    let corr = host.marks(&picked, 0.0, 1.0, &device);
    let pg_losses = x.weighted(l1.max_pair(l2) * corr.clone());
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: Some(x.mean(corr.equal_elem(0.0).float())?),
        ppo_kl: Some(x.mean(log_ratio.neg())?),
        pg_clipfrac_lower: None,
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

/// Clip-Cov's candidates: valid, unclipped tokens whose centred advantage × centred log-prob
/// (means over the valid tokens) lies strictly inside `(clip_cov_lb, clip_cov_ub)`.
fn clip_cov_candidates(host: &HostInputs, clipped: &Mat, config: &PolicyLossConfig) -> Result<Vec<usize>> {
    let adv_mean = crate::stats::masked_mean(&host.adv, &host.mask)?;
    let lp_mean = crate::stats::masked_mean(&host.lp, &host.mask)?;
    Ok(host
        .valid()
        .into_iter()
        .filter(|&k| clipped.data()[k] == 0.0)
        .filter(|&k| {
            let cov = (host.adv.data()[k] - adv_mean) * (host.lp.data()[k] - lp_mean);
            cov > config.clip_cov_lb && cov < config.clip_cov_ub
        })
        .collect())
}

/// `want` of `candidates` at random, seeded by the batch's own numbers: the same inputs pick
/// the same tokens (so a resumed run repeats an uninterrupted one), different batches differ.
/// verl draws from torch's global generator instead.
fn pick_seeded(mut candidates: Vec<usize>, want: usize, host: &HostInputs) -> Vec<usize> {
    if candidates.len() <= want {
        return candidates;
    }
    // FNV-1a over the advantages' and log-probs' bits, then splitmix64 for the draws:
    // written out because a shuffle of a few indices needs no RNG crate.
    let mut seed = 0xcbf2_9ce4_8422_2325u64;
    for v in host.adv.data().iter().chain(host.lp.data()) {
        seed = (seed ^ v.to_bits()).wrapping_mul(0x0100_0000_01b3);
    }
    let mut next = move || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in 0..want {
        let j = i + (next() % (candidates.len() - i) as u64) as usize;
        candidates.swap(i, j);
    }
    candidates.truncate(want);
    candidates
}

fn kl_cov(x: LossInputs, config: &PolicyLossConfig) -> Result<PolicyLoss> {
    let device = x.lp.device();
    let log_ratio = x.lp.clone() - x.old.clone();
    let ratio = log_ratio.clone().exp();
    let plain = x.adv.clone().neg() * ratio;
    let with_kl = plain.clone() + log_ratio.clone().abs().mul_scalar(config.ppo_kl_coef);
    let host = HostInputs::of(&x)?;
    let valid = host.valid();
    let picked = if valid.is_empty() {
        Vec::new()
    } else {
        // Centred on the plain means of the valid tokens (no 1e-8), as verl does.
        let n = valid.len() as f64;
        let adv_mean = valid.iter().map(|&k| host.adv.data()[k]).sum::<f64>() / n;
        let lp_mean = valid.iter().map(|&k| host.lp.data()[k]).sum::<f64>() / n;
        let cov = |k: usize| (host.adv.data()[k] - adv_mean) * (host.lp.data()[k] - lp_mean);
        let want = ((n * config.kl_cov_ratio) as usize).max(1);
        let mut order = valid;
        // Largest first; equal covariances in batch order, so the pick is deterministic.
        order.sort_by(|&a, &b| cov(b).total_cmp(&cov(a)).then(a.cmp(&b)));
        order.truncate(want);
        order
    };
    let chosen = host.marks(&picked, 1.0, 0.0, &device).equal_elem(1.0);
    let pg_losses = x.weighted(plain.mask_where(chosen, with_kl));
    let loss = agg_loss(pg_losses.clone(), x.mask.clone(), config.loss_agg_mode, &config.agg)?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: None,
        ppo_kl: Some(x.mean(log_ratio.abs())?),
        pg_clipfrac_lower: None,
    };
    Ok(PolicyLoss { loss, pg_losses, metrics })
}

/// Metrics of the value loss, read back to the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueLossMetrics {
    /// Masked fraction of tokens where the clipped error is strictly larger.
    pub vf_clipfrac: f64,
}

/// The differentiable value loss and its metrics.
#[derive(Debug, Clone)]
pub struct ValueLoss {
    /// `0.5 * agg_loss(max((v - R)^2, (clip(v) - R)^2))` (shape `[1]`).
    pub loss: Tensor<1>,
    /// Clip fraction.
    pub metrics: ValueLossMetrics,
}

/// verl's clipped value loss, differentiable in `vpreds`; `returns` and `values` (old
/// predictions) are detached. Same semantics as [`crate::loss::compute_value_loss`].
pub fn value_loss(
    vpreds: Tensor<2>,
    returns: Tensor<2>,
    values: Tensor<2>,
    response_mask: Tensor<2>,
    config: &ValueLossConfig,
) -> Result<ValueLoss> {
    const OP: &str = "value_loss";
    let dims = vpreds.dims();
    check_dims(OP, dims, "returns", &returns)?;
    check_dims(OP, dims, "values", &values)?;
    check_dims(OP, dims, "response_mask", &response_mask)?;
    let returns = returns.detach();
    let values = values.detach();
    let mask = response_mask.detach();
    let c = config.cliprange_value;
    // verl's clip_by_value: max(min(x, old + c), old - c), elementwise bounds.
    let vclip = vpreds
        .clone()
        .min_pair(values.clone().add_scalar(c))
        .max_pair(values.sub_scalar(c));
    let l1 = (vpreds - returns.clone()).square();
    let l2 = (vclip - returns).square();
    let losses = l1.clone().max_pair(l2.clone());
    let loss = agg_loss(losses, mask.clone(), config.loss_agg_mode, &config.agg)?.mul_scalar(0.5);
    let clipped = l2.detach().greater(l1.detach()).float();
    Ok(ValueLoss {
        loss,
        metrics: ValueLossMetrics {
            vf_clipfrac: scalar(masked_mean(clipped, mask)?, OP)?,
        },
    })
}

fn kl_value<const D: usize>(
    estimator: KlEstimator,
    logprob: Tensor<D>,
    ref_logprob: Tensor<D>,
) -> Tensor<D> {
    match estimator {
        KlEstimator::K1 => logprob - ref_logprob,
        KlEstimator::Abs => (logprob - ref_logprob).abs(),
        KlEstimator::K2 => (logprob - ref_logprob).square().mul_scalar(0.5),
        KlEstimator::K3 => {
            let x = (ref_logprob - logprob).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP);
            (x.clone().exp() - x)
                .sub_scalar(1.0)
                .clamp(-K3_OUTPUT_CLAMP, K3_OUTPUT_CLAMP)
        }
    }
}

/// Elementwise KL estimate. With a straight-through penalty (`k3+` etc.) the value is the
/// named estimator's and the gradient is k2's: `k2 + (est - k2).detach()`, as in verl.
pub fn kl_penalty<const D: usize>(
    logprob: Tensor<D>,
    ref_logprob: Tensor<D>,
    penalty: KlPenalty,
) -> Result<Tensor<D>> {
    check_dims("kl_penalty", logprob.dims(), "ref_logprob", &ref_logprob)?;
    let value = kl_value(penalty.estimator, logprob.clone(), ref_logprob.clone());
    if !penalty.straight_through || penalty.estimator == KlEstimator::K2 {
        return Ok(value);
    }
    let k2 = kl_value(KlEstimator::K2, logprob, ref_logprob);
    Ok(k2.clone() + (value - k2).detach())
}

/// Entropy of `softmax(logits)` over the vocabulary: `(B, T, V) → (B, T)`. Written as
/// `-sum(p * log p)`, which equals verl's `logsumexp - sum(p * z)` but keeps f32 accuracy for
/// large logits; a `-inf` logit still gives NaN (0 × −inf), as in verl.
pub fn entropy_from_logits(logits: Tensor<3>) -> Tensor<2> {
    let logp = log_softmax(logits.clone(), 2);
    let p = softmax(logits, 2);
    (p * logp).sum_dim(2).squeeze_dim::<2>(2).neg()
}

/// `log softmax(logits)[label]`: `(B, T, V)` and `(B, T)` labels `→ (B, T)`. Errors on a shape
/// mismatch or an out-of-range label (reads the labels' min/max back to check).
pub fn logprobs_from_logits(logits: Tensor<3>, labels: Tensor<2, Int>) -> Result<Tensor<2>> {
    const OP: &str = "logprobs_from_logits";
    let [b, t, v] = logits.dims();
    if labels.dims() != [b, t] {
        return Err(AlgoError::shape(
            OP,
            format!(
                "labels have shape {:?} but logits are {:?}",
                labels.dims(),
                [b, t, v]
            ),
        ));
    }
    if b * t > 0 {
        let read = |x: Tensor<1, Int>| {
            x.try_into_scalar::<i64>()
                .map_err(|e| AlgoError::TensorRead {
                    op: OP,
                    msg: e.to_string(),
                })
        };
        let lo = read(labels.clone().min())?;
        let hi = read(labels.clone().max())?;
        if lo < 0 || hi >= v as i64 {
            return Err(AlgoError::invalid(
                OP,
                format!("labels span {lo}..={hi}, outside the vocabulary 0..{v}"),
            ));
        }
    }
    Ok(log_softmax(logits, 2)
        .gather(2, labels.unsqueeze_dim::<3>(2))
        .squeeze_dim::<2>(2))
}
