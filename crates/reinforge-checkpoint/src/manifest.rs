//! `manifest.json`: the list of a checkpoint's files with sizes and hashes. It is written
//! last, so its presence is what makes a checkpoint directory complete.

use serde::{Deserialize, Serialize};

/// Value of the manifest's `format` field.
pub const FORMAT: &str = "reinforge-checkpoint";
/// Manifest version this build writes and reads.
pub const VERSION: u32 = 1;
/// Name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the pointer file in the checkpoint root that names the newest checkpoint.
pub const LATEST_FILE: &str = "latest";
/// Prefix of checkpoint directory names (`global_step_N`, as in verl).
pub const STEP_DIR_PREFIX: &str = "global_step_";

/// Contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`] for manifests this build writes.
    pub version: u32,
    /// Training step the checkpoint was taken at.
    pub step: u64,
    /// Every file of the checkpoint except the manifest itself, sorted by path.
    pub files: Vec<FileEntry>,
    /// Seconds since the Unix epoch when the checkpoint was committed.
    pub created_unix: u64,
    /// Free-form JSON supplied by the caller (config hash, trainer version, ...).
    #[serde(default)]
    pub meta: serde_json::Value,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the checkpoint directory, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lower-case hex SHA-256 of the contents.
    pub sha256: String,
}

impl Manifest {
    /// The entry for `path`, if the checkpoint holds that file.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Sum of the sizes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// `global_step_N` for step `N`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_DIR_PREFIX}{step}")
}

/// `Some(N)` when `name` is exactly `global_step_N` (canonical decimal, no leading zeros).
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_DIR_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: u64 = digits.parse().ok()?;
    // Refuse `global_step_007`: two spellings of one step would make two directories.
    (step.to_string() == digits).then_some(step)
}
