//! KL penalty estimators, KL controllers and the in-reward KL penalty (verl
//! `core_algos.kl_penalty`, `AdaptiveKLController`, `FixedKLController`,
//! `ray_trainer.apply_kl_penalty`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};
use crate::mat::Mat;
use crate::stats::masked_mean_rows;

/// Clamp on `ref - logprob` before `exp` in k3, and on k3's output (verl clamps only k3).
pub const K3_LOG_RATIO_CLAMP: f64 = 20.0;
/// Clamp on k3's output.
pub const K3_OUTPUT_CLAMP: f64 = 10.0;

/// The base KL estimators (John Schulman's k1/k2/k3 plus `abs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logprob - ref` (verl `kl`, `k1`).
    K1,
    /// `|logprob - ref|` (verl `abs`).
    Abs,
    /// `0.5 * (logprob - ref)^2` (verl `mse`, `k2`).
    K2,
    /// `exp(x) - x - 1` with `x = clamp(ref - logprob, ±20)`, clamped to ±10 (verl `low_var_kl`, `k3`).
    K3,
}

/// Names accepted for each estimator; a `+` suffix is accepted on any of them by [`KlPenalty`].
const KL_NAMES: [(&str, KlEstimator); 7] = [
    ("kl", KlEstimator::K1),
    ("k1", KlEstimator::K1),
    ("abs", KlEstimator::Abs),
    ("mse", KlEstimator::K2),
    ("k2", KlEstimator::K2),
    ("low_var_kl", KlEstimator::K3),
    ("k3", KlEstimator::K3),
];

impl KlEstimator {
    /// The per-token value for one `(logprob, ref_logprob)` pair.
    pub fn value(self, logprob: f64, ref_logprob: f64) -> f64 {
        match self {
            Self::K1 => logprob - ref_logprob,
            Self::Abs => (logprob - ref_logprob).abs(),
            Self::K2 => 0.5 * (logprob - ref_logprob).powi(2),
            Self::K3 => {
                let x = clamp(
                    ref_logprob - logprob,
                    -K3_LOG_RATIO_CLAMP,
                    K3_LOG_RATIO_CLAMP,
                );
                clamp(x.exp() - x - 1.0, -K3_OUTPUT_CLAMP, K3_OUTPUT_CLAMP)
            }
        }
    }

    /// The canonical short name (`k1`, `abs`, `k2`, `k3`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::K1 => "k1",
            Self::Abs => "abs",
            Self::K2 => "k2",
            Self::K3 => "k3",
        }
    }
}

/// `torch.clamp` semantics: NaN stays NaN (Rust's `f64::clamp` agrees, but is spelled out so
/// the intent survives refactoring).
pub(crate) fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    if x.is_nan() {
        x
    } else {
        x.max(lo).min(hi)
    }
}

fn valid_kl_names() -> Vec<String> {
    KL_NAMES
        .iter()
        .flat_map(|(n, _)| [n.to_string(), format!("{n}+")])
        .collect()
}

impl FromStr for KlEstimator {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim_end_matches('+') == "full" {
            return Err(AlgoError::NotImplemented {
                what: format!("the `{s}` KL estimator"),
            });
        }
        KL_NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, e)| *e)
            .ok_or_else(|| {
                let names: Vec<&str> = KL_NAMES.iter().map(|(n, _)| *n).collect();
                AlgoError::unknown("KL estimator (use KlPenalty for `+` names)", s, &names)
            })
    }
}

impl fmt::Display for KlEstimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A KL penalty as named in verl config (`kl_penalty` / `kl_loss_type`): an estimator plus an
/// optional `+` suffix. With the suffix the forward value is the named estimator's but the
/// gradient is k2's (straight-through: `k2 + (est - k2).detach()`); that matters only to the
/// burn version ([`crate::burn_ops::kl_penalty`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KlPenalty {
    /// The estimator whose value is computed.
    pub estimator: KlEstimator,
    /// The `+` suffix: use k2's gradient.
    pub straight_through: bool,
}

impl KlPenalty {
    /// The penalty with no straight-through gradient.
    pub fn plain(estimator: KlEstimator) -> Self {
        Self {
            estimator,
            straight_through: false,
        }
    }
}

impl From<KlEstimator> for KlPenalty {
    fn from(estimator: KlEstimator) -> Self {
        Self::plain(estimator)
    }
}

impl FromStr for KlPenalty {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        let (base, straight_through) = match s.strip_suffix('+') {
            Some(b) => (b, true),
            None => (s, false),
        };
        if base == "full" {
            return Err(AlgoError::NotImplemented {
                what: format!("the `{s}` KL estimator"),
            });
        }
        match KL_NAMES.iter().find(|(n, _)| *n == base) {
            Some((_, e)) => Ok(Self {
                estimator: *e,
                straight_through,
            }),
            None => {
                let names = valid_kl_names();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                Err(AlgoError::unknown("KL penalty", s, &names))
            }
        }
    }
}

impl fmt::Display for KlPenalty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{}",
            self.estimator,
            if self.straight_through { "+" } else { "" }
        )
    }
}

impl Serialize for KlPenalty {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for KlPenalty {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Elementwise KL estimate between `logprob` and `ref_logprob` (same shape).
pub fn kl_penalty(logprob: &Mat, ref_logprob: &Mat, penalty: KlPenalty) -> Result<Mat> {
    logprob.zip_map(ref_logprob, "kl_penalty", |lp, r| {
        penalty.estimator.value(lp, r)
    })
}

/// Which KL controller to use (verl `algorithm.kl_ctrl.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlControllerKind {
    /// A constant coefficient.
    Fixed,
    /// The adaptive controller of Ziegler et al. (2019).
    Adaptive,
}

impl FromStr for KlControllerKind {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fixed" => Ok(Self::Fixed),
            "adaptive" => Ok(Self::Adaptive),
            _ => Err(AlgoError::unknown(
                "KL controller type",
                s,
                &["fixed", "adaptive"],
            )),
        }
    }
}

/// KL controller settings (verl `algorithm.kl_ctrl`), with verl's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KlControllerConfig {
    /// Controller type.
    #[serde(rename = "type")]
    pub kind: KlControllerKind,
    /// The initial (or fixed) coefficient.
    pub kl_coef: f64,
    /// Target KL for the adaptive controller.
    pub target_kl: f64,
    /// Horizon (in samples) of the adaptive controller; must be > 0.
    pub horizon: f64,
}

impl Default for KlControllerConfig {
    fn default() -> Self {
        Self {
            kind: KlControllerKind::Fixed,
            kl_coef: 0.001,
            target_kl: 0.1,
            horizon: 10000.0,
        }
    }
}

/// A KL coefficient controller. Serializable so a trainer can checkpoint its state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KlController {
    /// Never changes.
    Fixed {
        /// The coefficient.
        value: f64,
    },
    /// `value *= 1 + clip(kl/target - 1, -0.2, 0.2) * n_steps / horizon` on every update.
    Adaptive {
        /// The current coefficient.
        value: f64,
        /// Target KL.
        target: f64,
        /// Horizon in samples.
        horizon: f64,
    },
}

impl KlController {
    /// A fixed controller.
    pub fn fixed(kl_coef: f64) -> Self {
        Self::Fixed { value: kl_coef }
    }

    /// An adaptive controller, unchecked (verl's class does not validate either).
    pub fn adaptive(init_kl_coef: f64, target_kl: f64, horizon: f64) -> Self {
        Self::Adaptive {
            value: init_kl_coef,
            target: target_kl,
            horizon,
        }
    }

    /// Builds a controller from config, rejecting a non-positive horizon (verl asserts it).
    pub fn from_config(cfg: &KlControllerConfig) -> Result<Self> {
        match cfg.kind {
            KlControllerKind::Fixed => Ok(Self::fixed(cfg.kl_coef)),
            KlControllerKind::Adaptive => {
                // Also rejects NaN, which no comparison admits.
                if cfg.horizon.is_nan() || cfg.horizon <= 0.0 {
                    return Err(AlgoError::invalid(
                        "KlController::from_config",
                        format!("horizon must be larger than 0, got {}", cfg.horizon),
                    ));
                }
                Ok(Self::adaptive(cfg.kl_coef, cfg.target_kl, cfg.horizon))
            }
        }
    }

    /// The current coefficient (beta).
    pub fn value(&self) -> f64 {
        match *self {
            Self::Fixed { value } | Self::Adaptive { value, .. } => value,
        }
    }

    /// Updates the coefficient after a batch with mean KL `current_kl` of `n_steps` samples.
    pub fn update(&mut self, current_kl: f64, n_steps: f64) {
        if let Self::Adaptive {
            value,
            target,
            horizon,
        } = self
        {
            let proportional_error = clamp(current_kl / *target - 1.0, -0.2, 0.2);
            let mult = 1.0 + proportional_error * n_steps / *horizon;
            *value *= mult;
        }
    }
}

/// What [`apply_kl_penalty`] produces.
#[derive(Debug, Clone, PartialEq)]
pub struct KlPenaltyOutput {
    /// `token_level_scores - beta * kl * mask`.
    pub token_level_rewards: Mat,
    /// Batch mean of the per-row masked mean KL (empty rows count as 0).
    pub current_kl: f64,
    /// The coefficient used (before the update).
    pub beta: f64,
    /// The coefficient after the controller update with `n_steps = B`.
    pub kl_coef_after_update: f64,
}

/// verl's in-reward KL penalty: subtracts `beta * kl` from the scores on valid tokens, then
/// updates `controller` with the batch KL and `n_steps = B`.
pub fn apply_kl_penalty(
    token_level_scores: &Mat,
    old_log_probs: &Mat,
    ref_log_prob: &Mat,
    response_mask: &Mat,
    penalty: KlPenalty,
    controller: &mut KlController,
) -> Result<KlPenaltyOutput> {
    const OP: &str = "apply_kl_penalty";
    token_level_scores.check_same_shape(old_log_probs, OP, "old_log_probs")?;
    token_level_scores.check_same_shape(ref_log_prob, OP, "ref_log_prob")?;
    token_level_scores.check_same_shape(response_mask, OP, "response_mask")?;
    let kld =
        kl_penalty(old_log_probs, ref_log_prob, penalty)?
            .zip_map(response_mask, OP, |k, m| k * m)?;
    let beta = controller.value();
    let token_level_rewards = token_level_scores.zip_map(&kld, OP, |s, k| s - beta * k)?;
    let per_row = masked_mean_rows(&kld, response_mask)?;
    let b = token_level_scores.rows();
    let current_kl = per_row.iter().sum::<f64>() / b as f64;
    controller.update(current_kl, b as f64);
    Ok(KlPenaltyOutput {
        token_level_rewards,
        current_kl,
        beta,
        kl_coef_after_update: controller.value(),
    })
}
