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

use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::error::{AlgoError, Result};
use crate::kl::{KlEstimator, KlPenalty, K3_LOG_RATIO_CLAMP, K3_OUTPUT_CLAMP};
use crate::loss::{AggOptions, LossAggMode, PolicyLossConfig, ValueLossConfig, LOG_RATIO_CLAMP};
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

/// Metrics of the PPO policy loss, read back to the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLossMetrics {
    /// Masked fraction of tokens where the ratio clip was active.
    pub pg_clipfrac: f64,
    /// Masked mean of `old_log_prob - log_prob` (after the ±20 clamp).
    pub ppo_kl: f64,
    /// Masked fraction of tokens where the dual-clip cap was active.
    pub pg_clipfrac_lower: f64,
}

/// The differentiable policy loss and its metrics.
#[derive(Debug, Clone)]
pub struct PolicyLoss {
    /// The aggregated loss (shape `[1]`); call `.backward()` on it.
    pub loss: Tensor<1>,
    /// The per-token loss before aggregation (weighted, unmasked).
    pub pg_losses: Tensor<2>,
    /// Clip fractions and approximate KL.
    pub metrics: PolicyLossMetrics,
}

/// verl's vanilla PPO clipped policy loss with dual clip, differentiable in `log_prob`.
/// All other inputs are detached. Same semantics as [`crate::loss::compute_policy_loss`].
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
    let old_log_prob = old_log_prob.detach();
    let adv = advantages.detach();
    let mask = response_mask.detach();
    let (low, high) = config.clip_range();

    let log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.clone().exp();
    let neg_adv = adv.clone().neg();
    let l1 = neg_adv.clone() * ratio.clone();
    let l2 = neg_adv.clone() * ratio.clamp(1.0 - low, 1.0 + high);
    let clip1 = l1.clone().max_pair(l2.clone());
    let l3 = neg_adv.mul_scalar(config.clip_ratio_c);
    let clip2 = clip1.clone().min_pair(l3.clone());
    let negative = adv.lower_elem(0.0);
    let mut pg_losses = clip1.clone().mask_where(negative.clone(), clip2);
    if let Some(w) = rollout_is_weights {
        pg_losses = pg_losses * w.detach();
    }
    let loss = agg_loss(
        pg_losses.clone(),
        mask.clone(),
        config.loss_agg_mode,
        &config.agg,
    )?;

    // Metrics never need gradients; detach so they add nothing to the graph.
    let clipped = l2.detach().greater(l1.detach()).float();
    let dual = clip1
        .detach()
        .greater(l3.detach())
        .float()
        .mul(negative.float());
    let metrics = PolicyLossMetrics {
        pg_clipfrac: scalar(masked_mean(clipped, mask.clone())?, OP)?,
        ppo_kl: scalar(masked_mean(log_ratio.detach().neg(), mask.clone())?, OP)?,
        pg_clipfrac_lower: scalar(masked_mean(dual, mask)?, OP)?,
    };
    Ok(PolicyLoss {
        loss,
        pg_losses,
        metrics,
    })
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
