//! Advantage estimators (verl `core_algos.compute_*_advantage*`), in f64.
//!
//! Every estimator returns [`AdvantageOutput`] with `advantages` and `returns`, both `(B, T)`.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{AlgoError, Result};
use crate::mat::Mat;
use crate::stats::masked_whiten;

/// The group (verl's `uid`) a response belongs to. Rows are grouped by equality; JSON data
/// may carry ids as strings or integers, which never compare equal to each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroupId {
    /// An integer id.
    Int(i64),
    /// A string id (usually a UUID).
    Str(String),
}

impl From<i64> for GroupId {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for GroupId {
    fn from(v: &str) -> Self {
        Self::Str(v.to_string())
    }
}

impl From<String> for GroupId {
    fn from(v: String) -> Self {
        Self::Str(v)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Str(s) => write!(f, "{s}"),
        }
    }
}

/// The advantage estimators this crate implements, named as in verl's `algorithm.adv_estimator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Generalized Advantage Estimation with a critic (PPO).
    Gae,
    /// Group-relative outcome advantage (GRPO; Dr.GRPO with `norm_adv_by_std_in_grpo = false`).
    Grpo,
    /// REINFORCE++: discounted reward-to-go, whitened over the batch.
    ReinforcePlusPlus,
    /// REINFORCE++ with the group mean as baseline, whitened over the batch.
    ReinforcePlusPlusBaseline,
    /// ReMax: reward-to-go minus a greedy-rollout baseline.
    Remax,
    /// RLOO: leave-one-out group baseline.
    Rloo,
    /// GPG: the group mean as baseline, scaled by the batch's share of non-zero rewards.
    Gpg,
}

impl AdvantageEstimator {
    /// Every estimator, in a stable order.
    pub const ALL: [AdvantageEstimator; 7] = [
        Self::Gae,
        Self::Grpo,
        Self::ReinforcePlusPlus,
        Self::ReinforcePlusPlusBaseline,
        Self::Remax,
        Self::Rloo,
        Self::Gpg,
    ];

    /// The verl name (`gae`, `grpo`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gae => "gae",
            Self::Grpo => "grpo",
            Self::ReinforcePlusPlus => "reinforce_plus_plus",
            Self::ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
            Self::Remax => "remax",
            Self::Rloo => "rloo",
            Self::Gpg => "gpg",
        }
    }

    /// Whether the estimator needs a critic's values (only GAE).
    pub fn needs_critic(self) -> bool {
        matches!(self, Self::Gae)
    }

    /// Whether the estimator needs group ids (GRPO, RLOO, REINFORCE++-baseline, GPG).
    pub fn needs_groups(self) -> bool {
        matches!(
            self,
            Self::Grpo | Self::Rloo | Self::ReinforcePlusPlusBaseline | Self::Gpg
        )
    }
}

impl fmt::Display for AdvantageEstimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AdvantageEstimator {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|e| e.as_str()).collect();
                AlgoError::unknown("advantage estimator", s, &names)
            })
    }
}

/// Advantages and returns, both `(B, T)`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdvantageOutput {
    /// Per-token advantages.
    pub advantages: Mat,
    /// Per-token returns (the critic's regression target for GAE).
    pub returns: Mat,
}

/// Hyper-parameters shared by the estimators, with verl's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvantageConfig {
    /// Discount factor (GAE, REINFORCE++).
    pub gamma: f64,
    /// GAE lambda.
    pub lam: f64,
    /// Added to the group std in GRPO.
    pub epsilon: f64,
    /// GRPO divides by the group std; `false` gives Dr.GRPO.
    pub norm_adv_by_std_in_grpo: bool,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        Self {
            gamma: 1.0,
            lam: 1.0,
            epsilon: 1e-6,
            norm_adv_by_std_in_grpo: true,
        }
    }
}

/// The batch an estimator reads; which optional fields are needed depends on the estimator.
#[derive(Debug, Clone, Copy)]
pub struct AdvantageInputs<'a> {
    /// `(B, T)` rewards (scores minus any in-reward KL penalty).
    pub token_level_rewards: &'a Mat,
    /// `(B, T)` mask of valid response tokens.
    pub response_mask: &'a Mat,
    /// `(B, T)` critic values (GAE only).
    pub values: Option<&'a Mat>,
    /// `B` group ids (GRPO, RLOO, REINFORCE++-baseline).
    pub index: Option<&'a [GroupId]>,
    /// `B` baseline rewards (ReMax only).
    pub reward_baselines: Option<&'a [f64]>,
}

/// Runs `estimator` on `inputs`; errors when an input the estimator needs is missing.
pub fn compute_advantage(
    estimator: AdvantageEstimator,
    inputs: &AdvantageInputs<'_>,
    config: &AdvantageConfig,
) -> Result<AdvantageOutput> {
    let missing = |what: &str| {
        AlgoError::invalid(
            "compute_advantage",
            format!("estimator `{estimator}` needs `{what}`, which was not provided"),
        )
    };
    let r = inputs.token_level_rewards;
    let m = inputs.response_mask;
    match estimator {
        AdvantageEstimator::Gae => {
            let v = inputs.values.ok_or_else(|| missing("values"))?;
            compute_gae_advantage_return(r, v, m, config.gamma, config.lam)
        }
        AdvantageEstimator::Grpo => {
            let idx = inputs.index.ok_or_else(|| missing("index"))?;
            compute_grpo_outcome_advantage(
                r,
                m,
                idx,
                config.epsilon,
                config.norm_adv_by_std_in_grpo,
            )
        }
        AdvantageEstimator::ReinforcePlusPlus => {
            compute_reinforce_plus_plus_outcome_advantage(r, m, config.gamma)
        }
        AdvantageEstimator::ReinforcePlusPlusBaseline => {
            let idx = inputs.index.ok_or_else(|| missing("index"))?;
            compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, idx)
        }
        AdvantageEstimator::Remax => {
            let b = inputs
                .reward_baselines
                .ok_or_else(|| missing("reward_baselines"))?;
            compute_remax_outcome_advantage(r, b, m)
        }
        AdvantageEstimator::Rloo => {
            let idx = inputs.index.ok_or_else(|| missing("index"))?;
            compute_rloo_outcome_advantage(r, m, idx)
        }
        AdvantageEstimator::Gpg => {
            let idx = inputs.index.ok_or_else(|| missing("index"))?;
            compute_gpg_outcome_advantage(r, m, idx)
        }
    }
}

/// GAE advantages (whitened over the batch, not re-masked) and returns (un-whitened
/// advantages + values). Mask-0 positions pass the running value and accumulator through, so
/// observation spans inside a multi-turn response are skipped. Errors with < 2 valid tokens.
pub fn compute_gae_advantage_return(
    token_level_rewards: &Mat,
    values: &Mat,
    response_mask: &Mat,
    gamma: f64,
    lam: f64,
) -> Result<AdvantageOutput> {
    const OP: &str = "compute_gae_advantage_return";
    token_level_rewards.check_same_shape(values, OP, "values")?;
    token_level_rewards.check_same_shape(response_mask, OP, "response_mask")?;
    let (b, t_len) = token_level_rewards.shape();
    let mut adv = Mat::zeros(b, t_len);
    let (r, v, m) = (
        token_level_rewards.data(),
        values.data(),
        response_mask.data(),
    );
    let out = adv.data_mut();
    for i in 0..b {
        let mut next_value = 0.0;
        let mut last_gae = 0.0;
        for t in (0..t_len).rev() {
            let k = i * t_len + t;
            let delta = r[k] + gamma * next_value - v[k];
            let gae = delta + gamma * lam * last_gae;
            // verl blends with the mask arithmetically rather than branching; keep that form
            // so non-binary or non-finite inputs behave identically.
            next_value = v[k] * m[k] + (1.0 - m[k]) * next_value;
            last_gae = gae * m[k] + (1.0 - m[k]) * last_gae;
            out[k] = last_gae;
        }
    }
    let returns = adv.zip_map(values, OP, |a, v| a + v)?;
    let advantages = masked_whiten(&adv, response_mask, true).map_err(|e| rename(e, OP))?;
    Ok(AdvantageOutput {
        advantages,
        returns,
    })
}

/// Re-labels an error from a helper so the message names the public function called.
fn rename(e: AlgoError, op: &'static str) -> AlgoError {
    match e {
        AlgoError::InvalidInput { msg, op: inner } => AlgoError::InvalidInput {
            op,
            msg: format!("{inner}: {msg}"),
        },
        other => other,
    }
}

/// Groups row indices by id, in order of first appearance.
fn group_rows(index: &[GroupId]) -> (Vec<&GroupId>, HashMap<&GroupId, Vec<usize>>) {
    let mut order = Vec::new();
    let mut groups: HashMap<&GroupId, Vec<usize>> = HashMap::new();
    for (i, id) in index.iter().enumerate() {
        groups
            .entry(id)
            .or_insert_with(|| {
                order.push(id);
                Vec::new()
            })
            .push(i);
    }
    (order, groups)
}

fn check_outcome_inputs(
    op: &'static str,
    token_level_rewards: &Mat,
    response_mask: &Mat,
    index: &[GroupId],
) -> Result<()> {
    token_level_rewards.check_same_shape(response_mask, op, "response_mask")?;
    if index.len() != token_level_rewards.rows() {
        return Err(AlgoError::shape(
            op,
            format!(
                "`index` has {} entries but the batch has {} rows",
                index.len(),
                token_level_rewards.rows()
            ),
        ));
    }
    Ok(())
}

/// Row sums of the *unmasked* rewards: verl scores a response by its whole reward row.
fn row_scores(token_level_rewards: &Mat) -> Vec<f64> {
    token_level_rewards
        .iter_rows()
        .map(|r| r.iter().sum())
        .collect()
}

/// `scores[i] * mask[i, t]` for every position.
fn broadcast_times_mask(scores: &[f64], response_mask: &Mat) -> Mat {
    let cols = response_mask.cols();
    let mut out = response_mask.clone();
    for (k, x) in out.data_mut().iter_mut().enumerate() {
        *x *= scores[k / cols.max(1)];
    }
    out
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sample standard deviation with Bessel's correction (torch.std's default).
fn unbiased_std(xs: &[f64], mean: f64) -> f64 {
    let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    (ss / (xs.len() as f64 - 1.0)).sqrt()
}

/// GRPO: `(score - group mean) / (group std + epsilon)` (or `score - mean` for Dr.GRPO when
/// `norm_adv_by_std` is false), broadcast over the row and multiplied by the mask. Scores are
/// unmasked row sums; a singleton group uses mean 0 and std 1. `returns == advantages`.
pub fn compute_grpo_outcome_advantage(
    token_level_rewards: &Mat,
    response_mask: &Mat,
    index: &[GroupId],
    epsilon: f64,
    norm_adv_by_std: bool,
) -> Result<AdvantageOutput> {
    check_outcome_inputs(
        "compute_grpo_outcome_advantage",
        token_level_rewards,
        response_mask,
        index,
    )?;
    let raw = row_scores(token_level_rewards);
    let mut scores = raw.clone();
    let (order, groups) = group_rows(index);
    for id in order {
        let rows = &groups[id];
        let (mu, sd) = if rows.len() == 1 {
            (0.0, 1.0)
        } else {
            let xs: Vec<f64> = rows.iter().map(|&i| raw[i]).collect();
            let mu = mean(&xs);
            (mu, unbiased_std(&xs, mu))
        };
        for &i in rows {
            scores[i] = if norm_adv_by_std {
                (raw[i] - mu) / (sd + epsilon)
            } else {
                raw[i] - mu
            };
        }
    }
    let adv = broadcast_times_mask(&scores, response_mask);
    Ok(AdvantageOutput {
        returns: adv.clone(),
        advantages: adv,
    })
}

/// RLOO: in a group of n > 1, `s*n/(n-1) - mean*n/(n-1)` (the score minus the mean of the
/// other members); a singleton keeps its raw score. Broadcast times mask; `returns == advantages`.
pub fn compute_rloo_outcome_advantage(
    token_level_rewards: &Mat,
    response_mask: &Mat,
    index: &[GroupId],
) -> Result<AdvantageOutput> {
    check_outcome_inputs(
        "compute_rloo_outcome_advantage",
        token_level_rewards,
        response_mask,
        index,
    )?;
    let raw = row_scores(token_level_rewards);
    let mut scores = raw.clone();
    let (order, groups) = group_rows(index);
    for id in order {
        let rows = &groups[id];
        if rows.len() < 2 {
            continue;
        }
        let n = rows.len() as f64;
        let xs: Vec<f64> = rows.iter().map(|&i| raw[i]).collect();
        let mu = mean(&xs);
        for &i in rows {
            // Same operation order as verl, so results agree to the last bit.
            scores[i] = raw[i] * n / (n - 1.0) - mu * n / (n - 1.0);
        }
    }
    let adv = broadcast_times_mask(&scores, response_mask);
    Ok(AdvantageOutput {
        returns: adv.clone(),
        advantages: adv,
    })
}

/// GPG (verl's `compute_gpg_outcome_advantage`, `f_norm` 1): `alpha · (score − group mean)`
/// with `alpha = B / max(1, number of non-zero scores)` over the whole batch (a NaN counts as
/// non-zero, as in torch), broadcast over the row and multiplied by the mask; a singleton
/// group uses mean 0. `returns == advantages`.
pub fn compute_gpg_outcome_advantage(
    token_level_rewards: &Mat,
    response_mask: &Mat,
    index: &[GroupId],
) -> Result<AdvantageOutput> {
    check_outcome_inputs(
        "compute_gpg_outcome_advantage",
        token_level_rewards,
        response_mask,
        index,
    )?;
    let raw = row_scores(token_level_rewards);
    let nonzero = raw.iter().filter(|&&s| s != 0.0).count().max(1);
    let alpha = raw.len() as f64 / nonzero as f64;
    let scores: Vec<f64> = centred_on_group_mean(&raw, index).iter().map(|c| alpha * c).collect();
    let adv = broadcast_times_mask(&scores, response_mask);
    Ok(AdvantageOutput {
        returns: adv.clone(),
        advantages: adv,
    })
}

/// REINFORCE++: the discounted reward-to-go scanned right to left over valid tokens only
/// (masked positions return 0 and pass the running return through undiscounted; their
/// rewards are ignored), then `advantages = masked_whiten(returns) * mask`. `returns` is the
/// raw scan. Errors with < 2 valid tokens.
pub fn compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: &Mat,
    response_mask: &Mat,
    gamma: f64,
) -> Result<AdvantageOutput> {
    const OP: &str = "compute_reinforce_plus_plus_outcome_advantage";
    token_level_rewards.check_same_shape(response_mask, OP, "response_mask")?;
    let (b, t_len) = token_level_rewards.shape();
    let (r, m) = (token_level_rewards.data(), response_mask.data());
    let mut returns = Mat::zeros(b, t_len);
    let out = returns.data_mut();
    for i in 0..b {
        let mut running = 0.0;
        for t in (0..t_len).rev() {
            let k = i * t_len + t;
            let candidate = r[k] + gamma * running;
            out[k] = candidate * m[k];
            if m[k] != 0.0 {
                running = candidate;
            }
        }
    }
    let whitened = masked_whiten(&returns, response_mask, true).map_err(|e| rename(e, OP))?;
    let advantages = whitened.zip_map(response_mask, OP, |a, m| a * m)?;
    Ok(AdvantageOutput {
        advantages,
        returns,
    })
}

/// Each score minus its group's mean (0 for a singleton group): the baseline REINFORCE++ and
/// GPG share.
fn centred_on_group_mean(raw: &[f64], index: &[GroupId]) -> Vec<f64> {
    let mut scores = raw.to_vec();
    let (order, groups) = group_rows(index);
    for id in order {
        let rows = &groups[id];
        let mu = if rows.len() == 1 {
            0.0
        } else {
            let xs: Vec<f64> = rows.iter().map(|&i| raw[i]).collect();
            mean(&xs)
        };
        for &i in rows {
            scores[i] = raw[i] - mu;
        }
    }
    scores
}

/// REINFORCE++-baseline: unmasked row score minus the group mean (0 for a singleton),
/// broadcast times mask, whitened over the batch and masked again. `returns == advantages`.
/// Errors with < 2 valid tokens.
pub fn compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: &Mat,
    response_mask: &Mat,
    index: &[GroupId],
) -> Result<AdvantageOutput> {
    const OP: &str = "compute_reinforce_plus_plus_baseline_outcome_advantage";
    check_outcome_inputs(OP, token_level_rewards, response_mask, index)?;
    let scores = centred_on_group_mean(&row_scores(token_level_rewards), index);
    let centred = broadcast_times_mask(&scores, response_mask);
    let whitened = masked_whiten(&centred, response_mask, true).map_err(|e| rename(e, OP))?;
    let adv = whitened.zip_map(response_mask, OP, |a, m| a * m)?;
    Ok(AdvantageOutput {
        returns: adv.clone(),
        advantages: adv,
    })
}

/// ReMax: `returns` is the reverse cumulative sum of `rewards * mask`, and
/// `advantages = returns - baseline * mask` (the baseline only hits valid tokens).
pub fn compute_remax_outcome_advantage(
    token_level_rewards: &Mat,
    reward_baselines: &[f64],
    response_mask: &Mat,
) -> Result<AdvantageOutput> {
    const OP: &str = "compute_remax_outcome_advantage";
    token_level_rewards.check_same_shape(response_mask, OP, "response_mask")?;
    let (b, t_len) = token_level_rewards.shape();
    if reward_baselines.len() != b {
        return Err(AlgoError::shape(
            OP,
            format!(
                "`reward_baselines` has {} entries but the batch has {b} rows",
                reward_baselines.len()
            ),
        ));
    }
    let (r, m) = (token_level_rewards.data(), response_mask.data());
    let mut returns = Mat::zeros(b, t_len);
    let mut advantages = Mat::zeros(b, t_len);
    {
        let ret = returns.data_mut();
        for i in 0..b {
            let mut acc = 0.0;
            for t in (0..t_len).rev() {
                let k = i * t_len + t;
                acc += r[k] * m[k];
                ret[k] = acc;
            }
        }
    }
    let ret = returns.data();
    for (k, a) in advantages.data_mut().iter_mut().enumerate() {
        *a = ret[k] - reward_baselines[k / t_len.max(1)] * m[k];
    }
    Ok(AdvantageOutput {
        advantages,
        returns,
    })
}
