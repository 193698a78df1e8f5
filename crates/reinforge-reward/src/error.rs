//! The one error type of this crate.
//!
//! A badly formatted *response* is never an error: it earns a low score, because
//! that is the signal RL needs. Errors are reserved for things a person must fix:
//! broken data (ground truth of the wrong shape), config mistakes, unroutable
//! samples and an unreachable remote scorer.

use thiserror::Error;

/// Everything that can go wrong while building or running a reward.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RewardError {
    /// The sample's `ground_truth` does not have the shape this reward needs (a data bug).
    #[error("reward `{reward}`: invalid ground_truth for data_source `{data_source}`: {message}")]
    InvalidGroundTruth {
        /// Name of the reward that rejected it.
        reward: String,
        /// The sample's data_source, to find the offending dataset.
        data_source: String,
        /// What was wrong.
        message: String,
    },

    /// The router has no route for this data_source and no default.
    #[error(
        "no reward for data_source `{data_source}` and no default route; known data sources: {}; \
         add a route or a default to the reward router config",
        .known.join(", ")
    )]
    UnknownDataSource {
        /// The data_source that could not be routed.
        data_source: String,
        /// Exact names and `prefix*` patterns the router knows.
        known: Vec<String>,
    },

    /// A config asked for a reward kind that is not registered.
    #[error("unknown reward kind `{name}`; valid kinds: {}", .valid.join(", "))]
    UnknownKind {
        /// The requested kind.
        name: String,
        /// All registered kinds.
        valid: Vec<String>,
    },

    /// A reward's params are invalid (unknown field, bad value, bad regex...).
    #[error("invalid config for reward kind `{kind}`: {message}")]
    Config {
        /// The reward kind whose params were rejected.
        kind: String,
        /// What was wrong.
        message: String,
    },

    /// The remote scorer could not be reached (or kept failing) within the retry budget.
    #[error(
        "remote reward at {url} unreachable after {tries} {}: {last_error}; \
         check the server or reward.remote.url",
        if *.tries == 1 { "try" } else { "tries" }
    )]
    RemoteUnreachable {
        /// Endpoint that was tried.
        url: String,
        /// How many requests were sent.
        tries: u32,
        /// The last transport error or HTTP status seen.
        last_error: String,
    },

    /// The remote scorer answered, but not with something usable (4xx, bad JSON, wrong length).
    #[error("remote reward at {url} returned an unusable response: {message}")]
    RemoteProtocol {
        /// Endpoint that answered.
        url: String,
        /// What was wrong with the answer.
        message: String,
    },

    /// A Python reward function could not be loaded or run, or returned no usable score.
    #[error("Python reward `{path}`: {message}")]
    Python {
        /// The function's file (or `pkg://` module).
        path: String,
        /// What went wrong, with the sample when one is to blame.
        message: String,
    },

    /// A combinator's component returned the wrong number of outputs for a batch.
    #[error("reward `{reward}` returned {got} outputs for a batch of {expected}")]
    BatchLength {
        /// The misbehaving reward.
        reward: String,
        /// Batch size sent.
        expected: usize,
        /// Outputs received.
        got: usize,
    },
}

impl RewardError {
    /// Shorthand for [`RewardError::Config`].
    pub fn config(kind: impl Into<String>, message: impl Into<String>) -> Self {
        RewardError::Config {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`RewardError::InvalidGroundTruth`].
    pub fn ground_truth(
        reward: impl Into<String>,
        data_source: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        RewardError::InvalidGroundTruth {
            reward: reward.into(),
            data_source: data_source.into(),
            message: message.into(),
        }
    }
}
