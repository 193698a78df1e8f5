//! Reading and writing Hugging Face safetensors weights (single file or sharded with an index).

use crate::error::{EngineError, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One tensor decoded to f32, with its HF shape.
#[derive(Debug, Clone)]
pub struct HostTensor {
    /// Shape as stored (row-major).
    pub shape: Vec<usize>,
    /// Values widened to f32 (bf16/f16 storage is converted once, at load).
    pub data: Vec<f32>,
}

/// All tensors of a model directory, by HF name.
pub struct WeightSet {
    dir: PathBuf,
    tensors: HashMap<String, (HostTensor, PathBuf)>,
}

impl WeightSet {
    /// Loads `model.safetensors`, or every shard named in `model.safetensors.index.json`. A
    /// directory that also holds a LoRA adapter (a LoRA run's checkpoint) is refused: its
    /// weights alone are the base model, not what was trained ([`Self::load_base_dir`]).
    pub fn load_dir(dir: &Path) -> Result<Self> {
        if crate::lora::Adapter::present(dir) {
            return Err(EngineError::Weights {
                path: dir.to_path_buf(),
                msg: format!(
                    "holds a LoRA adapter ({}) beside its base weights: `reinforge export` the checkpoint for a merged model, or start from the base model with actor.lora_adapter_path set to this directory",
                    crate::lora::CONFIG_FILE
                ),
            });
        }
        Self::load_base_dir(dir)
    }

    /// [`Self::load_dir`] for a directory whose LoRA adapter the caller attaches itself.
    pub fn load_base_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|source| EngineError::Io { path: index.clone(), source })?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::Weights {
                path: index.clone(),
                msg: format!("not valid JSON: {e}"),
            })?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| EngineError::Weights {
                path: index.clone(),
                msg: "missing `weight_map` object".into(),
            })?;
            let mut shards: Vec<String> = map.values().filter_map(|s| s.as_str().map(str::to_owned)).collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(EngineError::Weights {
                path: dir.to_path_buf(),
                msg: "no model.safetensors or model.safetensors.index.json; point --model at a Hugging Face model directory \
                      (or import a GGUF with `reinforge model import`)"
                    .into(),
            });
        };
        let mut tensors = HashMap::new();
        for file in files {
            let bytes = std::fs::read(&file).map_err(|source| EngineError::Io { path: file.clone(), source })?;
            for (name, t) in decode_all(&bytes, &file)? {
                tensors.insert(name, (t, file.clone()));
            }
        }
        Ok(Self { dir: dir.to_path_buf(), tensors })
    }

    /// Every tensor by name, giving up where each came from.
    pub fn into_map(self) -> HashMap<String, HostTensor> {
        self.tensors.into_iter().map(|(k, (t, _))| (k, t)).collect()
    }

    /// Wraps tensors already in memory (random init, checkpoints); `label` names them in errors.
    pub fn from_map(label: &str, tensors: HashMap<String, HostTensor>) -> Self {
        let file = PathBuf::from(label);
        Self { dir: file.clone(), tensors: tensors.into_iter().map(|(k, v)| (k, (v, file.clone()))).collect() }
    }

    /// Removes and returns a tensor, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let (t, file) = self.tensors.remove(name).ok_or_else(|| EngineError::Weights {
            path: self.dir.clone(),
            msg: format!("missing tensor `{name}`; the weights do not match config.json"),
        })?;
        if t.shape != shape {
            return Err(EngineError::Weights {
                path: file,
                msg: format!("tensor `{name}` has shape {:?} but config.json implies {:?}", t.shape, shape),
            });
        }
        Ok(t)
    }

    /// Removes a tensor if present, checking its shape.
    pub fn take_opt(&mut self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>> {
        if self.contains(name) { self.take(name, shape).map(Some) } else { Ok(None) }
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Names not consumed yet (to warn about unexpected extras).
    pub fn remaining(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }
}

/// Every tensor of a safetensors file's bytes, widened to f32; `file` names it in errors.
pub fn decode_all(bytes: &[u8], file: &Path) -> Result<Vec<(String, HostTensor)>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| EngineError::Weights {
        path: file.to_path_buf(),
        msg: format!("corrupt safetensors file ({e}); re-download or re-export the model"),
    })?;
    st.tensors()
        .into_iter()
        // Integer tensors are buffers saved beside the weights (BERT's `position_ids`), not weights.
        .filter(|(_, view)| matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64))
        .map(|(name, view)| {
            let data = decode(view.dtype(), view.data()).map_err(|msg| EngineError::Weights { path: file.to_path_buf(), msg: format!("tensor `{name}`: {msg}") })?;
            Ok((name, HostTensor { shape: view.shape().to_vec(), data }))
        })
        .collect()
}

fn decode(dtype: Dtype, bytes: &[u8]) -> std::result::Result<Vec<f32>, String> {
    match dtype {
        Dtype::F32 => Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        Dtype::BF16 => Ok(bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()),
        Dtype::F16 => Ok(bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()),
        Dtype::F64 => Ok(bytes.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32).collect()),
        other => Err(format!("dtype {other:?} is not supported (use f32, bf16 or f16 weights)")),
    }
}

/// Writes named f32 tensors to one safetensors file, atomically (temp file, fsync, rename).
pub fn write_safetensors(path: &Path, tensors: &BTreeMap<String, HostTensor>, metadata: Option<HashMap<String, String>>) -> Result<()> {
    write_atomic(path, &safetensors_bytes(path, tensors, metadata)?)
}

/// Named f32 tensors as the bytes of a safetensors file; `path` names it in errors.
pub fn safetensors_bytes(path: &Path, tensors: &BTreeMap<String, HostTensor>, metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    use safetensors::tensor::TensorView;
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.data.iter().flat_map(|x| x.to_le_bytes()).collect(), t.shape.clone()))
        .collect();
    let views = bytes
        .iter()
        .map(|(n, b, s)| {
            TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v)).map_err(|e| EngineError::Weights {
                path: path.to_path_buf(),
                msg: format!("tensor `{n}`: {e}"),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, metadata).map_err(|e| EngineError::Weights { path: path.to_path_buf(), msg: format!("serialising: {e}") })
}

/// Writes a file through a temporary sibling, fsyncs it and renames it into place, so a
/// crash leaves either the old file or the complete new one.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let io = |source| EngineError::Io { path: tmp.clone(), source };
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(data).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|source| EngineError::Io { path: path.to_path_buf(), source })
}
