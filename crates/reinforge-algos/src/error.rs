//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong in this crate. Numerical functions never panic on bad input;
/// they return one of these instead.
#[derive(Debug, Error)]
pub enum AlgoError {
    /// Two inputs that must have the same shape do not (or a shape is otherwise invalid).
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The function that rejected its inputs.
        op: &'static str,
        /// Which shapes disagree.
        detail: String,
    },

    /// An input value or parameter is outside what the function accepts (verl's `ValueError`
    /// and `AssertionError` cases).
    #[error("{op}: {msg}")]
    InvalidInput {
        /// The function that rejected its inputs.
        op: &'static str,
        /// What is wrong and how to fix it.
        msg: String,
    },

    /// A name (estimator, aggregation mode, controller type, ...) is not one we know.
    #[error("unknown {kind} `{name}`; valid names are: {valid}")]
    UnknownName {
        /// What kind of name was expected.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The accepted names, comma separated.
        valid: String,
    },

    /// A name verl reserves but does not implement (e.g. the `full` KL estimator).
    #[error("{what} is not implemented (verl raises NotImplementedError for it too)")]
    NotImplemented {
        /// The feature that was asked for.
        what: String,
    },

    /// A burn tensor could not be read back to host memory.
    #[error("{op}: could not read tensor data: {msg}")]
    TensorRead {
        /// The function that was reading.
        op: &'static str,
        /// The backend's message.
        msg: String,
    },
}

/// Result alias used throughout the crate.
pub type Result<T, E = AlgoError> = std::result::Result<T, E>;

impl AlgoError {
    pub(crate) fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Self::Shape {
            op,
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Self::InvalidInput {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn unknown(kind: &'static str, name: &str, valid: &[&str]) -> Self {
        Self::UnknownName {
            kind,
            name: name.to_string(),
            valid: valid.join(", "),
        }
    }
}
