//! Pure RL numerics for Reinforge: advantage estimators, KL penalties and controllers, PPO
//! policy/value losses and loss aggregation, masked statistics, and a runner for the
//! `rl-algorithms-testvectors` reference files.
//!
//! Semantics follow verl (commit `1dda039b`, `core_algos.py`, `torch_functional.py`,
//! `ray_trainer.apply_kl_penalty`) exactly, quirks included; `shared/testvectors/README.md`
//! pins them down and [`vectors::run_vector_file`] checks them.
//!
//! Two layers:
//! - f64 reference implementations on small named containers ([`Mat`] for `(B, T)`,
//!   [`Logits`] for `(B, T, V)`): [`stats`], [`advantage`], [`kl`], [`loss`]. Advantages and
//!   the in-reward KL penalty are computed here by the trainer (they need no gradients).
//! - differentiable burn versions of the training losses in [`burn_ops`], used inside the
//!   actor/critic update; they are tested against the f64 layer (values and gradients).
//!
//! Dependencies: burn tensors only (plus serde/thiserror). This crate must not depend on the
//! engine, data, reward, cluster or any I/O crate; its only I/O is reading a test-vector file.

#![warn(missing_docs)]

pub mod advantage;
pub mod burn_ops;
pub mod error;
pub mod kl;
pub mod loss;
pub mod mat;
pub mod stats;
pub mod vectors;

pub use advantage::{
    compute_advantage, compute_gae_advantage_return, compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage, compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage, AdvantageConfig, AdvantageEstimator, AdvantageInputs,
    AdvantageOutput, GroupId,
};
pub use error::{AlgoError, Result};
pub use kl::{
    apply_kl_penalty, kl_penalty, KlController, KlControllerConfig, KlControllerKind, KlEstimator,
    KlPenalty, KlPenaltyOutput,
};
pub use loss::{
    agg_loss, compute_policy_loss, compute_value_loss, entropy_from_logits, logprobs_from_logits,
    AggOptions, LossAggMode, PolicyLossConfig, PolicyLossMode, PolicyLossOutput, ValueLossConfig,
    ValueLossOutput,
};
pub use mat::{Labels, Logits, Mat};
pub use stats::{masked_mean, masked_mean_rows, masked_sum, masked_var, masked_whiten};
pub use vectors::{run_vector_file, CaseReport, Tolerance, VectorError, VectorReport};
