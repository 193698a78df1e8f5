//! Chat templates rendered the way transformers' `apply_chat_template` renders them.
//!
//! transformers compiles templates in a jinja2 `ImmutableSandboxedEnvironment` with
//! `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension and the default
//! `keep_trailing_newline = false`; it adds a `tojson` filter (`json.dumps`, keys unsorted,
//! non-ASCII kept) and the globals `raise_exception` and `strftime_now`. The same set-up is
//! reproduced here on minijinja, plus Python string/dict methods and Python's `str()` for
//! printed values.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};
use crate::python::{json_dumps, py_str, JsonOptions};

/// Name given to a template that comes as a single string (HF's behaviour for dict templates).
pub const DEFAULT_TEMPLATE: &str = "default";
/// Name HF picks when tools are passed and the model has a dedicated tool template.
pub const TOOL_USE_TEMPLATE: &str = "tool_use";

/// What to render besides the messages: the keyword arguments of `apply_chat_template`.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the assistant header so the model continues as the assistant.
    pub add_generation_prompt: bool,
    /// Cut the output right after the final message's content so the model continues it
    /// (HF's `continue_final_message`); incompatible with `add_generation_prompt`.
    pub continue_final_message: bool,
    /// Tool JSON schemas; `None` renders `tools` as Python `None`.
    pub tools: Option<Vec<Json>>,
    /// RAG documents; `None` renders `documents` as Python `None`.
    pub documents: Option<Vec<Json>>,
    /// Pick a named template instead of HF's automatic choice ("tool_use" with tools, else "default").
    pub template_name: Option<String>,
    /// Extra template variables (HF's `**kwargs`, e.g. `enable_thinking`); override special tokens.
    pub extra: serde_json::Map<String, Json>,
}

impl RenderOptions {
    /// Options with only `add_generation_prompt` set.
    pub fn generation(add_generation_prompt: bool) -> Self {
        Self {
            add_generation_prompt,
            ..Self::default()
        }
    }
}

/// A compiled chat template (or a named set of them, as in `tokenizer_config.json`).
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names in load order, with their sources (kept for inspection and errors).
    sources: Vec<(String, String)>,
    /// Global variables such as `bos_token`/`eos_token` (HF's `special_tokens_map`).
    variables: serde_json::Map<String, Json>,
}

/// Marker error carried inside minijinja's error so `raise_exception` can be told apart.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// Compiles a single template source (registered as "default").
    pub fn new(source: impl Into<String>) -> Result<Self> {
        Self::from_named([(DEFAULT_TEMPLATE.to_owned(), source.into())])
    }

    /// Compiles named templates, e.g. the `[{name, template}]` list form of `tokenizer_config.json`.
    pub fn from_named(templates: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let mut env = base_environment();
        let mut sources = Vec::new();
        for (name, source) in templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(&source).into_owned())
                .map_err(|e| TokenizerError::Template(format!("template {name:?}: {e}")))?;
            sources.push((name, source));
        }
        if sources.is_empty() {
            return Err(TokenizerError::Template("no templates given".to_owned()));
        }
        Ok(Self {
            env,
            sources,
            variables: serde_json::Map::new(),
        })
    }

    /// Reads and compiles a `.jinja` template file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::new(crate::read_text(path.as_ref(), "chat template")?)
    }

    /// Sets a global template variable (e.g. `bos_token`), replacing any previous value.
    pub fn with_variable(mut self, name: impl Into<String>, value: Json) -> Self {
        self.variables.insert(name.into(), value);
        self
    }

    /// Sets every variable of `vars` (e.g. [`crate::SpecialTokens::template_variables`]).
    pub fn with_variables(mut self, vars: &serde_json::Map<String, Json>) -> Self {
        for (k, v) in vars {
            self.variables.insert(k.clone(), v.clone());
        }
        self
    }

    /// The global variables every render sees.
    pub fn variables(&self) -> &serde_json::Map<String, Json> {
        &self.variables
    }

    /// Mutable access for [`crate::ChatTokenizer::new`], which merges in special tokens.
    pub(crate) fn variables_mut(&mut self) -> &mut serde_json::Map<String, Json> {
        &mut self.variables
    }

    /// Names of the compiled templates, in load order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sources.iter().map(|(n, _)| n.as_str())
    }

    /// Source text of a named template as given (before any rewriting).
    pub fn source(&self, name: &str) -> Option<&str> {
        self.sources
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_str())
    }

    /// Renders `messages` exactly as `tokenizer.apply_chat_template(messages, tokenize=False, ...)`.
    pub fn render(&self, messages: &[Json], opts: &RenderOptions) -> Result<String> {
        if opts.add_generation_prompt && opts.continue_final_message {
            return Err(TokenizerError::Request(
                "continue_final_message and add_generation_prompt are not compatible".to_owned(),
            ));
        }
        let name = self.select(opts)?;
        let template = self.env.get_template(name).map_err(template_error)?;

        // Same precedence as HF: special tokens, then kwargs, then the named arguments.
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in self.variables.iter().chain(opts.extra.iter()) {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert("tools".into(), Value::from_serialize(&opts.tools));
        ctx.insert("documents".into(), Value::from_serialize(&opts.documents));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        );

        let rendered = template.render(Value::from(ctx)).map_err(template_error)?;
        if opts.continue_final_message {
            return continue_final_message(rendered, messages);
        }
        Ok(rendered)
    }

    /// HF's `get_chat_template` choice among named templates.
    fn select<'a>(&'a self, opts: &'a RenderOptions) -> Result<&'a str> {
        let has = |n: &str| self.sources.iter().any(|(name, _)| name == n);
        let name = match &opts.template_name {
            Some(n) => n.as_str(),
            None if opts.tools.is_some() && has(TOOL_USE_TEMPLATE) => TOOL_USE_TEMPLATE,
            None if has(DEFAULT_TEMPLATE) => DEFAULT_TEMPLATE,
            // A lone template under another name is the only sensible choice.
            None if self.sources.len() == 1 => self.sources[0].0.as_str(),
            None => DEFAULT_TEMPLATE,
        };
        if has(name) {
            Ok(name)
        } else {
            Err(TokenizerError::UnknownTemplate {
                name: name.to_owned(),
                available: self.names().collect::<Vec<_>>().join(", "),
            })
        }
    }
}

/// The jinja2 environment transformers uses, rebuilt on minijinja.
fn base_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // jinja2's default: one trailing newline of the template source is dropped.
    env.set_keep_trailing_newline(false);
    // HF never HTML-escapes; minijinja would for names ending in .html.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Templates call Python methods: .strip(), .split(), .startswith(), .items(), .get() ...
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        // Python's str() of the value (None, True, 1e+16, ['a']); strings go out as they are.
        match value.as_str() {
            Some(s) => out.write_str(s),
            None => out.write_str(&py_str(value)),
        }
        .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
/// `ensure_ascii` and `indent` may be positional (HF's order); the rest are keyword-only here.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, Error> {
    let pick = |pos: Option<Value>, key: &str| -> std::result::Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(key)?;
        Ok(kw.or(pos).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(None, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or a string",
                )
            })?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let separators = match pick(None, "separators")? {
        None => None,
        Some(v) => {
            let parts: Vec<String> = v.try_iter()?.map(|p| p.to_string()).collect();
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => Some((item, key)),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be an (item_separator, key_separator) pair",
                    ))
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    json_dumps(
        value,
        &JsonOptions {
            ensure_ascii,
            indent,
            separators,
            sort_keys,
        },
    )
}

/// The template's own way to reject input (HF raises `TemplateError(message)`).
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// `datetime.now().strftime(format)` in local time, for templates that print today's date.
fn strftime_now(format: &str) -> std::result::Result<String, Error> {
    let mut out = String::new();
    // Writing (rather than to_string) turns an invalid format into an error, not a panic.
    write!(out, "{}", chrono::Local::now().format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

/// Maps a minijinja error to ours, surfacing `raise_exception` messages as such.
fn template_error(err: Error) -> TokenizerError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return TokenizerError::Raised(raised.0.clone());
        }
        source = e.source();
    }
    TokenizerError::Template(err.to_string())
}

/// transformers' `{% generation %}…{% endgeneration %}` marks assistant text for masks; when
/// rendering it is a no-op block. minijinja has no custom tags, so swap in an equivalent no-op
/// block (`if true`), which keeps trim_blocks/lstrip_blocks whitespace handling identical.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        let body = &tag[2..];
        let trimmed = body.trim_start_matches(['-', '+']).trim_start();
        let lead = body.len() - trimmed.len();
        let word_len = trimmed
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(trimmed.len());
        let replacement = match &trimmed[..word_len] {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str("{%");
                out.push_str(&body[..lead]);
                out.push_str(r);
                rest = &trimmed[word_len..];
            }
            None => {
                out.push_str("{%");
                rest = body;
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// HF's `continue_final_message`: cut right after the last message's content.
fn continue_final_message(rendered: String, messages: &[Json]) -> Result<String> {
    let content = messages.last().map(|m| &m["content"]);
    // Multimodal content is a list of parts; HF continues the text of the last one.
    let text = match content {
        Some(Json::String(s)) => s.as_str(),
        Some(Json::Array(parts)) => {
            parts
                .last()
                .and_then(|p| p["text"].as_str())
                .ok_or_else(|| {
                    TokenizerError::Request(
                        "final message's last content part has no text".to_owned(),
                    )
                })?
        }
        _ => {
            return Err(TokenizerError::Request(
                "continue_final_message needs a final message with string content".to_owned(),
            ))
        }
    };
    let stripped = text.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(TokenizerError::Request(
            "continue_final_message: the final message does not appear in the rendered chat"
                .to_owned(),
        ));
    };
    let lstripped = text.trim_start();
    // Keep trailing whitespace only if the template kept it too.
    let end = if rendered[loc..].starts_with(lstripped) {
        loc + lstripped.len()
    } else {
        loc + stripped.len()
    };
    Ok(rendered[..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: Json) -> Result<String> {
        let msgs = messages.as_array().unwrap().clone();
        ChatTemplate::new(src)?.render(&msgs, &RenderOptions::default())
    }

    #[test]
    fn python_methods_and_printing() {
        let out = render(
            "{{ messages[0].content.strip().split(',') }}|{{ 'ab'.startswith('a') }}|{{ none }}|{{ 1e16 }}|{{ messages[-1].role }}",
            json!([{"role": "user", "content": "  a,b "}, {"role": "x", "content": ""}]),
        )
        .unwrap();
        assert_eq!(out, "['a', 'b']|True|None|1e+16|x");
    }

    #[test]
    fn whitespace_control_and_trailing_newline() {
        let src = "{% for m in messages %}\n  {% if loop.first %}\n[{{ m.role }}]\n  {% endif %}\n{% if m.role == 'stop' %}{% break %}{% endif %}{{ m.content }}\n{% endfor %}\n";
        let out = render(
            src,
            json!([{"role": "a", "content": "1"}, {"role": "stop", "content": "2"}, {"role": "c", "content": "3"}]),
        )
        .unwrap();
        assert_eq!(out, "[a]\n1\n");
    }

    #[test]
    fn tojson_keyword_and_positional_options() {
        let msgs = json!([{"role": "user", "content": {"b": 1, "a": "é"}}]);
        let out = render(
            "{{ messages[0].content|tojson }} {{ messages[0].content|tojson(sort_keys=true) }} {{ messages[0].content|tojson(true) }} {{ messages[0].content|tojson(indent=1, separators=[',', ':']) }}",
            msgs,
        )
        .unwrap();
        assert_eq!(out, "{\"b\": 1, \"a\": \"é\"} {\"a\": \"é\", \"b\": 1} {\"b\": 1, \"a\": \"\\u00e9\"} {\n \"b\":1,\n \"a\":\"é\"\n}");
    }

    #[test]
    fn raise_exception_is_reported() {
        let err = render("{{ raise_exception('Roles must alternate') }}", json!([])).unwrap_err();
        assert!(
            matches!(&err, TokenizerError::Raised(m) if m == "Roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn strftime_now_formats_today() {
        let out = render("{{ strftime_now('%Y-%m-%d') }}", json!([])).unwrap();
        assert_eq!(out, chrono::Local::now().format("%Y-%m-%d").to_string());
        assert!(render("{{ strftime_now('%Q') }}", json!([])).is_err());
    }

    #[test]
    fn generation_tags_are_transparent() {
        let src = "{% for m in messages %}\n{% generation %}\n{{ m.content }}\n{%- endgeneration %}\n{% endfor %}";
        assert_eq!(
            render(src, json!([{"content": "x"}, {"content": "y"}])).unwrap(),
            "xy"
        );
    }

    #[test]
    fn named_templates_follow_hf_selection() {
        let t = ChatTemplate::from_named([
            ("default".to_owned(), "D".to_owned()),
            ("tool_use".to_owned(), "T{{ tools|length }}".to_owned()),
        ])
        .unwrap();
        assert_eq!(t.render(&[], &RenderOptions::default()).unwrap(), "D");
        let with_tools = RenderOptions {
            tools: Some(vec![json!({})]),
            ..Default::default()
        };
        assert_eq!(t.render(&[], &with_tools).unwrap(), "T1");
        let named = RenderOptions {
            template_name: Some("nope".into()),
            ..Default::default()
        };
        assert!(matches!(
            t.render(&[], &named),
            Err(TokenizerError::UnknownTemplate { .. })
        ));
    }

    #[test]
    fn continue_final_message_cuts_after_content() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>\n{% endfor %}",
        )
        .unwrap();
        let msgs = [
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "The answer is "}),
        ];
        let opts = RenderOptions {
            continue_final_message: true,
            ..Default::default()
        };
        assert_eq!(
            t.render(&msgs, &opts).unwrap(),
            "<user>hi</s>\n<assistant>The answer is"
        );
        let both = RenderOptions {
            add_generation_prompt: true,
            ..opts
        };
        assert!(t.render(&msgs, &both).is_err());
    }

    #[test]
    fn syntax_error_is_one_line() {
        let err = ChatTemplate::new("{% if %}").unwrap_err().to_string();
        assert!(
            err.starts_with("chat template error: template \"default\""),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}
