//! Rewards for RL post-training: turn a policy's response into a scalar.
//!
//! Everything implements one trait, [`RewardFn`]: it takes a [`RewardInput`]
//! (verl's columns: `data_source`, `prompt`, `response`, `ground_truth`,
//! `extra_info`) and returns a [`RewardOutput`] (a score plus named parts for
//! metrics). Provided here:
//!
//! - rule rewards: [`CountdownReward`] (TinyZero), [`MathReward`] (MATH /
//!   GSM8K), [`QaReward`] (SQuAD EM/F1, Search-R1), [`FormatReward`] (regex),
//!   [`LengthReward`];
//! - combinators: [`WeightedSum`] and a [`Router`] by `data_source` that
//!   knows verl's common dataset names;
//! - [`RemoteReward`]: POSTs batches to an HTTP scorer (ours, or OpenRLHF's protocol);
//! - [`PythonReward`]: a verl or OpenRLHF reward function in a Python process of its own;
//! - config: [`RewardSpec`] (`{kind, params}`) built by [`build`] or a
//!   [`Registry`] other crates can extend.
//!
//! Malformed responses are never errors, only low scores; [`RewardError`] is
//! for bad data, bad config, unroutable samples and unreachable servers. No
//! reward panics on any response.
//!
//! Dependencies are kept to text processing, serde and a blocking HTTP
//! client (Python runs as a child process): no tensor or engine crates. A reward-model scorer that needs the
//! engine lives elsewhere and plugs in through [`Registry::register`].

mod combine;
mod countdown;
mod error;
mod extract;
mod math;
mod python;
mod qa;
mod remote;
mod shape;
mod spec;
mod types;

pub use combine::{
    Router, WeightedSum, BUILTIN_COUNTDOWN_PREFIXES, BUILTIN_COUNTDOWN_SOURCES,
    BUILTIN_MATH_PREFIXES, BUILTIN_MATH_SOURCES, BUILTIN_QA_PREFIXES, BUILTIN_QA_SOURCES,
};
pub use countdown::{CountdownConfig, CountdownReward, EquationError, Evaluated, Rat};
pub use error::RewardError;
pub use extract::{gsm8k_strict, last_boxed, last_number, last_tag_block, AnswerExtract};
pub use math::{math_equiv, normalize_math_answer, MathConfig, MathExtract, MathReward};
pub use python::{PythonConfig, PythonReward, PythonStyle};
pub use qa::{exact_match, f1_score, normalize_answer, valid_search_sequence, QaConfig, QaMetric, QaReward};
pub use remote::{RemoteConfig, RemoteProtocol, RemoteReward};
pub use shape::{FormatConfig, FormatReward, LengthConfig, LengthMode, LengthReward, LengthUnit};
pub use spec::{
    build, parse_params, CombinedParams, Constructor, Registry, RewardSpec, RouteSpec,
    RouterParams, WeightedSpec,
};
pub use types::{RewardFn, RewardInput, RewardOutput};
