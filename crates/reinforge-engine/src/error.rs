//! The engine's error type: every variant names the file or key at fault and how to fix it.

use std::path::PathBuf;

/// Errors from loading, running and training models.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is missing, malformed or asks for something unsupported.
    #[error("{path}: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A weight file is missing, corrupt, or does not fit the config.
    #[error("{path}: {msg}")]
    Weights {
        /// The weight file (or directory).
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// The requested device is not available in this build or on this machine.
    #[error("device `{requested}` is not available: {msg}")]
    Device {
        /// What the user asked for.
        requested: String,
        /// Why, and what to use instead.
        msg: String,
    },
    /// A request the engine cannot serve (prompt too long, empty batch, ...).
    #[error("{0}")]
    Request(String),
    /// A tensor computation failed (an internal invariant, reported rather than panicking).
    #[error("tensor error: {0}")]
    Tensor(String),
}

/// Result alias for the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
