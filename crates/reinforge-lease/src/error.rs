//! The crate's error: one line saying what, where and how to fix.

use crate::identity::{fmt_age, Identity};
use std::path::PathBuf;

/// Everything that can go wrong taking or keeping a run directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// Another live run owns the directory.
    #[error(
        "run directory {} is in use by another run: {} (lease generation {generation}, last heartbeat {} ago); use another trainer.default_local_dir, or stop that run ({}); a lease without a heartbeat for {}s is taken over automatically, and --takeover takes it now",
        run_dir.display(), holder.describe(), fmt_age(*heartbeat_age_s), holder.stop_hint(), timeout_s.round()
    )]
    Held {
        /// The run directory.
        run_dir: PathBuf,
        /// Who holds it.
        holder: Box<Identity>,
        /// The holder's generation.
        generation: u64,
        /// Seconds since its last heartbeat (by this machine's clock).
        heartbeat_age_s: f64,
        /// The holder's staleness timeout.
        timeout_s: f64,
    },

    /// This process owned the directory and another took it over: it must not write there again.
    #[error(
        "lost ownership of run directory {}: lease generation {generation} belongs to {} ({why}); this run stops without writing anything more there",
        run_dir.display(), by.as_ref().map_or_else(|| "another run".to_string(), |h| h.describe()),
    )]
    Lost {
        /// The run directory.
        run_dir: PathBuf,
        /// The new owner, when its lease file could be read.
        by: Option<Box<Identity>>,
        /// The new owner's generation.
        generation: u64,
        /// What happened to this process's lease.
        why: String,
    },

    /// Others keep taking the lease while this process tries.
    #[error("run directory {}: the lease changed hands {attempts} times while this run tried to take it; another process is starting runs there in a loop (stop it, or use another trainer.default_local_dir)", run_dir.display())]
    Contended {
        /// The run directory.
        run_dir: PathBuf,
        /// How many times this process tried.
        attempts: usize,
    },

    /// A filesystem operation failed.
    #[error("{op} {}: {source} (check that the run directory is writable and the disk is not full)", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Maps an `io::Error` into [`LeaseError::Io`] with the operation and path.
pub(crate) fn io_err(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> LeaseError {
    let path = path.to_path_buf();
    move |source| LeaseError::Io { op, path, source }
}
