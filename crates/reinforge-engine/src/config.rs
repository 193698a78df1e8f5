//! Model configuration read from a Hugging Face `config.json`.

use crate::error::{EngineError, Result};
use serde::Deserialize;
use std::path::Path;

/// The architectures the transformer covers; they differ only in where biases sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral-style dense models (`model_type = "llama"`).
    Llama,
    /// Qwen2 / Qwen2.5 (`model_type = "qwen2"`): q/k/v biases, no o_proj bias.
    Qwen2,
}

impl Arch {
    /// The HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
    /// The HF `architectures` entry.
    pub fn hf_class(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
        }
    }
}

/// A decoder-only transformer's shape and numerics.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    /// Which architecture family.
    pub arch: Arch,
    /// Rows of the embedding matrix.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than query heads).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Longest sequence the model was trained for.
    pub max_position_embeddings: usize,
    /// Whether the LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Bias on the MLP projections (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Beginning-of-sequence id, if the model has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (HF allows a list).
    pub eos_token_ids: Vec<u32>,
    /// Padding id, if declared.
    pub pad_token_id: Option<u32>,
}

/// The raw HF fields we read; everything else in `config.json` is ignored, as transformers does.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    pad_token_id: Option<serde_json::Value>,
}

fn ids(v: &Option<serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// Multiply-adds of the decoder layers' forward over `rows` rows of `width` slots: the
    /// linears per slot, attention per (query, key) pair — every pair, as the CPU engine scores
    /// the whole square under its mask. For choosing between layouts of the same tokens.
    pub fn layer_macs(&self, rows: usize, width: usize) -> f64 {
        let (h, q, kv) = (self.hidden_size as f64, (self.num_heads * self.head_dim) as f64, (self.num_kv_heads * self.head_dim) as f64);
        let per_slot = h * (q + 2.0 * kv) + q * h + 3.0 * h * self.intermediate_size as f64;
        let per_pair = 2.0 * q;
        let (rows, width) = (rows as f64, width as f64);
        self.num_layers as f64 * rows * (width * per_slot + width * width * per_pair)
    }

    /// Reads and validates `config.json` from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io { path: path.clone(), source })?;
        Self::from_json_str(&text, &path)
    }

    /// Parses a `config.json` body; `path` is only used in error messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let err = |msg: String| EngineError::Config { path: path.to_path_buf(), msg };
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| err(format!("not a valid HF config.json: {e}")))?;
        let model_type = raw.model_type.clone().unwrap_or_default();
        let arch = match model_type.as_str() {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => {
                return Err(err(format!(
                    "model_type `{other}` is not supported; supported: llama (incl. SmolLM2, Mistral-style), qwen2 (Qwen2/Qwen2.5)"
                )))
            }
        };
        if let Some(rs) = &raw.rope_scaling {
            if !rs.is_null() {
                return Err(err(format!(
                    "rope_scaling = {rs} is not supported (only null); use a model without RoPE scaling or remove the key if the context stays within max_position_embeddings"
                )));
            }
        }
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(err(format!("hidden_act `{act}` is not supported (only `silu`)")));
            }
        }
        if raw.use_sliding_window == Some(true) {
            return Err(err("use_sliding_window = true is not supported; set it to false".into()));
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if raw.num_attention_heads == 0 || num_kv_heads == 0 || !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(err(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({num_kv_heads})",
                raw.num_attention_heads
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(format!("head_dim {head_dim} must be even and positive for RoPE")));
        }
        let attention_bias = raw.attention_bias.unwrap_or(false);
        // Qwen2 always has q/k/v biases and no o_proj bias, whatever `attention_bias` says;
        // Llama puts `attention_bias` on all four projections (transformers' semantics).
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            Arch::Llama => (attention_bias, attention_bias),
        };
        let bos = ids(&raw.bos_token_id).first().copied();
        Ok(Self {
            arch,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: raw.rope_theta.unwrap_or(10000.0),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(2048),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            bos_token_id: bos,
            eos_token_ids: ids(&raw.eos_token_id),
            pad_token_id: ids(&raw.pad_token_id).first().copied(),
        })
    }

    /// Writes this config back as an HF `config.json` value (for exports).
    pub fn to_hf_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "float32",
        });
        if self.arch == Arch::Llama {
            v["attention_bias"] = self.o_bias.into();
            v["mlp_bias"] = self.mlp_bias.into();
        } else {
            v["use_sliding_window"] = false.into();
        }
        if let Some(b) = self.bos_token_id {
            v["bos_token_id"] = b.into();
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => v["eos_token_id"] = (*one).into(),
            many => v["eos_token_id"] = many.to_vec().into(),
        }
        if let Some(p) = self.pad_token_id {
            v["pad_token_id"] = p.into();
        }
        v
    }

    /// Number of query heads that share one key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}
