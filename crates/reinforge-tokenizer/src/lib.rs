//! Text ↔ tokens for Reinforge, and chat templates rendered exactly as Hugging Face does.
//!
//! The job of this crate is the boundary between strings and token ids:
//!
//! - [`Tokenizer`] wraps the `tokenizers` crate over a model's `tokenizer.json` (encode,
//!   decode, vocabulary look-ups) and resolves the model's special tokens (BOS/EOS/PAD and the
//!   set of ids that stop generation) from `tokenizer_config.json`, `generation_config.json`
//!   and `config.json`.
//! - [`ChatTemplate`] renders a conversation (messages as `serde_json::Value`, so arbitrary
//!   fields such as `tool_calls` pass through) with minijinja configured to match
//!   transformers' `apply_chat_template` byte for byte: jinja2's whitespace rules, Python
//!   string methods, Python's `str()` of printed values, HF's `tojson`, `raise_exception`
//!   and `strftime_now`.
//! - [`ChatTokenizer::load_from_dir`] loads both from a model directory.
//!
//! Dependencies are `tokenizers` and `minijinja` (+ `minijinja-contrib` for Python methods,
//! `chrono` for `strftime_now`); no tensor crates, so anything can depend on this cheaply.

mod error;
mod python;
mod template;
mod tokenizer;

use std::path::Path;

use serde_json::Value as Json;

pub use error::{Result, TokenizerError};
pub use python::{repr_json, str_json};
pub use template::{ChatTemplate, RenderOptions, DEFAULT_TEMPLATE, TOOL_USE_TEMPLATE};
pub use tokenizer::{SpecialToken, SpecialTokens, Tokenizer};

/// A model's tokenizer together with its chat template, wired with its special tokens.
#[derive(Debug, Clone)]
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl ChatTokenizer {
    /// Pairs a tokenizer with a template; the tokenizer's special tokens become template
    /// variables unless the template already sets them.
    pub fn new(tokenizer: Tokenizer, mut template: ChatTemplate) -> Self {
        let mut vars = tokenizer.special_tokens().template_variables.clone();
        vars.extend(std::mem::take(template.variables_mut()));
        *template.variables_mut() = vars;
        Self {
            tokenizer,
            template,
        }
    }

    /// Loads `tokenizer.json`, the special-token configs and the chat template from a model
    /// directory (template from `chat_template.jinja`, else `tokenizer_config.json`, else
    /// `chat_template.json`).
    pub fn load_from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        check_dir(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let template = find_template(dir)?.ok_or_else(|| TokenizerError::NoChatTemplate {
            dir: dir.to_owned(),
        })?;
        Ok(Self::new(tokenizer, template))
    }

    /// Like [`Self::load_from_dir`] but with the template taken from `template_path`
    /// (for base models without one, or to override the shipped template).
    pub fn load_from_dir_with_template(
        dir: impl AsRef<Path>,
        template_path: impl AsRef<Path>,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        check_dir(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        Ok(Self::new(
            tokenizer,
            ChatTemplate::from_file(template_path)?,
        ))
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template (with special-token variables set).
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Renders a conversation to text (HF `apply_chat_template(..., tokenize=False)`).
    pub fn apply_chat_template(&self, messages: &[Json], opts: &RenderOptions) -> Result<String> {
        self.template.render(messages, opts)
    }

    /// Renders and encodes a conversation. Like HF, no special tokens are added: the template
    /// already wrote them.
    pub fn encode_chat(&self, messages: &[Json], opts: &RenderOptions) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(&self.apply_chat_template(messages, opts)?, false)
    }
}

/// Fails early, and clearly, when the model directory itself is wrong.
fn check_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(TokenizerError::Missing {
            what: "model directory",
            path: dir.to_owned(),
        })
    }
}

/// The chat template shipped in `dir`, in transformers' order of precedence.
fn find_template(dir: &Path) -> Result<Option<ChatTemplate>> {
    // A separate chat_template.jinja overrides the config's template (transformers ≥ 4.47),
    // and additional_chat_templates/NAME.jinja add named ones next to it.
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let mut named = vec![(
            DEFAULT_TEMPLATE.to_owned(),
            read_text(&jinja, "chat template")?,
        )];
        let extra_dir = dir.join("additional_chat_templates");
        if extra_dir.is_dir() {
            let entries = std::fs::read_dir(&extra_dir).map_err(|source| TokenizerError::Io {
                path: extra_dir.clone(),
                source,
            })?;
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
            {
                let name = path
                    .file_stem()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                named.push((name, read_text(&path, "chat template")?));
            }
        }
        return ChatTemplate::from_named(named).map(Some);
    }
    for file in ["tokenizer_config.json", "chat_template.json"] {
        let path = dir.join(file);
        if !path.exists() {
            continue;
        }
        match read_json(&path)?.get("chat_template") {
            None | Some(Json::Null) => {}
            Some(Json::String(src)) => return ChatTemplate::new(src.clone()).map(Some),
            Some(Json::Array(list)) => {
                let named = list
                    .iter()
                    .map(|t| match (t["name"].as_str(), t["template"].as_str()) {
                        (Some(n), Some(s)) => Ok((n.to_owned(), s.to_owned())),
                        _ => Err(TokenizerError::Json {
                            path: path.clone(),
                            message:
                                "chat_template list entries need string \"name\" and \"template\""
                                    .to_owned(),
                        }),
                    })
                    .collect::<Result<Vec<_>>>()?;
                return ChatTemplate::from_named(named).map(Some);
            }
            Some(other) => {
                return Err(TokenizerError::Json {
                    path,
                    message: format!("chat_template must be a string or a list, got {other}"),
                })
            }
        }
    }
    Ok(None)
}

/// Reads a UTF-8 file, naming what it was for when it is missing.
pub(crate) fn read_text(path: &Path, what: &'static str) -> Result<String> {
    if !path.exists() {
        return Err(TokenizerError::Missing {
            what,
            path: path.to_owned(),
        });
    }
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads and parses a JSON file; serde's message carries line and column.
pub(crate) fn read_json(path: &Path) -> Result<Json> {
    let text = read_text(path, "config file")?;
    serde_json::from_str(&text).map_err(|e| TokenizerError::Json {
        path: path.to_owned(),
        message: e.to_string(),
    })
}
