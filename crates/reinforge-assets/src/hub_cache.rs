//! Hugging Face Hub repositories already downloaded on this machine: a model or dataset named
//! by its Hub id (`Qwen/Qwen2.5-3B-Instruct`, `OpenRLHF/prompt-collection-v0.1`), as verl's and
//! OpenRLHF's command lines name them, found in the Hub cache that `huggingface-cli download`,
//! `snapshot_download`, transformers and `datasets` fill. Nothing is downloaded: Reinforge reads
//! local files only, and a repository missing from the cache is an error that says how to get
//! it.
//!
//! The cache's layout is huggingface_hub's: `<cache>/models--ORG--NAME/` (or `datasets--…`)
//! with `refs/main` holding the commit the files of `snapshots/COMMIT/` belong to.

use std::path::{Path, PathBuf};

/// Which kind of Hub repository an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoKind {
    /// A model repository (`models--…`).
    Model,
    /// A dataset repository (`datasets--…`).
    Dataset,
}

impl RepoKind {
    fn prefix(self) -> &'static str {
        match self {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        }
    }
}

/// The Hub cache directory as huggingface_hub finds it: `HF_HUB_CACHE` (or the older
/// `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// Whether `s` has the shape of a Hub id (`org/name`: one slash, no path syntax).
pub fn is_hub_id(s: &str) -> bool {
    let ok = |part: &str| !part.is_empty() && !part.starts_with(['.', '-']) && part.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    matches!(s.split_once('/'), Some((org, name)) if ok(org) && ok(name))
}

/// Where Hub repository `id` would be in `cache`, and the snapshot to read if it is there:
/// the one `refs/main` names, else the only one. `Err` says why a repository that is there
/// cannot be read (no snapshot, several and no `refs/main`).
pub fn cached_snapshot(cache: &Path, id: &str, kind: RepoKind) -> Result<Option<PathBuf>, String> {
    let repo = cache.join(format!("{}--{}", kind.prefix(), id.replace('/', "--")));
    if !repo.is_dir() {
        return Ok(None);
    }
    let snapshots = repo.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(repo.join("refs/main")) {
        let dir = snapshots.join(commit.trim());
        if dir.is_dir() {
            return Ok(Some(dir));
        }
        // Another revision's snapshot would be silently other weights or data.
        return Err(format!("{} names commit {} in refs/main, which has no snapshot here (an interrupted download?); download it again", repo.display(), commit.trim()));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(&snapshots).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect()).unwrap_or_default();
    found.sort();
    match found.len() {
        0 => Err(format!("{} holds no downloaded snapshot (an interrupted download?); download it again", repo.display())),
        1 => Ok(found.pop()),
        n => Err(format!("{} holds {n} snapshots and no refs/main to pick one; give the snapshot directory you want ({})", repo.display(), snapshots.display())),
    }
}

/// How to get Hub repository `id` into the cache, for error messages.
pub fn download_hint(id: &str, kind: RepoKind) -> String {
    let flag = if kind == RepoKind::Dataset { " --repo-type dataset" } else { "" };
    format!("download it where this machine can reach the Hub with `hf download{flag} {id}` (`huggingface-cli download` before huggingface_hub 1.0; the cache is shared through HF_HOME), or give a local directory")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(cache: &Path, repo: &str, commit: &str, main: bool) -> PathBuf {
        let dir = cache.join(repo).join("snapshots").join(commit);
        std::fs::create_dir_all(&dir).unwrap();
        if main {
            std::fs::create_dir_all(cache.join(repo).join("refs")).unwrap();
            std::fs::write(cache.join(repo).join("refs/main"), commit).unwrap();
        }
        dir
    }

    #[test]
    fn ids_and_snapshots_are_found_as_huggingface_hub_lays_them_out() {
        assert!(is_hub_id("Qwen/Qwen2.5-3B-Instruct") && is_hub_id("OpenRLHF/prompt-collection-v0.1"));
        for not in ["model", "./a/b", "/abs/path", "a/b/c", "~/x", "a/", "/b", "a/.b", "a b/c"] {
            assert!(!is_hub_id(not), "{not}");
        }
        let root = std::env::temp_dir().join(format!("reinforge-hub-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cache = root.as_path();
        assert_eq!(cached_snapshot(cache, "Qwen/Q", RepoKind::Model).unwrap(), None);
        // refs/main picks among several; a dataset of the same id is another repository.
        snapshot(cache, "models--Qwen--Q", "aaa", false);
        let main = snapshot(cache, "models--Qwen--Q", "bbb", true);
        assert_eq!(cached_snapshot(cache, "Qwen/Q", RepoKind::Model).unwrap(), Some(main));
        std::fs::write(cache.join("models--Qwen--Q/refs/main"), "ccc").unwrap();
        assert!(cached_snapshot(cache, "Qwen/Q", RepoKind::Model).unwrap_err().contains("names commit ccc in refs/main, which has no snapshot"));
        assert_eq!(cached_snapshot(cache, "Qwen/Q", RepoKind::Dataset).unwrap(), None);
        let only = snapshot(cache, "datasets--org--d", "ccc", false);
        assert_eq!(cached_snapshot(cache, "org/d", RepoKind::Dataset).unwrap(), Some(only));
        snapshot(cache, "datasets--org--d", "ddd", false);
        let e = cached_snapshot(cache, "org/d", RepoKind::Dataset).unwrap_err();
        assert!(e.contains("2 snapshots") && e.contains("no refs/main"), "{e}");
        std::fs::create_dir_all(cache.join("models--org--empty/snapshots")).unwrap();
        assert!(cached_snapshot(cache, "org/empty", RepoKind::Model).unwrap_err().contains("no downloaded snapshot"));
        assert!(download_hint("org/d", RepoKind::Dataset).contains("hf download --repo-type dataset org/d"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
