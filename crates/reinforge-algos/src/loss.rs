//! Loss aggregation, the PPO policy and value losses, and entropy / log-prob from logits
//! (verl `core_algos.agg_loss`, `compute_policy_loss_vanilla`, `compute_value_loss`,
//! `torch_functional.entropy_from_logits`, `logprobs_from_logits`), in f64.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};
use crate::kl::clamp;
use crate::mat::{Labels, Logits, Mat};
use crate::stats::{masked_mean, masked_sum, masked_value, COUNT_EPS};

/// Clamp on the log importance ratio before `exp` in the policy loss.
pub const LOG_RATIO_CLAMP: f64 = 20.0;

/// How a `(B, T)` loss matrix is reduced to a scalar (verl `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LossAggMode {
    /// Masked sum / number of valid tokens (of the global batch when given) × dp_size.
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Masked sum × dp_size.
    #[serde(rename = "token-sum")]
    TokenSum,
    /// Per-row token sums, averaged over non-empty rows (of the global batch when given).
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// `seq-mean-token-sum` divided by `loss_scale_factor` (default: the padded width T).
    #[serde(rename = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
    /// Per-row token means, averaged over non-empty rows.
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
}

impl LossAggMode {
    /// Every mode, in a stable order.
    pub const ALL: [LossAggMode; 5] = [
        Self::TokenMean,
        Self::TokenSum,
        Self::SeqMeanTokenSum,
        Self::SeqMeanTokenSumNorm,
        Self::SeqMeanTokenMean,
    ];

    /// The verl name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TokenMean => "token-mean",
            Self::TokenSum => "token-sum",
            Self::SeqMeanTokenSum => "seq-mean-token-sum",
            Self::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
            Self::SeqMeanTokenMean => "seq-mean-token-mean",
        }
    }
}

impl fmt::Display for LossAggMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LossAggMode {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|m| m.as_str()).collect();
                AlgoError::unknown("loss_agg_mode", s, &names)
            })
    }
}

/// Normalisation for [`agg_loss`] when a batch is split across data-parallel ranks (verl's
/// `global_batch_info`). With `dp_size > 1` each rank must be told the global counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AggOptions {
    /// Number of data-parallel ranks whose gradients are averaged (the result is scaled by it).
    pub dp_size: usize,
    /// Valid tokens in the global batch (token-mean); defaults to the local mask sum.
    pub batch_num_tokens: Option<f64>,
    /// Non-empty rows in the global batch (seq modes); defaults to the local count.
    pub global_batch_size: Option<f64>,
    /// Divisor of `seq-mean-token-sum-norm`; defaults to the padded width T.
    pub loss_scale_factor: Option<f64>,
    /// Rows in the global batch, empty ones included: the divisor of `geo_mean`'s mean over
    /// sequences; defaults to the local row count.
    pub global_rows: Option<f64>,
}

impl Default for AggOptions {
    fn default() -> Self {
        Self {
            dp_size: 1,
            batch_num_tokens: None,
            global_batch_size: None,
            loss_scale_factor: None,
            global_rows: None,
        }
    }
}

/// Reduces `loss_mat` to a scalar under `loss_mask` (see [`LossAggMode`]). Token modes are
/// NaN-safe for masked slots; seq modes multiply `loss * mask` directly, so NaN/inf in a masked
/// slot of a non-empty row poisons the result, as in verl. A fully masked batch gives NaN.
pub fn agg_loss(
    loss_mat: &Mat,
    loss_mask: &Mat,
    mode: LossAggMode,
    opts: &AggOptions,
) -> Result<f64> {
    const OP: &str = "agg_loss";
    loss_mat.check_same_shape(loss_mask, OP, "loss_mask")?;
    let dp = opts.dp_size as f64;
    match mode {
        LossAggMode::TokenMean => {
            let denom = match opts.batch_num_tokens {
                Some(n) => n,
                None if opts.dp_size > 1 => {
                    return Err(AlgoError::invalid(
                        OP,
                        "token-mean with dp_size > 1 needs the global `batch_num_tokens`",
                    ))
                }
                None => loss_mask.data().iter().sum(),
            };
            Ok(masked_sum(loss_mat, loss_mask)? / denom * dp)
        }
        LossAggMode::TokenSum => Ok(masked_sum(loss_mat, loss_mask)? * dp),
        LossAggMode::SeqMeanTokenSum
        | LossAggMode::SeqMeanTokenSumNorm
        | LossAggMode::SeqMeanTokenMean => {
            let mut total = 0.0;
            let mut non_empty = 0.0;
            for (l, m) in loss_mat.iter_rows().zip(loss_mask.iter_rows()) {
                let count: f64 = m.iter().sum();
                // Plain multiply, not the NaN-safe masked sum: this is verl's behaviour.
                let row_sum: f64 = l.iter().zip(m).map(|(&l, &m)| l * m).sum();
                let seq_loss = if mode == LossAggMode::SeqMeanTokenMean {
                    row_sum / (count + COUNT_EPS)
                } else {
                    row_sum
                };
                let seq_mask = if count > 0.0 { 1.0 } else { 0.0 };
                total += masked_value(seq_loss, seq_mask);
                non_empty += seq_mask;
            }
            let denom = match opts.global_batch_size {
                Some(n) => n,
                None if opts.dp_size > 1 => {
                    return Err(AlgoError::invalid(
                        OP,
                        format!("{mode} with dp_size > 1 needs the global `global_batch_size`"),
                    ))
                }
                None => non_empty,
            };
            let mut loss = total / denom * dp;
            if mode == LossAggMode::SeqMeanTokenSumNorm {
                loss /= opts.loss_scale_factor.unwrap_or(loss_mask.cols() as f64);
            }
            Ok(loss)
        }
    }
}

/// Which policy loss an actor update minimises (verl's `policy_loss.loss_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyLossMode {
    /// PPO's clipped token-level loss with dual clip.
    #[serde(rename = "vanilla")]
    Vanilla,
    /// DPPO-Binary-TV: `-A · sg(min(ratio, clip_ratio_c)) · log π` on the tokens whose
    /// probability moved less than `clip_ratio_low`/`_high` in the advantage's direction.
    #[serde(rename = "dppo_tv")]
    DppoTv,
    /// DPPO-Binary-KL: as DPPO-TV, with the binary KL of the token's probability as the
    /// divergence.
    #[serde(rename = "dppo_kl")]
    DppoKl,
    /// GSPO: one importance ratio per sequence (the geometric mean of its tokens' ratios),
    /// clipped. verl 0.9 aggregates it with `loss_agg_mode` (the paper: `seq-mean-token-mean`).
    #[serde(rename = "gspo")]
    Gspo,
    /// SAPO: a sigmoid gate of the token ratio instead of a hard clip (`tau_pos`, `tau_neg`),
    /// aggregated `seq-mean-token-mean`.
    #[serde(rename = "sapo")]
    Sapo,
    /// GPG: plain policy gradient `-A · log π`, no ratio.
    #[serde(rename = "gpg")]
    Gpg,
    /// Clip-Cov: PPO clip, and the gradient of a random `clip_cov_ratio` share of the tokens
    /// whose advantage–log-prob covariance lies in `(clip_cov_lb, clip_cov_ub)` dropped.
    #[serde(rename = "clip_cov")]
    ClipCov,
    /// KL-Cov: no clip; the `kl_cov_ratio` share of tokens with the largest covariance get
    /// `ppo_kl_coef · |log ratio|` added.
    #[serde(rename = "kl_cov")]
    KlCov,
    /// GMPO: the geometric mean of the clipped token ratios per sequence, times the
    /// sequence's mean advantage, averaged over sequences.
    #[serde(rename = "geo_mean")]
    GeoMean,
    /// DRO: `-(A · log π − β/2 · (log ratio)²)` with β = `dro_beta`.
    #[serde(rename = "dro")]
    Dro,
    /// CISPO: `-sg(clip(ratio)) · A · log π`: every token keeps a gradient, the clipped
    /// ratio only weighs it.
    #[serde(rename = "cispo")]
    Cispo,
}

impl PolicyLossMode {
    /// Every mode, in a stable order.
    pub const ALL: [PolicyLossMode; 11] = [
        Self::Vanilla,
        Self::DppoTv,
        Self::DppoKl,
        Self::Gspo,
        Self::Sapo,
        Self::Gpg,
        Self::ClipCov,
        Self::KlCov,
        Self::GeoMean,
        Self::Dro,
        Self::Cispo,
    ];

    /// The verl name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vanilla => "vanilla",
            Self::DppoTv => "dppo_tv",
            Self::DppoKl => "dppo_kl",
            Self::Gspo => "gspo",
            Self::Sapo => "sapo",
            Self::Gpg => "gpg",
            Self::ClipCov => "clip_cov",
            Self::KlCov => "kl_cov",
            Self::GeoMean => "geo_mean",
            Self::Dro => "dro",
            Self::Cispo => "cispo",
        }
    }
}

impl fmt::Display for PolicyLossMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyLossMode {
    type Err = AlgoError;
    /// verl's names; `clip-cov` and `kl-cov` (the spelling of verl's config comments) too.
    fn from_str(s: &str) -> Result<Self> {
        let s = match s {
            "clip-cov" => "clip_cov",
            "kl-cov" => "kl_cov",
            s => s,
        };
        Self::ALL.into_iter().find(|m| m.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|m| m.as_str()).collect();
            AlgoError::unknown("policy_loss.loss_mode", s, &names)
        })
    }
}

/// Settings of verl's policy losses (actor config fields), with verl's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyLossConfig {
    /// Which loss.
    pub loss_mode: PolicyLossMode,
    /// Symmetric clip range ε.
    pub clip_ratio: f64,
    /// Lower clip range (ratio ≥ 1 - low); `None` falls back to `clip_ratio`.
    pub clip_ratio_low: Option<f64>,
    /// Upper clip range (ratio ≤ 1 + high); `None` falls back to `clip_ratio`.
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip bound for negative advantages; must be > 1.
    pub clip_ratio_c: f64,
    /// How the per-token loss is aggregated.
    pub loss_agg_mode: LossAggMode,
    /// Global-batch normalisation passed to [`agg_loss`].
    pub agg: AggOptions,
    /// Clip-Cov: share of the valid tokens whose gradient is dropped.
    pub clip_cov_ratio: f64,
    /// Clip-Cov: only tokens with covariance above this are candidates.
    pub clip_cov_lb: f64,
    /// Clip-Cov: only tokens with covariance below this are candidates.
    pub clip_cov_ub: f64,
    /// KL-Cov: share of the valid tokens that get the KL term.
    pub kl_cov_ratio: f64,
    /// KL-Cov: coefficient of `|log ratio|` on those tokens.
    pub ppo_kl_coef: f64,
    /// SAPO: gate temperature for tokens with a positive advantage.
    pub tau_pos: f64,
    /// SAPO: gate temperature for the others.
    pub tau_neg: f64,
    /// DRO: weight of the squared log ratio (required for `dro`).
    pub dro_beta: Option<f64>,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        Self {
            loss_mode: PolicyLossMode::Vanilla,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
            loss_agg_mode: LossAggMode::TokenMean,
            agg: AggOptions::default(),
            clip_cov_ratio: 0.0002,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            kl_cov_ratio: 0.0002,
            ppo_kl_coef: 0.1,
            tau_pos: 1.0,
            tau_neg: 1.05,
            dro_beta: None,
        }
    }
}

impl PolicyLossConfig {
    /// The effective `(low, high)` clip ranges.
    pub fn clip_range(&self) -> (f64, f64) {
        (
            self.clip_ratio_low.unwrap_or(self.clip_ratio),
            self.clip_ratio_high.unwrap_or(self.clip_ratio),
        )
    }

    /// Errors unless `clip_ratio_c > 1` (verl asserts it) and the selected mode's own
    /// settings are usable (verl asserts the two ratios; a zero gate temperature divides by 0).
    // `!(x > 0)` refuses NaN too, which `x <= 0` would let through.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(AlgoError::invalid("compute_policy_loss", msg));
        if !(self.clip_ratio_c > 1.0) {
            return bad(format!(
                "the dual-clip bound clip_ratio_c must be greater than 1.0, got {}",
                self.clip_ratio_c
            ));
        }
        match self.loss_mode {
            PolicyLossMode::ClipCov if !(self.clip_cov_ratio > 0.0) => bad(format!(
                "policy_loss.clip_cov_ratio must be greater than 0, got {}",
                self.clip_cov_ratio
            )),
            PolicyLossMode::ClipCov if !(self.clip_cov_lb < self.clip_cov_ub) => bad(format!(
                "policy_loss.clip_cov_lb ({}) must be below clip_cov_ub ({}): no token could be picked",
                self.clip_cov_lb, self.clip_cov_ub
            )),
            PolicyLossMode::KlCov if !(self.kl_cov_ratio > 0.0) => bad(format!(
                "policy_loss.kl_cov_ratio must be greater than 0, got {}",
                self.kl_cov_ratio
            )),
            PolicyLossMode::Sapo if !(self.tau_pos > 0.0 && self.tau_neg > 0.0) => bad(format!(
                "tau_pos and tau_neg must be greater than 0, got {} and {}",
                self.tau_pos, self.tau_neg
            )),
            PolicyLossMode::Dro if !self.dro_beta.is_some_and(|b| b > 0.0) => bad(
                "policy_loss.dro_beta must be set to a positive value for the `dro` loss".into(),
            ),
            _ => Ok(()),
        }
    }
}

/// Output of [`compute_policy_loss`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyLossOutput {
    /// The aggregated loss.
    pub pg_loss: f64,
    /// Masked fraction of tokens where the ratio clip was active.
    pub pg_clipfrac: f64,
    /// Masked mean of `old_log_prob - log_prob` (after the ±20 clamp).
    pub ppo_kl: f64,
    /// Masked fraction of tokens where the dual-clip cap was active (A < 0).
    pub pg_clipfrac_lower: f64,
    /// Per-token loss before aggregation (weighted, unmasked).
    pub pg_losses: Mat,
}

/// The per-token quantities of the vanilla PPO loss.
struct PpoToken {
    log_ratio: f64,
    loss: f64,
    clipped: bool,
    dual_clipped: bool,
}

fn ppo_token(old: f64, new: f64, adv: f64, low: f64, high: f64, c: f64) -> PpoToken {
    let log_ratio = clamp(new - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = log_ratio.exp();
    let l1 = -adv * ratio;
    let l2 = -adv * clamp(ratio, 1.0 - low, 1.0 + high);
    let clip1 = torch_maximum(l1, l2);
    let l3 = -adv * c;
    let clip2 = torch_minimum(l3, clip1);
    PpoToken {
        log_ratio,
        loss: if adv < 0.0 { clip2 } else { clip1 },
        clipped: l2 > l1,
        dual_clipped: clip1 > l3 && adv < 0.0,
    }
}

/// `torch.maximum`: NaN if either side is NaN (Rust's `f64::max` would drop the NaN).
fn torch_maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `torch.minimum`: NaN if either side is NaN.
fn torch_minimum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn bool_mat(like: &Mat, values: impl Iterator<Item = bool>) -> Mat {
    let mut out = like.clone();
    for (x, b) in out.data_mut().iter_mut().zip(values) {
        *x = if b { 1.0 } else { 0.0 };
    }
    out
}

/// verl's vanilla PPO clipped policy loss with dual clip. `rollout_is_weights` (if any)
/// multiply the per-token loss before aggregation; the metrics are unweighted masked means.
pub fn compute_policy_loss(
    old_log_prob: &Mat,
    log_prob: &Mat,
    advantages: &Mat,
    response_mask: &Mat,
    rollout_is_weights: Option<&Mat>,
    config: &PolicyLossConfig,
) -> Result<PolicyLossOutput> {
    const OP: &str = "compute_policy_loss";
    config.validate()?;
    if config.loss_mode != PolicyLossMode::Vanilla {
        // The other modes are checked against verl's own torch code (values and gradients)
        // through the differentiable `burn_ops::policy_loss`, which is what training runs.
        return Err(AlgoError::invalid(
            OP,
            format!(
                "the f64 reference covers `vanilla` only, not `{}`: use burn_ops::policy_loss",
                config.loss_mode
            ),
        ));
    }
    old_log_prob.check_same_shape(log_prob, OP, "log_prob")?;
    old_log_prob.check_same_shape(advantages, OP, "advantages")?;
    old_log_prob.check_same_shape(response_mask, OP, "response_mask")?;
    if let Some(w) = rollout_is_weights {
        old_log_prob.check_same_shape(w, OP, "rollout_is_weights")?;
    }
    let (low, high) = config.clip_range();
    let tokens: Vec<PpoToken> = old_log_prob
        .data()
        .iter()
        .zip(log_prob.data())
        .zip(advantages.data())
        .map(|((&o, &n), &a)| ppo_token(o, n, a, low, high, config.clip_ratio_c))
        .collect();
    let mut pg_losses = old_log_prob.clone();
    for (k, x) in pg_losses.data_mut().iter_mut().enumerate() {
        *x = tokens[k].loss * rollout_is_weights.map_or(1.0, |w| w.data()[k]);
    }
    let neg_kl = {
        let mut m = old_log_prob.clone();
        for (x, t) in m.data_mut().iter_mut().zip(&tokens) {
            *x = -t.log_ratio;
        }
        m
    };
    let ppo_kl = masked_mean(&neg_kl, response_mask)?;
    let pg_clipfrac = masked_mean(
        &bool_mat(old_log_prob, tokens.iter().map(|t| t.clipped)),
        response_mask,
    )?;
    let pg_clipfrac_lower = masked_mean(
        &bool_mat(old_log_prob, tokens.iter().map(|t| t.dual_clipped)),
        response_mask,
    )?;
    let pg_loss = agg_loss(&pg_losses, response_mask, config.loss_agg_mode, &config.agg)?;
    Ok(PolicyLossOutput {
        pg_loss,
        pg_clipfrac,
        ppo_kl,
        pg_clipfrac_lower,
        pg_losses,
    })
}

/// Settings of the clipped value loss, with verl's critic defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ValueLossConfig {
    /// New values are clipped to `old ± cliprange_value`.
    pub cliprange_value: f64,
    /// How the per-token loss is aggregated.
    pub loss_agg_mode: LossAggMode,
    /// Global-batch normalisation passed to [`agg_loss`].
    pub agg: AggOptions,
}

impl Default for ValueLossConfig {
    fn default() -> Self {
        Self {
            cliprange_value: 0.5,
            loss_agg_mode: LossAggMode::TokenMean,
            agg: AggOptions::default(),
        }
    }
}

/// Output of [`compute_value_loss`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueLossOutput {
    /// `0.5 * agg_loss(max((v - R)^2, (clip(v) - R)^2))`.
    pub vf_loss: f64,
    /// Masked fraction of tokens where the clipped error is strictly larger.
    pub vf_clipfrac: f64,
}

/// `torch.clamp(x, lo, hi)` as verl's `clip_by_value` writes it: `max(min(x, hi), lo)`.
fn clip_by_value(x: f64, lo: f64, hi: f64) -> f64 {
    torch_maximum(torch_minimum(x, hi), lo)
}

/// verl's clipped value loss. Arguments are named as in verl: `vpreds` (new predictions),
/// `returns` (targets), `values` (old predictions).
pub fn compute_value_loss(
    vpreds: &Mat,
    returns: &Mat,
    values: &Mat,
    response_mask: &Mat,
    config: &ValueLossConfig,
) -> Result<ValueLossOutput> {
    const OP: &str = "compute_value_loss";
    vpreds.check_same_shape(returns, OP, "returns")?;
    vpreds.check_same_shape(values, OP, "values")?;
    vpreds.check_same_shape(response_mask, OP, "response_mask")?;
    let c = config.cliprange_value;
    let n = vpreds.len();
    let mut losses = vpreds.clone();
    let mut clipped = vpreds.clone();
    let (v, r, old) = (vpreds.data(), returns.data(), values.data());
    for k in 0..n {
        let vclip = clip_by_value(v[k], old[k] - c, old[k] + c);
        let l1 = (v[k] - r[k]).powi(2);
        let l2 = (vclip - r[k]).powi(2);
        losses.data_mut()[k] = torch_maximum(l1, l2);
        clipped.data_mut()[k] = if l2 > l1 { 1.0 } else { 0.0 };
    }
    let vf_loss = 0.5 * agg_loss(&losses, response_mask, config.loss_agg_mode, &config.agg)?;
    let vf_clipfrac = masked_mean(&clipped, response_mask)?;
    Ok(ValueLossOutput {
        vf_loss,
        vf_clipfrac,
    })
}

/// `logsumexp` over one vocabulary row, stable for large magnitudes; follows torch for
/// non-finite inputs (all `-inf` → `-inf`, any `+inf` → `+inf`, NaN → NaN).
pub(crate) fn logsumexp(z: &[f64]) -> f64 {
    if z.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m.is_infinite() {
        return m;
    }
    let s: f64 = z.iter().map(|&x| (x - m).exp()).sum();
    m + s.ln()
}

/// Entropy of `softmax(z)` at every `(b, t)`: `logsumexp(z) - sum(softmax(z) * z)`. A `-inf`
/// logit makes that position NaN (0 × −inf), exactly like verl.
pub fn entropy_from_logits(logits: &Logits) -> Mat {
    let (b, t, v) = logits.shape();
    let mut out = Mat::zeros(b, t);
    for (k, x) in out.data_mut().iter_mut().enumerate() {
        let z = &logits.data()[k * v..(k + 1) * v];
        let lse = logsumexp(z);
        let expected_z: f64 = z.iter().map(|&zi| (zi - lse).exp() * zi).sum();
        *x = lse - expected_z;
    }
    out
}

/// `z[label] - logsumexp(z)` at every `(b, t)`; errors on a shape mismatch or a label outside
/// `0..vocab`.
pub fn logprobs_from_logits(logits: &Logits, labels: &Labels) -> Result<Mat> {
    const OP: &str = "logprobs_from_logits";
    let (b, t, v) = logits.shape();
    if labels.shape() != (b, t) {
        return Err(AlgoError::shape(
            OP,
            format!(
                "labels are {}x{} but logits are {b}x{t}x{v}",
                labels.shape().0,
                labels.shape().1
            ),
        ));
    }
    let mut out = Mat::zeros(b, t);
    for (k, x) in out.data_mut().iter_mut().enumerate() {
        let label = labels.data()[k];
        let idx = usize::try_from(label)
            .ok()
            .filter(|&i| i < v)
            .ok_or_else(|| {
                AlgoError::invalid(
                    OP,
                    format!("label {label} is outside the vocabulary 0..{v}"),
                )
            })?;
        let z = &logits.data()[k * v..(k + 1) * v];
        *x = z[idx] - logsumexp(z);
    }
    Ok(out)
}
