//! The crate's error type: one line saying what, where and how to fix.

use std::path::PathBuf;

/// Result with [`MetricsError`] as the default error.
pub type Result<T, E = MetricsError> = std::result::Result<T, E>;

/// Everything that can go wrong writing a run's metrics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A filesystem operation failed.
    #[error("{op} {}: {source} (check that the run directory exists, is writable and the disk is not full)", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// This process no longer owns the run directory (another run took it over).
    #[error(transparent)]
    Fenced(#[from] reinforge_lease::LeaseError),

    /// A metric used a name that the JSONL record reserves for itself.
    #[error("metric name {name:?} is reserved in metrics.jsonl (rename the metric, e.g. to `train/{name}`)")]
    ReservedName {
        /// The offending name.
        name: String,
    },
}

/// Maps an `io::Error` into [`MetricsError::Io`] with the operation and path.
pub(crate) fn io_err(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> MetricsError {
    let path = path.to_path_buf();
    move |source| MetricsError::Io { op, path, source }
}
