//! Loading: deciding which checkpoint to resume from and verifying it against its manifest.

use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{io_err, CheckpointError, Result};
use crate::fsutil::{hash_file, validate_name};
use crate::manifest::{
    parse_step_dir_name, Manifest, FORMAT, LATEST_FILE, MANIFEST_FILE, VERSION,
};

/// Where to resume from (verl's `resume_mode`: `auto`, `resume_path`, `disable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The checkpoint `latest` names, or the newest complete one if `latest` is missing or broken.
    Auto,
    /// This checkpoint directory, which must be complete (relative paths may be relative to the root).
    Path(PathBuf),
    /// Start from scratch.
    None,
}

impl FromStr for Resume {
    type Err = std::convert::Infallible;

    /// `auto`; `none` or `disable`; anything else is a path.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "auto" => Resume::Auto,
            "none" | "disable" => Resume::None,
            path => Resume::Path(PathBuf::from(path)),
        })
    }
}

/// How thoroughly a checkpoint is verified when loaded.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Re-hash every file and compare with the manifest (sizes are always checked). On by
    /// default; turn off to skip reading multi-gigabyte files twice.
    pub verify_hashes: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { verify_hashes: true }
    }
}

/// A complete, verified checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Its directory (`<root>/global_step_N`).
    pub dir: PathBuf,
    /// The step it was taken at.
    pub step: u64,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Checkpoint {
    /// Whether the checkpoint holds file `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.manifest.file(name).is_some()
    }

    /// Path of file `name`, which must be listed in the manifest.
    pub fn path(&self, name: &str) -> Result<PathBuf> {
        if self.contains(name) {
            Ok(self.dir.join(name))
        } else {
            let available: Vec<&str> = self.manifest.files.iter().map(|f| f.path.as_str()).collect();
            Err(CheckpointError::NotInCheckpoint {
                dir: self.dir.clone(),
                name: name.to_string(),
                available: available.join(", "),
            })
        }
    }

    /// Contents of file `name`.
    pub fn read(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        fs::read(&path).map_err(io_err("read", &path))
    }

    /// The caller's free-form `meta` JSON from the manifest.
    pub fn meta(&self) -> &serde_json::Value {
        &self.manifest.meta
    }
}

/// Opens and verifies the checkpoint in `dir`: the manifest parses, and every file it lists
/// exists with the right size (and hash, with `verify_hashes`).
pub fn open(dir: impl AsRef<Path>, opts: &LoadOptions) -> Result<Checkpoint> {
    let dir = dir.as_ref().to_path_buf();
    let not_ckpt = |reason: &str| CheckpointError::NotACheckpoint { path: dir.clone(), reason: reason.to_string() };
    match dir.metadata() {
        Ok(md) if md.is_dir() => {}
        Ok(_) => return Err(not_ckpt("it is a file")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_ckpt("it does not exist")),
        Err(e) => return Err(io_err("stat", &dir)(e)),
    }
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match fs::read_to_string(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.join(LATEST_FILE).is_file() {
                return Err(not_ckpt(
                    "it has a `latest` file, so it looks like a checkpoint root (resume with `auto` from it, or pass one of its global_step_N directories)",
                ));
            }
            return Err(CheckpointError::Incomplete { dir });
        }
        Err(e) => return Err(io_err("read", &manifest_path)(e)),
    };
    let bad = |reason: String| CheckpointError::BadManifest { dir: dir.clone(), reason };
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if manifest.format != FORMAT {
        return Err(bad(format!("format is {:?}, expected {FORMAT:?}", manifest.format)));
    }
    if manifest.version != VERSION {
        return Err(bad(format!(
            "version {} is not supported, this build reads version {VERSION} (use the Reinforge version that wrote it)",
            manifest.version
        )));
    }
    let dir_step = dir.file_name().and_then(|n| n.to_str()).and_then(parse_step_dir_name);
    if let Some(dir_step) = dir_step {
        if dir_step != manifest.step {
            return Err(bad(format!("the directory name says step {dir_step} but the manifest says {}", manifest.step)));
        }
    }
    for entry in &manifest.files {
        validate_name(&entry.path).map_err(|e| bad(e.to_string()))?;
        let path = dir.join(&entry.path);
        let md = match path.metadata() {
            Ok(md) if md.is_file() => md,
            Ok(_) => return Err(CheckpointError::MissingFile { dir, file: entry.path.clone() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CheckpointError::MissingFile { dir, file: entry.path.clone() })
            }
            Err(e) => return Err(io_err("stat", &path)(e)),
        };
        if md.len() != entry.size {
            return Err(CheckpointError::SizeMismatch {
                dir,
                file: entry.path.clone(),
                expected: entry.size,
                actual: md.len(),
            });
        }
        if opts.verify_hashes {
            let (_, sha) = hash_file(&path)?;
            if !sha.eq_ignore_ascii_case(&entry.sha256) {
                return Err(CheckpointError::HashMismatch {
                    dir,
                    file: entry.path.clone(),
                    expected: entry.sha256.clone(),
                    actual: sha,
                });
            }
        }
    }
    Ok(Checkpoint { step: manifest.step, dir, manifest })
}

/// The checkpoint name `<root>/latest` holds (`global_step_N`), `None` if there is no such file.
pub fn read_latest(root: impl AsRef<Path>) -> Result<Option<String>> {
    let path = root.as_ref().join(LATEST_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(CheckpointError::BadLatest { path, content: "<not UTF-8>".into() })
        }
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let name = text.trim();
    if parse_step_dir_name(name).is_none() {
        return Err(CheckpointError::BadLatest { path, content: name.chars().take(64).collect() });
    }
    Ok(Some(name.to_string()))
}

/// Every `global_step_N` directory under `root`, complete or not, sorted by step (ascending).
/// Does not verify them; a missing root gives an empty list.
pub fn list_checkpoints(root: impl AsRef<Path>) -> Result<Vec<(u64, PathBuf)>> {
    let root = root.as_ref();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list directory", root)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("list directory", root))?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step_dir_name) else { continue };
        if entry.path().is_dir() {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Resolves `resume` under `root` with default [`LoadOptions`] (hashes verified).
pub fn resolve(root: impl AsRef<Path>, resume: &Resume) -> Result<Option<Checkpoint>> {
    resolve_with(root, resume, &LoadOptions::default())
}

/// Resolves `resume` under `root`: `Ok(None)` means start from scratch.
///
/// `Auto` trusts `latest`; if it is missing, unreadable or names a checkpoint that fails
/// verification, it warns and takes the newest `global_step_N` that verifies. With no
/// checkpoint directories at all it returns `Ok(None)`; with some but none usable, an error
/// (silently restarting from step 0 would overwrite a run's history).
pub fn resolve_with(root: impl AsRef<Path>, resume: &Resume, opts: &LoadOptions) -> Result<Option<Checkpoint>> {
    let root = root.as_ref();
    match resume {
        Resume::None => Ok(None),
        Resume::Path(p) => {
            let p = if p.is_relative() && !p.exists() { root.join(p) } else { p.clone() };
            open(p, opts).map(Some)
        }
        Resume::Auto => resolve_auto(root, opts),
    }
}

fn resolve_auto(root: &Path, opts: &LoadOptions) -> Result<Option<Checkpoint>> {
    let mut tried: Option<String> = None;
    let mut problems: Vec<String> = Vec::new();
    match read_latest(root) {
        Ok(Some(name)) => match open(root.join(&name), opts) {
            Ok(ckpt) => return Ok(Some(ckpt)),
            Err(e) => {
                tracing::warn!(error = %e, "`latest` names {name}, which is unusable; falling back to the newest complete checkpoint");
                problems.push(e.to_string());
                tried = Some(name);
            }
        },
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "falling back to the newest complete checkpoint");
        }
    }
    let candidates = list_checkpoints(root)?;
    if candidates.is_empty() {
        if tried.is_some() {
            tracing::warn!(root = %root.display(), "`latest` names a checkpoint that does not exist and there are no others; starting from scratch");
        }
        return Ok(None);
    }
    for (step, dir) in candidates.iter().rev() {
        if tried.as_deref() == dir.file_name().and_then(|n| n.to_str()) {
            continue;
        }
        match open(dir, opts) {
            Ok(ckpt) => {
                tracing::warn!(step, dir = %dir.display(), "resuming from the newest complete checkpoint found by scanning (`latest` was missing or unusable)");
                return Ok(Some(ckpt));
            }
            Err(e) => {
                tracing::warn!(error = %e, "skipping unusable checkpoint");
                problems.push(e.to_string());
            }
        }
    }
    Err(CheckpointError::NoUsableCheckpoint { root: root.to_path_buf(), reason: problems.join("; ") })
}
