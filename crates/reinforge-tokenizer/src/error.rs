//! The crate's error type: every variant renders as one actionable line.

use std::path::PathBuf;

/// Everything that can go wrong loading a tokenizer or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required file is absent.
    #[error("{what} not found: {path} does not exist")]
    Missing {
        /// What the file was for, e.g. "tokenizer".
        what: &'static str,
        /// The path that was looked up.
        path: PathBuf,
    },
    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file is malformed or has the wrong shape.
    #[error("invalid JSON in {path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde's (or our shape check's) message, with line and column.
        message: String,
    },
    /// The model directory has no chat template anywhere we look.
    #[error(
        "no chat template in {dir}: expected \"chat_template\" in tokenizer_config.json, \
         chat_template.jinja or chat_template.json; pass a template file explicitly \
         (ChatTokenizer::load_from_dir_with_template)"
    )]
    NoChatTemplate {
        /// The model directory searched.
        dir: PathBuf,
    },
    /// A named template (e.g. "tool_use") was requested but does not exist.
    #[error("no chat template named {name:?} (available: {available})")]
    UnknownTemplate {
        /// The requested name.
        name: String,
        /// Comma-separated names that do exist.
        available: String,
    },
    /// The template failed to parse or to render.
    #[error("chat template error: {0}")]
    Template(String),
    /// The template itself called `raise_exception(msg)`.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// The underlying `tokenizers` library failed (bad tokenizer.json, encode/decode error).
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    /// The caller's request is inconsistent (e.g. continuing a message that is not in the output).
    #[error("invalid chat request: {0}")]
    Request(String),
}

/// Shorthand result type.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
