//! The reward trait and the values that flow through it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RewardError;

/// One sample to score: a prompt, the policy's response and the dataset's reference.
///
/// Field names follow verl's parquet columns so rows map over one-to-one
/// (`reward_model.ground_truth` becomes `ground_truth`). The same JSON shape is
/// what [`crate::RemoteReward`] sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardInput {
    /// Dataset name, used by [`crate::Router`] to pick a reward (e.g. `openai/gsm8k`).
    #[serde(default)]
    pub data_source: String,
    /// Prompt text as shown to the policy (rule rewards ignore it).
    #[serde(default)]
    pub prompt: String,
    /// The policy's response text only, without the prompt.
    pub response: String,
    /// Reference answer: string, number, list, or object (Countdown: `{"target", "numbers"}`).
    #[serde(default)]
    pub ground_truth: Value,
    /// Free-form per-sample metadata, passed through to remote scorers.
    #[serde(default)]
    pub extra_info: Value,
}

impl RewardInput {
    /// A sample with an empty prompt and no extra info.
    pub fn new(
        data_source: impl Into<String>,
        response: impl Into<String>,
        ground_truth: Value,
    ) -> Self {
        RewardInput {
            data_source: data_source.into(),
            prompt: String::new(),
            response: response.into(),
            ground_truth,
            extra_info: Value::Null,
        }
    }

    /// Sets the prompt.
    pub fn with_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.prompt = prompt.into();
        self
    }

    /// Sets the extra info.
    pub fn with_extra_info(mut self, extra_info: Value) -> Self {
        self.extra_info = extra_info;
        self
    }
}

/// A scalar reward plus named components for logging.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardOutput {
    /// The reward the trainer uses.
    pub score: f64,
    /// Named parts (e.g. `format`, `answer`) for metrics; sorted so logs are stable.
    #[serde(default)]
    pub details: BTreeMap<String, f64>,
}

impl RewardOutput {
    /// An output with no details.
    pub fn new(score: f64) -> Self {
        RewardOutput {
            score,
            details: BTreeMap::new(),
        }
    }

    /// Adds one named component.
    pub fn with(mut self, key: impl Into<String>, value: f64) -> Self {
        self.details.insert(key.into(), value);
        self
    }

    /// Reads one named component.
    pub fn detail(&self, key: &str) -> Option<f64> {
        self.details.get(key).copied()
    }

    /// Adds the finite numbers of a JSON `details` object (other values are not metrics).
    pub(crate) fn with_json_details(mut self, details: Option<&Value>) -> Self {
        if let Some(Value::Object(d)) = details {
            for (k, v) in d {
                if let Some(x) = v.as_f64().filter(|x| x.is_finite()) {
                    self.details.insert(k.clone(), x);
                }
            }
        }
        self
    }
}

/// Turns a response into a scalar reward.
///
/// Implementations must not panic on any input: malformed responses get low
/// scores, and only data/config/transport problems become [`RewardError`]s.
pub trait RewardFn: Send + Sync {
    /// Short name used in metrics and error messages.
    fn name(&self) -> &str;

    /// Scores one sample.
    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError>;

    /// Scores a batch, in order; override when one call per batch is cheaper (remote).
    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        samples.iter().map(|s| self.score(s)).collect()
    }
}

impl<T: RewardFn + ?Sized> RewardFn for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        (**self).score(sample)
    }
    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        (**self).score_batch(samples)
    }
}

impl<T: RewardFn + ?Sized> RewardFn for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn score(&self, sample: &RewardInput) -> Result<RewardOutput, RewardError> {
        (**self).score(sample)
    }
    fn score_batch(&self, samples: &[RewardInput]) -> Result<Vec<RewardOutput>, RewardError> {
        (**self).score_batch(samples)
    }
}

/// Checks a batch result has one output per input (combinators rely on it).
pub(crate) fn check_batch_len(
    reward: &str,
    expected: usize,
    outputs: &[RewardOutput],
) -> Result<(), RewardError> {
    if outputs.len() == expected {
        Ok(())
    } else {
        Err(RewardError::BatchLength {
            reward: reward.to_string(),
            expected,
            got: outputs.len(),
        })
    }
}
