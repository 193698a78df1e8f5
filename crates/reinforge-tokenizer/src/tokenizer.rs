//! Text ↔ token ids over a Hugging Face `tokenizer.json`, plus the model's special tokens.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};
use crate::{read_json, read_text};

/// Special-token keys of HF's `special_tokens_map`, in HF's order; templates see them as variables.
const TEMPLATE_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// One special token: its text and, when the vocabulary has it, its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// Token text, e.g. `<|im_end|>`.
    pub text: String,
    /// Id in the vocabulary (`None` if the config names a token the vocabulary lacks).
    pub id: Option<u32>,
}

/// The model's special tokens, gathered from `tokenizer_config.json`,
/// `generation_config.json` and `config.json`.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token.
    pub bos: Option<SpecialToken>,
    /// End-of-sequence token as the tokenizer defines it (what templates print as `eos_token`).
    pub eos: Option<SpecialToken>,
    /// Padding token.
    pub pad: Option<SpecialToken>,
    /// Unknown-token placeholder.
    pub unk: Option<SpecialToken>,
    /// Ids that end generation: the tokenizer's eos plus every `eos_token_id` of the
    /// generation config (chat models often stop on several, e.g. `<|im_end|>` and `<|endoftext|>`).
    pub stop_ids: BTreeSet<u32>,
    /// Template variables (`bos_token`, `eos_token`, …, `additional_special_tokens`) as HF
    /// passes its `special_tokens_map` to `apply_chat_template`.
    pub template_variables: serde_json::Map<String, Json>,
}

/// A loaded tokenizer: `tokenizers::Tokenizer` plus the model's special tokens.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
}

impl Tokenizer {
    /// Loads a `tokenizer.json` alone (no special-token configuration).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_text(path, "tokenizer")?;
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| TokenizerError::Json {
            path: path.to_owned(),
            message: format!("not a valid tokenizer.json: {e}"),
        })?;
        Ok(Self {
            inner,
            special: SpecialTokens::default(),
        })
    }

    /// Loads `dir/tokenizer.json` and resolves special tokens from the configs beside it.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let mut tok = Self::from_file(dir.join("tokenizer.json"))?;
        tok.special = tok.resolve_special_tokens(dir)?;
        Ok(tok)
    }

    /// The same tokenizer without the padding and truncation a `tokenizer.json` may carry
    /// (encoders ship `Fixed(128)` padding there; callers pad and truncate themselves, as
    /// transformers does per call).
    pub fn without_padding_or_truncation(mut self) -> Self {
        self.inner.with_padding(None);
        // Only fails for impossible stride settings, which `None` has none of.
        let _ = self.inner.with_truncation(None);
        self
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (e.g. a BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // encode_fast skips offset tracking, which we never use; the ids are identical.
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Tokenizers(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special_tokens` drops special added tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Tokenizers(format!("decode failed: {e}")))
    }

    /// Id of a token string (vocabulary or added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of tokens including added tokens (Python's `len(tokenizer)`); the model's
    /// embedding may have more rows than this.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The resolved special tokens.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// BOS id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos.as_ref().and_then(|t| t.id)
    }

    /// The tokenizer's EOS id, else the first `eos_token_id` of the generation config.
    pub fn eos_id(&self) -> Option<u32> {
        self.special
            .eos
            .as_ref()
            .and_then(|t| t.id)
            .or_else(|| self.special.stop_ids.first().copied())
    }

    /// Padding id, if any config names one.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad.as_ref().and_then(|t| t.id)
    }

    /// Ids at which generation stops.
    pub fn stop_ids(&self) -> &BTreeSet<u32> {
        &self.special.stop_ids
    }

    /// Whether `id` ends generation.
    pub fn is_stop(&self, id: u32) -> bool {
        self.special.stop_ids.contains(&id)
    }

    /// The underlying `tokenizers` object, for anything not wrapped here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Reads the optional config files of `dir`. Precedence follows transformers: the
    /// tokenizer config defines the token strings; generation_config.json (or config.json
    /// when it is absent) supplies ids the tokenizer config lacks and the extra stop ids.
    fn resolve_special_tokens(&self, dir: &Path) -> Result<SpecialTokens> {
        let tok_cfg = read_optional_json(&dir.join("tokenizer_config.json"))?;
        let gen_cfg = read_optional_json(&dir.join("generation_config.json"))?;
        let model_cfg = read_optional_json(&dir.join("config.json"))?;

        // Ids from generation_config.json win over config.json, key by key, as in HF's
        // GenerationConfig.from_model_config fallback.
        let config_ids = |key: &str| -> Result<Vec<u32>> {
            for (cfg, name) in [
                (&gen_cfg, "generation_config.json"),
                (&model_cfg, "config.json"),
            ] {
                if let Some(v) = cfg
                    .as_ref()
                    .and_then(|c| c.get(key))
                    .filter(|v| !v.is_null())
                {
                    return token_ids(v).ok_or_else(|| TokenizerError::Json {
                        path: dir.join(name),
                        message: format!("{key} must be an integer or a list of integers, got {v}"),
                    });
                }
            }
            Ok(Vec::new())
        };

        let mut special = SpecialTokens::default();
        let mut vars = serde_json::Map::new();
        for key in TEMPLATE_TOKEN_KEYS {
            let text = match &tok_cfg {
                // HF leaves a token unset (undefined in templates) when its config says null.
                Some(cfg) => cfg.get(key).and_then(token_text),
                // No tokenizer config at all (e.g. a GGUF-derived directory): name the token
                // after the model config's id so `eos_token` & co. still resolve.
                None => config_ids(&format!("{key}_id"))?
                    .first()
                    .and_then(|&id| self.id_to_token(id)),
            };
            let Some(text) = text else { continue };
            vars.insert(key.to_owned(), Json::String(text.clone()));
            let token = SpecialToken {
                id: self.token_to_id(&text),
                text,
            };
            match key {
                "bos_token" => special.bos = Some(token),
                "eos_token" => special.eos = Some(token),
                "pad_token" => special.pad = Some(token),
                "unk_token" => special.unk = Some(token),
                _ => {}
            }
        }
        if let Some(extra) = tok_cfg
            .as_ref()
            .and_then(|c| c.get("additional_special_tokens"))
        {
            if let Some(list) = extra.as_array() {
                let texts: Vec<Json> = list
                    .iter()
                    .filter_map(token_text)
                    .map(Json::String)
                    .collect();
                vars.insert("additional_special_tokens".to_owned(), Json::Array(texts));
            }
        }
        special.template_variables = vars;
        special.stop_ids = config_ids("eos_token_id")?.into_iter().collect();
        if let Some(id) = special.eos.as_ref().and_then(|t| t.id) {
            special.stop_ids.insert(id);
        }
        Ok(special)
    }
}

/// A special token entry: `"<s>"` or an AddedToken object `{"content": "<s>", ...}`.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

/// An `*_token_id` entry: an integer or a list of integers.
fn token_ids(v: &Json) -> Option<Vec<u32>> {
    let one = |x: &Json| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Json::Array(items) => items.iter().map(one).collect(),
        other => one(other).map(|id| vec![id]),
    }
}

/// Parses `path` if it exists; absent optional configs are normal.
fn read_optional_json(path: &Path) -> Result<Option<serde_json::Map<String, Json>>> {
    if !path.exists() {
        return Ok(None);
    }
    match read_json(path)? {
        Json::Object(map) => Ok(Some(map)),
        _ => Err(TokenizerError::Json {
            path: path.to_owned(),
            message: "expected a JSON object at the top level".to_owned(),
        }),
    }
}
