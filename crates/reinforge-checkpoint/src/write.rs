//! Saving: everything goes into a temporary directory in the checkpoint root, the manifest is
//! written last, and one rename makes the checkpoint appear whole. `latest` is then replaced
//! atomically, and old checkpoints and dead writers' temporaries are pruned.
//!
//! Crash analysis (what a process killed at each point leaves behind):
//! - while writing files or the manifest: only `.tmp-global_step_N-<pid>-<nanos>/`, which no
//!   reader looks at and the next save deletes once the pid is dead;
//! - after the rename, before `latest` is rewritten: a complete `global_step_N` that `latest`
//!   does not name yet. [`resolve`](crate::resolve) with `Resume::Auto` trusts `latest`, so it
//!   resumes from the previous checkpoint; the finished one is used only if `latest` is
//!   missing or broken. `latest` is the commit point of a save;
//! - while replacing an existing `global_step_N`: the old one is renamed aside (to a `.tmp-`
//!   name) before the new one is renamed in, so for a moment there is no `global_step_N`;
//!   `Resume::Auto` then falls back to the newest other complete checkpoint.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{io_err, BoxError, CheckpointError, Result};
use crate::fsutil::{
    fsync_dir, fsync_file, hash_file, hex, parse_tmp_name, tmp_is_stale, tmp_name, unix_nanos,
    validate_name, HashingWriter, TMP_PREFIX,
};
use crate::manifest::{
    step_dir_name, FileEntry, Manifest, FORMAT, LATEST_FILE, MANIFEST_FILE, VERSION,
};
use crate::read::{list_checkpoints, read_latest, Checkpoint};

/// A point in [`CheckpointWriter::commit`] where the process can be made to abort, to test
/// what a crash there leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrashPoint {
    /// After the manifest is written and synced, before the temporary directory is renamed.
    BeforeRename,
    /// When replacing an existing step: after the old directory is moved aside, before the new
    /// one is moved in.
    DuringReplace,
    /// After the rename into `global_step_N`, before `latest` is rewritten.
    BeforeLatest,
}

/// How [`save`] and [`CheckpointWriter::commit`] finish a save.
#[derive(Debug, Clone, Default)]
pub struct SaveOptions {
    /// Keep only this many complete checkpoints (highest steps), never deleting the one
    /// `latest` names; `None` keeps all. Must be at least 1.
    pub keep_last: Option<usize>,
    /// Testing only: `std::process::abort()` at this point of the commit.
    pub crash_at: Option<CrashPoint>,
    /// Run-directory ownership: checked right before each step that publishes (the rename into
    /// place, `latest`, pruning), so a process that lost its run directory changes nothing there.
    pub fence: Option<reinforge_lease::Fence>,
}

impl SaveOptions {
    /// Options that keep the last `k` checkpoints.
    pub fn keep_last(k: usize) -> Self {
        SaveOptions { keep_last: Some(k), ..SaveOptions::default() }
    }

    fn validate(&self) -> Result<()> {
        if self.keep_last == Some(0) {
            return Err(CheckpointError::InvalidOptions(
                "keep_last is 0, which would delete the checkpoint just saved (use 1 or more, or None to keep all)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Fails if this process no longer owns the run directory.
    fn check_fence(&self) -> Result<()> {
        Ok(self.fence.as_ref().map_or(Ok(()), reinforge_lease::Fence::check)?)
    }

    fn maybe_crash(&self, point: CrashPoint) {
        if self.crash_at == Some(point) {
            tracing::error!(?point, "checkpoint crash point reached: aborting as requested");
            std::process::abort();
        }
    }
}

/// Builds one checkpoint in a temporary directory; [`commit`](Self::commit) makes it visible.
/// Dropping it without committing deletes the temporary directory.
#[derive(Debug)]
pub struct CheckpointWriter {
    root: PathBuf,
    step: u64,
    tmp: PathBuf,
    /// Size and hash of files whose bytes passed through this writer, so commit need not re-read them.
    written: BTreeMap<String, (u64, String)>,
    meta: serde_json::Value,
    committed: bool,
}

impl CheckpointWriter {
    /// Starts a checkpoint for `step` under `root` (created if missing).
    pub fn begin(root: impl AsRef<Path>, step: u64) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        fs::create_dir_all(&root).map_err(io_err("create directory", &root))?;
        let tmp = root.join(tmp_name(&step_dir_name(step)));
        fs::create_dir(&tmp).map_err(io_err("create directory", &tmp))?;
        Ok(CheckpointWriter {
            root,
            step,
            tmp,
            written: BTreeMap::new(),
            meta: serde_json::Value::Object(Default::default()),
            committed: false,
        })
    }

    /// The step this checkpoint is for.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The temporary directory files are written into.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp
    }

    /// Sets the manifest's free-form `meta` JSON.
    pub fn set_meta(&mut self, meta: serde_json::Value) {
        self.meta = meta;
    }

    /// Checks `name`, refuses duplicates and creates its parent directories; returns its path.
    fn prepare(&mut self, name: &str) -> Result<PathBuf> {
        validate_name(name)?;
        let path = self.tmp.join(name);
        if self.written.contains_key(name) || path.symlink_metadata().is_ok() {
            return Err(CheckpointError::BadName {
                name: name.to_string(),
                reason: "it was already written into this checkpoint",
            });
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        }
        Ok(path)
    }

    /// Writes `bytes` as file `name` and fsyncs it.
    pub fn add_bytes(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.prepare(name)?;
        let mut f = File::create(&path).map_err(io_err("create", &path))?;
        f.write_all(bytes).map_err(io_err("write", &path))?;
        f.sync_all().map_err(io_err("fsync", &path))?;
        self.written.insert(name.to_string(), (bytes.len() as u64, hex(&Sha256::digest(bytes))));
        Ok(())
    }

    /// Creates file `name` and lets `f` stream into it (hashed on the way, then fsynced).
    pub fn add_streamed<F, E>(&mut self, name: &str, f: F) -> Result<()>
    where
        F: FnOnce(&mut dyn Write) -> std::result::Result<(), E>,
        E: Into<BoxError>,
    {
        let path = self.prepare(name)?;
        let file = File::create(&path).map_err(io_err("create", &path))?;
        let mut w = BufWriter::with_capacity(1 << 20, HashingWriter { inner: file, hasher: Sha256::new(), size: 0 });
        f(&mut w).map_err(|e| self.write_err(name, e))?;
        let hw = w.into_inner().map_err(|e| io_err("write", &path)(e.into_error()))?;
        hw.inner.sync_all().map_err(io_err("fsync", &path))?;
        self.written.insert(name.to_string(), (hw.size, hex(&hw.hasher.finalize())));
        Ok(())
    }

    /// Lets `f` write file `name` itself, given its path (for libraries that write to a path,
    /// such as `safetensors::serialize_to_file`); the file is then hashed and fsynced.
    pub fn add_file_with<F, E>(&mut self, name: &str, f: F) -> Result<()>
    where
        F: FnOnce(&Path) -> std::result::Result<(), E>,
        E: Into<BoxError>,
    {
        let path = self.prepare(name)?;
        f(&path).map_err(|e| self.write_err(name, e))?;
        match path.symlink_metadata() {
            Ok(md) if md.is_file() => {}
            _ => {
                return Err(self.write_err(name, "the callback returned Ok but did not create a regular file at the given path"));
            }
        }
        fsync_file(&path)?;
        let (size, sha) = hash_file(&path)?;
        self.written.insert(name.to_string(), (size, sha));
        Ok(())
    }

    fn write_err(&self, name: &str, e: impl Into<BoxError>) -> CheckpointError {
        CheckpointError::Write { step: self.step, name: name.to_string(), source: e.into() }
    }

    /// Lists every regular file under the temporary directory and fsyncs every subdirectory.
    /// Files a callback made beside the one it was asked for are included (hashed here).
    fn collect_files(&self) -> Result<Vec<FileEntry>> {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        let mut stack = vec![(self.tmp.clone(), String::new())];
        while let Some((dir, prefix)) = stack.pop() {
            for entry in fs::read_dir(&dir).map_err(io_err("list directory", &dir))? {
                let entry = entry.map_err(io_err("list directory", &dir))?;
                let path = entry.path();
                let Some(fname) = entry.file_name().to_str().map(str::to_string) else {
                    return Err(CheckpointError::BadName {
                        name: path.display().to_string(),
                        reason: "it is not valid UTF-8",
                    });
                };
                let rel = if prefix.is_empty() { fname } else { format!("{prefix}/{fname}") };
                let ft = entry.file_type().map_err(io_err("stat", &path))?;
                if ft.is_dir() {
                    stack.push((path.clone(), rel));
                    dirs.push(path);
                } else if ft.is_file() {
                    validate_name(&rel)?;
                    let (size, sha256) = match self.written.get(&rel) {
                        Some((size, sha)) => (*size, sha.clone()),
                        None => {
                            fsync_file(&path)?;
                            hash_file(&path)?
                        }
                    };
                    files.push(FileEntry { path: rel, size, sha256 });
                } else {
                    return Err(CheckpointError::BadName {
                        name: rel,
                        reason: "it is a symlink or special file; checkpoints hold regular files only",
                    });
                }
            }
        }
        // Deepest first, so each directory's entry is durable in its parent after its own contents.
        for dir in dirs.iter().rev() {
            fsync_dir(dir)?;
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Finishes the save: manifest, rename into `global_step_N`, `latest`, pruning.
    pub fn commit(mut self, opts: &SaveOptions) -> Result<Checkpoint> {
        opts.validate()?;
        let files = self.collect_files()?;
        let manifest = Manifest {
            format: FORMAT.to_string(),
            version: VERSION,
            step: self.step,
            files,
            created_unix: (unix_nanos() / 1_000_000_000) as u64,
            meta: std::mem::take(&mut self.meta),
        };
        let manifest_path = self.tmp.join(MANIFEST_FILE);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::BadManifest {
            dir: self.tmp.clone(),
            reason: format!("cannot serialize: {e}"),
        })?;
        {
            let mut f = File::create(&manifest_path).map_err(io_err("create", &manifest_path))?;
            f.write_all(&json).map_err(io_err("write", &manifest_path))?;
            f.sync_all().map_err(io_err("fsync", &manifest_path))?;
        }
        fsync_dir(&self.tmp)?;
        opts.maybe_crash(CrashPoint::BeforeRename);

        let name = step_dir_name(self.step);
        let dest = self.root.join(&name);
        opts.check_fence()?;
        match dest.symlink_metadata() {
            Ok(md) if md.is_dir() => self.replace_existing(&dest, &name, opts)?,
            Ok(_) => {
                return Err(CheckpointError::NotACheckpoint {
                    path: dest,
                    reason: "it exists and is not a directory (move it away so the checkpoint can be saved)".into(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::rename(&self.tmp, &dest).map_err(io_err("rename into place", &dest))?;
                self.committed = true;
            }
            Err(e) => return Err(io_err("stat", &dest)(e)),
        }
        fsync_dir(&self.root)?;
        opts.maybe_crash(CrashPoint::BeforeLatest);

        write_latest_checked(&self.root, &name, || opts.check_fence())?;
        tracing::info!(step = self.step, dir = %dest.display(), "checkpoint saved");
        prune_checked(&self.root, opts.keep_last, || opts.check_fence());
        Ok(Checkpoint { dir: dest, step: self.step, manifest })
    }

    /// Replaces an existing `global_step_N`: old aside, new in, old deleted.
    fn replace_existing(&mut self, dest: &Path, name: &str, opts: &SaveOptions) -> Result<()> {
        let aside = self.root.join(tmp_name(&format!("replaced-{name}")));
        fs::rename(dest, &aside).map_err(io_err("move old checkpoint aside", dest))?;
        opts.maybe_crash(CrashPoint::DuringReplace);
        if let Err(e) = fs::rename(&self.tmp, dest) {
            // Put the old checkpoint back so that a failed save loses nothing.
            if let Err(e2) = fs::rename(&aside, dest) {
                tracing::error!(old = %aside.display(), error = %e2, "could not restore the replaced checkpoint");
            }
            return Err(io_err("rename into place", dest)(e));
        }
        self.committed = true;
        fsync_dir(&self.root)?;
        if let Err(e) = fs::remove_dir_all(&aside) {
            tracing::warn!(dir = %aside.display(), error = %e, "could not delete the replaced checkpoint; a later save retries");
        }
        tracing::info!(step = self.step, "replaced an existing checkpoint of the same step");
        Ok(())
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: an abandoned save must not leave gigabytes behind. A failure here is
            // harmless, the next save's pruning removes it once this process is gone.
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Saves checkpoint `step` under `root`: `fill` adds the files, then the save is committed
/// (manifest, rename, `latest`, pruning).
pub fn save<F, E>(
    root: impl AsRef<Path>,
    step: u64,
    meta: serde_json::Value,
    opts: &SaveOptions,
    fill: F,
) -> Result<Checkpoint>
where
    F: FnOnce(&mut CheckpointWriter) -> std::result::Result<(), E>,
    E: Into<BoxError>,
{
    opts.validate()?;
    let mut w = CheckpointWriter::begin(root, step)?;
    w.set_meta(meta);
    if let Err(e) = fill(&mut w) {
        let boxed: BoxError = e.into();
        // Our own errors pass through unchanged instead of being wrapped in `Caller`.
        return Err(match boxed.downcast::<CheckpointError>() {
            Ok(ours) => *ours,
            Err(other) => CheckpointError::Caller { step, source: other },
        });
    }
    w.commit(opts)
}

/// Atomically points `<root>/latest` at `name`: temporary file, fsync, rename, fsync root.
pub fn write_latest(root: &Path, name: &str) -> Result<()> {
    write_latest_checked(root, name, || Ok(()))
}

/// [`write_latest`], with `check` (the fence) between the synced temporary and the rename:
/// a writer paused while syncing (the slow part) must not publish once it has lost the run.
fn write_latest_checked(root: &Path, name: &str, check: impl FnOnce() -> Result<()>) -> Result<()> {
    let tmp = root.join(tmp_name("latest"));
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(format!("{name}\n").as_bytes()).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        check()?;
        let latest = root.join(LATEST_FILE);
        fs::rename(&tmp, &latest).map_err(io_err("rename into place", &latest))?;
        fsync_dir(root)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Deletes dead writers' temporaries and, with `keep_last`, old checkpoints. Failures are
/// logged, not returned: the save itself has already succeeded.
pub fn prune(root: &Path, keep_last: Option<usize>) {
    prune_checked(root, keep_last, || Ok(()))
}

/// [`prune`], asking `check` (the fence) before each deletion rather than once: deleting a
/// checkpoint takes long, and a process paused meanwhile must not delete the next one from a
/// listing taken before another run took the directory.
fn prune_checked(root: &Path, keep_last: Option<usize>, check: impl Fn() -> Result<()>) {
    if check().is_err() {
        return;
    }
    remove_stale_tmps(root);
    let Some(keep) = keep_last else { return };
    let latest = match read_latest(root) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "not pruning checkpoints: `latest` is unreadable");
            return;
        }
    };
    let complete = match list_checkpoints(root) {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, "not pruning checkpoints");
            return;
        }
    };
    let complete: Vec<_> = complete.into_iter().filter(|(_, dir)| dir.join(MANIFEST_FILE).is_file()).collect();
    let excess = complete.len().saturating_sub(keep);
    for (step, dir) in &complete[..excess] {
        if latest.as_deref() == Some(step_dir_name(*step).as_str()) {
            continue;
        }
        // Rename first so that a crash mid-delete leaves a `.tmp-` entry, not a checkpoint
        // directory with a manifest and half its files.
        let doomed = root.join(tmp_name(&format!("pruned-{}", step_dir_name(*step))));
        if let Err(e) = check() {
            tracing::warn!(error = %e, "stopped pruning checkpoints");
            return;
        }
        let removed = fs::rename(dir, &doomed).and_then(|_| fs::remove_dir_all(&doomed));
        match removed {
            Ok(()) => tracing::info!(step, "pruned old checkpoint"),
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "could not prune old checkpoint"),
        }
    }
}

/// Removes `.tmp-*` entries whose writer process is gone.
fn remove_stale_tmps(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(TMP_PREFIX) {
            continue;
        }
        let Some((pid, nanos)) = parse_tmp_name(name) else { continue };
        if !tmp_is_stale(pid, nanos) {
            continue;
        }
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(ft) if ft.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
        match removed {
            Ok(()) => tracing::info!(path = %path.display(), pid, "removed a dead writer's temporary"),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not remove a stale temporary"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Pruning asks before each deletion: once ownership is gone, the checkpoints not yet
    /// deleted stay, though they were listed as excess before.
    #[test]
    fn pruning_stops_at_the_first_failed_check() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for step in 1..=4 {
            save(root, step, serde_json::json!({}), &SaveOptions::default(), |w| w.add_bytes("w.bin", &[step as u8])).unwrap();
        }
        // Allowed: the check before starting and the one before deleting step 1.
        let asked = Cell::new(0);
        let check = || {
            asked.set(asked.get() + 1);
            if asked.get() <= 2 {
                Ok(())
            } else {
                Err(CheckpointError::InvalidOptions("lost the run directory".into()))
            }
        };
        prune_checked(root, Some(1), check);
        let left: Vec<u64> = crate::read::list_checkpoints(root).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(left, [2, 3, 4], "only step 1 deleted before the check failed");
        assert_eq!(asked.get(), 3);
        prune_checked(root, Some(1), || Ok(()));
        let left: Vec<u64> = crate::read::list_checkpoints(root).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(left, [4]);
    }
}
