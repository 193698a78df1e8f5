//! The crate's error type. Every message names the file (and row) so a user can fix
//! their data without reading this crate's source.

use std::path::PathBuf;

/// Everything that can go wrong loading, iterating or writing datasets.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened, read, written or renamed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The file as a whole is unusable (unknown extension, not parquet, not a JSON array...).
    #[error("{}: {msg}", path.display())]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// One row is malformed and `on_bad_row` is `fail`.
    #[error(
        "{}: row {row}{}: {reason} (set data.on_bad_row = \"skip\" to skip such rows)",
        path.display(),
        line.map(|l| format!(" (line {l})")).unwrap_or_default()
    )]
    BadRow {
        /// The file involved.
        path: PathBuf,
        /// 0-based row number in the file (as pandas would index it).
        row: usize,
        /// 1-based line number, for line-oriented formats (JSONL).
        line: Option<usize>,
        /// What is wrong with the row.
        reason: String,
    },
    /// Loading finished but no row survived parsing and filtering.
    #[error("no usable prompts in {files}: {summary}")]
    Empty {
        /// The file(s) loaded.
        files: String,
        /// The load report, explaining where the rows went.
        summary: String,
    },
    /// Invalid loader/generator configuration, or a resume state that does not match.
    #[error("{0}")]
    Config(String),
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io { path: path.into(), source }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        DataError::Format { path: path.into(), msg: msg.into() }
    }
}
