//! Hugging Face files built from GGUF metadata: `config.json`, `tokenizer.json`,
//! `tokenizer_config.json`, `generation_config.json`, and the llama tensor-name mapping.

use serde_json::{json, Map, Value};

use crate::error::{AssetError, Result};
use crate::gguf::GgufFile;

/// The llama hyper-parameters read from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaParams {
    /// Vocabulary size (embedding rows).
    pub vocab_size: u64,
    /// Residual width.
    pub hidden_size: u64,
    /// MLP width.
    pub intermediate_size: u64,
    /// Number of decoder blocks.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (GQA).
    pub num_key_value_heads: u64,
    /// Per-head width.
    pub head_dim: u64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Context length.
    pub max_position_embeddings: u64,
    /// Whether the LM head is the embedding matrix (no `output.weight`).
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o have biases.
    pub attention_bias: bool,
    /// BOS token id.
    pub bos_token_id: Option<u64>,
    /// EOS token id.
    pub eos_token_id: Option<u64>,
    /// Padding token id.
    pub pad_token_id: Option<u64>,
}

/// GGUF stores floats as f32; `1e-5f32` widened is `9.99999974e-6`. The f32's shortest
/// decimal (what the converter read from `config.json`) is the value the model was trained
/// with, so round-trip through it.
fn f32_to_f64_clean(x: f64) -> f64 {
    let f = x as f32;
    if f as f64 == x {
        format!("{f}").parse().unwrap_or(x)
    } else {
        x
    }
}

impl LlamaParams {
    /// Reads the parameters of a `general.architecture = llama` file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path().to_path_buf();
        let invalid = |msg: String| AssetError::InvalidGguf {
            path: path.clone(),
            msg,
        };
        let unsupported = |msg: String| AssetError::Unsupported {
            path: path.clone(),
            msg,
        };
        let arch = g
            .get_str("general.architecture")?
            .ok_or_else(|| invalid("missing metadata key `general.architecture`".into()))?;
        if arch != "llama" {
            return Err(unsupported(format!(
                "architecture `{arch}`; only `llama` GGUF files can be imported"
            )));
        }
        let embd = g
            .tensor("token_embd.weight")
            .ok_or_else(|| invalid("no `token_embd.weight` tensor".into()))?;
        let hidden_size = g.require_u64("llama.embedding_length")?;
        let num_attention_heads = g.require_u64("llama.attention.head_count")?;
        let num_key_value_heads = g
            .get_u64("llama.attention.head_count_kv")?
            .unwrap_or(num_attention_heads);
        if num_attention_heads == 0
            || num_key_value_heads == 0
            || num_attention_heads % num_key_value_heads != 0
        {
            return Err(invalid(format!(
                "head counts {num_attention_heads} (query) / {num_key_value_heads} (key/value) are not a valid GQA layout"
            )));
        }
        let head_dim = match g.get_u64("llama.attention.key_length")? {
            Some(k) => k,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(invalid(format!(
                    "embedding_length {hidden_size} is not a multiple of head_count {num_attention_heads}"
                )))
            }
        };
        if let Some(v) = g.get_u64("llama.attention.value_length")? {
            if v != head_dim {
                return Err(unsupported(format!(
                    "value head size {v} differs from key head size {head_dim}"
                )));
            }
        }
        if let Some(r) = g.get_u64("llama.rope.dimension_count")? {
            if r != head_dim {
                return Err(unsupported(format!(
                    "partial RoPE (rope.dimension_count {r} < head size {head_dim})"
                )));
            }
        }
        if head_dim % 2 != 0 {
            return Err(invalid(format!("head size {head_dim} is odd")));
        }
        // A RoPE scaling recipe cannot be expressed with `rope_scaling: null`; refusing is
        // better than importing a model that silently computes the wrong positions.
        if let Some(kind) = g.get_str("llama.rope.scaling.type")? {
            if kind != "none" {
                return Err(unsupported(format!("RoPE scaling `{kind}`")));
            }
        }
        if g.tensor("rope_freqs.weight").is_some() {
            return Err(unsupported(
                "Llama 3.1-style RoPE frequency factors (`rope_freqs.weight`)".into(),
            ));
        }
        if g.get_u64("llama.expert_count")?.unwrap_or(0) > 0 {
            return Err(unsupported("mixture-of-experts llama models".into()));
        }
        let embd_vocab = embd.dims.get(1).copied().unwrap_or(0);
        let vocab_size = g.get_u64("llama.vocab_size")?.unwrap_or(embd_vocab);
        let attention_bias = g.tensor("blk.0.attn_q.bias").is_some();
        let bos_token_id = g.get_u64("tokenizer.ggml.bos_token_id")?;
        let eos_token_id = g.get_u64("tokenizer.ggml.eos_token_id")?;
        let pad_token_id = g.get_u64("tokenizer.ggml.padding_token_id")?;
        Ok(LlamaParams {
            vocab_size,
            hidden_size,
            intermediate_size: g.require_u64("llama.feed_forward_length")?,
            num_hidden_layers: g.require_u64("llama.block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f32_to_f64_clean(
                g.get_f64("llama.attention.layer_norm_rms_epsilon")?
                    .ok_or_else(|| {
                        invalid(
                            "missing metadata key `llama.attention.layer_norm_rms_epsilon`".into(),
                        )
                    })?,
            ),
            rope_theta: f32_to_f64_clean(g.get_f64("llama.rope.freq_base")?.unwrap_or(10000.0)),
            max_position_embeddings: g.require_u64("llama.context_length")?,
            tie_word_embeddings: g.tensor("output.weight").is_none(),
            attention_bias,
            bos_token_id,
            eos_token_id,
            pad_token_id,
        })
    }

    /// `config.json` for `LlamaForCausalLM`, keys in the order transformers writes them.
    pub fn config_json(&self) -> Value {
        let mut c = Map::new();
        c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
        c.insert("model_type".into(), json!("llama"));
        c.insert("hidden_act".into(), json!("silu"));
        c.insert("vocab_size".into(), json!(self.vocab_size));
        c.insert("hidden_size".into(), json!(self.hidden_size));
        c.insert("intermediate_size".into(), json!(self.intermediate_size));
        c.insert("num_hidden_layers".into(), json!(self.num_hidden_layers));
        c.insert(
            "num_attention_heads".into(),
            json!(self.num_attention_heads),
        );
        c.insert(
            "num_key_value_heads".into(),
            json!(self.num_key_value_heads),
        );
        // Only written when it differs from the default, as transformers derives it.
        if self.head_dim * self.num_attention_heads != self.hidden_size {
            c.insert("head_dim".into(), json!(self.head_dim));
        }
        c.insert("rms_norm_eps".into(), json!(self.rms_norm_eps));
        c.insert("rope_theta".into(), json!(self.rope_theta));
        c.insert("rope_scaling".into(), Value::Null);
        c.insert(
            "max_position_embeddings".into(),
            json!(self.max_position_embeddings),
        );
        c.insert("attention_bias".into(), json!(self.attention_bias));
        c.insert(
            "tie_word_embeddings".into(),
            json!(self.tie_word_embeddings),
        );
        self.insert_special_ids(&mut c);
        Value::Object(c)
    }

    /// `generation_config.json`: the special ids only (decoding settings are left to callers).
    pub fn generation_config_json(&self) -> Value {
        let mut c = Map::new();
        self.insert_special_ids(&mut c);
        Value::Object(c)
    }

    /// The bos/eos/pad ids that are known, in HF's key order.
    fn insert_special_ids(&self, c: &mut Map<String, Value>) {
        for (k, v) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("pad_token_id", self.pad_token_id),
        ] {
            if let Some(v) = v {
                c.insert(k.into(), json!(v));
            }
        }
    }
}

/// What a GGUF tensor becomes in the Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    /// The Hugging Face name.
    pub name: String,
    /// Heads to un-permute the rows over (q and k only).
    pub unpermute_heads: Option<u64>,
}

/// Maps a llama GGUF tensor name to its Hugging Face name (`None` for unknown names).
pub fn map_llama_tensor_name(gguf_name: &str, p: &LlamaParams) -> Option<HfTensor> {
    let plain = |name: String| {
        Some(HfTensor {
            name,
            unpermute_heads: None,
        })
    };
    match gguf_name {
        "token_embd.weight" => return plain("model.embed_tokens.weight".into()),
        "output_norm.weight" => return plain("model.norm.weight".into()),
        "output.weight" => return plain("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer_str, rest) = rest.split_once('.')?;
    let layer: u64 = layer_str.parse().ok()?;
    // Reject spellings such as `blk.01` that would alias `blk.1`.
    if layer >= p.num_hidden_layers || layer.to_string() != layer_str {
        return None;
    }
    let (part, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let (hf, heads) = match part {
        "attn_norm" => ("input_layernorm", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        "attn_q" => ("self_attn.q_proj", Some(p.num_attention_heads)),
        "attn_k" => ("self_attn.k_proj", Some(p.num_key_value_heads)),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        _ => return None,
    };
    let is_norm = part.ends_with("_norm");
    if is_norm && suffix == "bias" {
        return None;
    }
    Some(HfTensor {
        name: format!("model.layers.{layer}.{hf}.{suffix}"),
        unpermute_heads: heads,
    })
}

/// The expected HF shape of a mapped tensor, for checking the file against its metadata.
pub fn expected_shape(hf_name: &str, p: &LlamaParams) -> Option<Vec<u64>> {
    let (h, i, v) = (p.hidden_size, p.intermediate_size, p.vocab_size);
    let q = p.num_attention_heads * p.head_dim;
    let kv = p.num_key_value_heads * p.head_dim;
    Some(match hf_name {
        "model.embed_tokens.weight" | "lm_head.weight" => vec![v, h],
        "model.norm.weight" => vec![h],
        _ => {
            let part = hf_name.strip_prefix("model.layers.")?.split_once('.')?.1;
            match part {
                "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
                "self_attn.q_proj.weight" => vec![q, h],
                "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, h],
                "self_attn.o_proj.weight" => vec![h, q],
                "self_attn.q_proj.bias" => vec![q],
                "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => vec![kv],
                "self_attn.o_proj.bias" => vec![h],
                "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![i, h],
                "mlp.down_proj.weight" => vec![h, i],
                _ => return None,
            }
        }
    })
}

/// Undoes llama.cpp's q/k row permutation in place.
///
/// llama.cpp's converter reorders the rows of each head so that its RoPE can rotate
/// adjacent pairs; HF rotates `(x[i], x[i + hd/2])`. Within each head of `hd` rows, HF row
/// `i*hd/2 + j` is GGUF row `2*j + i`. `data` is row-major `[rows][cols]` (`cols` = 1 for a
/// bias).
pub fn unpermute_rows(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    n_heads: usize,
) -> Result<(), String> {
    if n_heads == 0 || rows % n_heads != 0 || (rows / n_heads) % 2 != 0 || data.len() != rows * cols
    {
        return Err(format!(
            "cannot un-permute {rows} rows over {n_heads} heads (need an even number of rows per head)"
        ));
    }
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut head = vec![0f32; hd * cols];
    for h in 0..n_heads {
        let block = &mut data[h * hd * cols..(h + 1) * hd * cols];
        head.copy_from_slice(block);
        for i in 0..2 {
            for j in 0..half {
                let src = (2 * j + i) * cols;
                let dst = (i * half + j) * cols;
                block[dst..dst + cols].copy_from_slice(&head[src..src + cols]);
            }
        }
    }
    Ok(())
}

/// The tokenizer data of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`).
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTokenizer {
    /// `tokenizer.ggml.model` (only `gpt2`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre`: the llama.cpp pre-tokenizer name.
    pub pre: Option<String>,
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// llama.cpp token types by id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Vec<i64>,
    /// BPE merges, `"left right"`, by rank.
    pub merges: Vec<String>,
    /// BOS id.
    pub bos: Option<u64>,
    /// EOS id.
    pub eos: Option<u64>,
    /// Padding id.
    pub pad: Option<u64>,
    /// Unknown-token id.
    pub unk: Option<u64>,
    /// Whether BOS is prepended when encoding.
    pub add_bos: bool,
    /// Whether EOS is appended when encoding.
    pub add_eos: bool,
    /// The chat template, as stored.
    pub chat_template: Option<String>,
}

/// llama.cpp token type of control tokens.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp token type of user-defined (added, not special) tokens.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

impl GgufTokenizer {
    /// Reads the tokenizer metadata; errors name the missing or malformed key.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let path = g.path().to_path_buf();
        let invalid = |msg: String| AssetError::InvalidGguf {
            path: path.clone(),
            msg,
        };
        let model = g
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| invalid("no tokenizer (missing `tokenizer.ggml.model`)".into()))?
            .to_string();
        if model != "gpt2" {
            return Err(AssetError::Unsupported {
                path,
                msg: format!(
                    "tokenizer model `{model}`; only byte-level BPE (`gpt2`) tokenizers can be converted"
                ),
            });
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            let arr = g
                .get_array(key)?
                .ok_or_else(|| invalid(format!("missing metadata key `{key}`")))?;
            arr.as_strings()
                .map(<[String]>::to_vec)
                .ok_or_else(|| invalid(format!("metadata `{key}` should be an array of strings")))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let token_types = match g.get_array("tokenizer.ggml.token_type")? {
            None => vec![1; tokens.len()],
            Some(a) => a.to_i64_vec().ok_or_else(|| {
                invalid(
                    "metadata `tokenizer.ggml.token_type` should be an array of integers".into(),
                )
            })?,
        };
        if token_types.len() != tokens.len() {
            return Err(invalid(format!(
                "{} token types for {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        let id = |key: &str| -> Result<Option<u64>> {
            match g.get_u64(key)? {
                Some(v) if v >= tokens.len() as u64 => Err(invalid(format!(
                    "`{key}` = {v} is outside the vocabulary of {} tokens",
                    tokens.len()
                ))),
                v => Ok(v),
            }
        };
        Ok(GgufTokenizer {
            pre: g.get_str("tokenizer.ggml.pre")?.map(str::to_string),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp's default for BPE vocabularies when the key is absent.
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template: g.get_str("tokenizer.chat_template")?.map(str::to_string),
            model,
            tokens,
            token_types,
            merges,
        })
    }

    fn token(&self, id: Option<u64>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// `(pre_tokenizer, normalizer)` for llama.cpp's pre-tokenizer name.
    fn pre_tokenizer(&self) -> Result<(Value, Value), String> {
        let byte_level = |trim_offsets: bool, use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex});
        let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
        match self.pre.as_deref().unwrap_or("gpt2") {
            // SmolLM2: every digit on its own, then GPT-2's byte-level regex.
            "smollm" => Ok((
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true},
                    byte_level(true, true),
                ]}),
                Value::Null,
            )),
            "gpt2" => Ok((byte_level(true, true), Value::Null)),
            "qwen2" => Ok((
                json!({"type": "Sequence", "pretokenizers": [
                    split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
                    byte_level(false, false),
                ]}),
                json!({"type": "NFC"}),
            )),
            "llama-bpe" | "llama3" => Ok((
                json!({"type": "Sequence", "pretokenizers": [
                    split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
                    byte_level(true, false),
                ]}),
                Value::Null,
            )),
            other => Err(format!(
                "pre-tokenizer `{other}` (supported: smollm, gpt2, qwen2, llama-bpe)"
            )),
        }
    }

    /// `tokenizer.json` (the `tokenizers` library format), laid out like the HF files.
    pub fn tokenizer_json(&self) -> Result<Value, String> {
        let (pre_tokenizer, normalizer) = self.pre_tokenizer()?;
        let mut vocab = Map::with_capacity(self.tokens.len());
        let mut added = Vec::new();
        for (id, (tok, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            if vocab.insert(tok.clone(), json!(id)).is_some() {
                return Err(format!("token `{tok}` appears twice in the vocabulary"));
            }
            if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                added.push(json!({
                    "id": id,
                    "content": tok,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": ty == TOKEN_TYPE_CONTROL,
                }));
            }
        }
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
        // With add_bos the BOS must come from the post-processor, as in HF's Llama 3 files.
        let post_processor = match self.token(self.bos).filter(|_| self.add_bos) {
            Some(bos) => json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [
                    {"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {bos: {"id": bos, "ids": [self.bos], "tokens": [bos]}},
            }),
            None => byte_level,
        };
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": false,
                "vocab": vocab,
                "merges": self.merges,
            },
        }))
    }

    /// `tokenizer_config.json` for transformers' `PreTrainedTokenizerFast`.
    pub fn tokenizer_config_json(&self, model_max_length: u64) -> Value {
        let mut decoder = Map::new();
        for (id, (tok, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                decoder.insert(
                    id.to_string(),
                    json!({
                        "content": tok,
                        "lstrip": false,
                        "normalized": false,
                        "rstrip": false,
                        "single_word": false,
                        "special": ty == TOKEN_TYPE_CONTROL,
                    }),
                );
            }
        }
        let mut c = Map::new();
        c.insert("add_bos_token".into(), json!(self.add_bos));
        c.insert("add_eos_token".into(), json!(self.add_eos));
        c.insert("add_prefix_space".into(), json!(false));
        c.insert("added_tokens_decoder".into(), Value::Object(decoder));
        c.insert("bos_token".into(), json!(self.token(self.bos)));
        if let Some(t) = &self.chat_template {
            c.insert("chat_template".into(), json!(t));
        }
        c.insert("clean_up_tokenization_spaces".into(), json!(false));
        c.insert("eos_token".into(), json!(self.token(self.eos)));
        c.insert("model_max_length".into(), json!(model_max_length));
        c.insert("pad_token".into(), json!(self.token(self.pad)));
        c.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        c.insert("unk_token".into(), json!(self.token(self.unk)));
        Value::Object(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_is_the_documented_inverse() {
        // 2 heads of hd = 4 rows, 1 column; GGUF row r holds value r.
        let mut w: Vec<f32> = (0..8).map(|r| r as f32).collect();
        unpermute_rows(&mut w, 8, 1, 2).unwrap();
        // HF row i*2 + j = GGUF row 2*j + i within each head.
        assert_eq!(w, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        assert!(unpermute_rows(&mut w, 8, 1, 3).is_err());
    }

    #[test]
    fn unpermute_matches_numpy_reshape_swapaxes() {
        // w.reshape(n_head, hd/2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
        let (n_head, hd, cols) = (3, 6, 2);
        let rows = n_head * hd;
        let gguf: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        let mut want = vec![0f32; rows * cols];
        for h in 0..n_head {
            for a in 0..2 {
                for b in 0..hd / 2 {
                    for c in 0..cols {
                        // out index (h, a, b, c) reads input index (h, b, a, c)
                        let out = ((h * 2 + a) * (hd / 2) + b) * cols + c;
                        let inp = ((h * (hd / 2) + b) * 2 + a) * cols + c;
                        want[out] = gguf[inp];
                    }
                }
            }
        }
        let mut got = gguf.clone();
        unpermute_rows(&mut got, rows, cols, n_head).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn f32_metadata_is_cleaned_to_its_shortest_decimal() {
        assert_eq!(f32_to_f64_clean(1e-5f32 as f64), 1e-5);
        assert_eq!(f32_to_f64_clean(100000.0), 100000.0);
        assert_eq!(f32_to_f64_clean(0.1), 0.1);
    }
}
