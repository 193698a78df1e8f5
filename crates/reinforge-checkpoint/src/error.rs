//! The one error type of this crate: every message is one line saying what went wrong,
//! where, and how to fix it, so that a trainer can print it as is.

use std::path::PathBuf;

/// Result with [`CheckpointError`] as the default error.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// An error from a caller-supplied writer (boxed so that any error type, `anyhow` included, fits).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong saving, resolving or reading a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// This process no longer owns the run directory (another run took it over).
    #[error(transparent)]
    Fenced(#[from] reinforge_lease::LeaseError),

    /// A filesystem operation failed.
    #[error("{op} {}: {source} (check that the path exists, is writable and the disk is not full)", path.display())]
    Io {
        /// What was being done (`"create directory"`, `"fsync"`, ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The directory has no `manifest.json`: its save was interrupted before it finished.
    #[error("checkpoint {} is incomplete: it has no manifest.json, so its save was interrupted before it finished (resume from another checkpoint, or delete this directory)", dir.display())]
    Incomplete {
        /// The checkpoint directory.
        dir: PathBuf,
    },

    /// `manifest.json` exists but cannot be used.
    #[error("checkpoint {}: manifest.json is invalid: {reason} (it was truncated or edited by hand; resume from another checkpoint or delete this one)", dir.display())]
    BadManifest {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A file listed in the manifest is not there.
    #[error("checkpoint {}: file `{file}` listed in manifest.json is missing (it was deleted after the save; restore it or resume from another checkpoint)", dir.display())]
    MissingFile {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The file's name inside the checkpoint.
        file: String,
    },

    /// A file has another size than the manifest records.
    #[error("checkpoint {}: file `{file}` is {actual} bytes but manifest.json says {expected} (it was truncated or overwritten after the save; resume from another checkpoint)", dir.display())]
    SizeMismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The file's name inside the checkpoint.
        file: String,
        /// Size in the manifest.
        expected: u64,
        /// Size on disk.
        actual: u64,
    },

    /// A file's SHA-256 differs from the manifest's.
    #[error("checkpoint {}: file `{file}` has sha256 {actual} but manifest.json says {expected} (its contents are corrupt; resume from another checkpoint)", dir.display())]
    HashMismatch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The file's name inside the checkpoint.
        file: String,
        /// Hash in the manifest.
        expected: String,
        /// Hash of the file on disk.
        actual: String,
    },

    /// A file name given to the writer (or found in a manifest) is not a safe relative path.
    #[error("invalid checkpoint file name {name:?}: {reason} (use a relative path such as `actor/model.safetensors`)")]
    BadName {
        /// The offending name.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// [`Checkpoint::path`](crate::Checkpoint::path) was asked for a file the checkpoint does not hold.
    #[error("checkpoint {} has no file `{name}` (its manifest lists: {available})", dir.display())]
    NotInCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The name asked for.
        name: String,
        /// The names it does hold, comma-separated.
        available: String,
    },

    /// A path given as a checkpoint is not one.
    #[error("{} is not a checkpoint directory: {reason}", path.display())]
    NotACheckpoint {
        /// The path given.
        path: PathBuf,
        /// What it is instead, and what to pass.
        reason: String,
    },

    /// The `latest` pointer file holds something other than `global_step_N`.
    #[error("{} holds {content:?}, not `global_step_N` (it was edited or corrupted; make it name an existing checkpoint, or delete it)", path.display())]
    BadLatest {
        /// Path of the `latest` file.
        path: PathBuf,
        /// Its content (cut to 64 characters).
        content: String,
    },

    /// Resume was automatic, checkpoints exist, and none of them verifies.
    #[error("no usable checkpoint under {}: {reason} (delete the broken checkpoints, or start without resuming)", root.display())]
    NoUsableCheckpoint {
        /// The checkpoint root.
        root: PathBuf,
        /// What is wrong with each candidate, newest first.
        reason: String,
    },

    /// A caller-supplied writer failed while producing one file.
    #[error("writing `{name}` into checkpoint step {step} failed: {source}")]
    Write {
        /// The step being saved.
        step: u64,
        /// The file being written.
        name: String,
        /// The caller's error.
        #[source]
        source: BoxError,
    },

    /// The caller's closure given to [`save`](crate::save) failed.
    #[error("saving checkpoint step {step} failed in the caller: {source}")]
    Caller {
        /// The step being saved.
        step: u64,
        /// The caller's error.
        #[source]
        source: BoxError,
    },

    /// A [`SaveOptions`](crate::SaveOptions) value makes no sense.
    #[error("invalid checkpoint options: {0}")]
    InvalidOptions(String),
}

/// Maps an `io::Error` into [`CheckpointError::Io`] with the operation and path.
pub(crate) fn io_err(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |source| CheckpointError::Io { op, path, source }
}
