//! verl's tool-calling multi-turn rollouts (`ToolAgentLoop`, the `tool_agent` agent loop;
//! verl's `actor_rollout_ref.rollout.multi_turn.*`), token in, token out.
//!
//! The prompt is rendered with the tools' schemas (`apply_chat_template(messages, tools=…)`);
//! then each trajectory alternates:
//! - an **assistant turn**: up to what is left of `data.max_response_length`, ending at
//!   end-of-sequence; its tokens are kept exactly as sampled;
//! - its **tool calls**, read from the turn's text (special tokens kept) as Hermes blocks
//!   `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; the first `max_parallel_calls`
//!   run, each answered by a `tool` message (cut to `max_tool_response_length` characters);
//!   the messages are rendered by the chat template with the generation prompt, minus the
//!   template's default system prompt, and appended as context tokens (masked out of the
//!   losses).
//!
//! It ends when a turn has no tool call, when the response budget is spent (a tool turn that
//! would not fit is dropped), or at `max_assistant_turns` / `max_user_turns`. Malformed calls
//! are skipped; an unknown tool or bad arguments are answered with verl's
//! `Error when executing tool: …` text, so the model can learn from it.
//!
//! With an interaction (verl's `interaction_config_path`), a turn without tool calls goes to
//! a simulated user instead of ending the trajectory: its answer comes back as a `user`
//! message, and it decides when the trajectory ends.
//!
//! Tools and interactions run natively, as verl's own classes behave:
//! `verl.tools.gsm8k_tool.Gsm8kTool` (scores a submitted answer against the row's
//! `tools_kwargs` ground truth), `verl.tools.search_tool.SearchTool` (a retrieval server,
//! Search-R1's API) and `verl.interactions.gsm8k_interaction.Gsm8kInteraction` (checks the
//! `#### answer` against the row's `interaction_kwargs.ground_truth`). Tool rewards and turn
//! scores are logged (`tool_calls/reward_mean`, `interaction/score_mean`) and reach the reward
//! function's `extra_info`; as in verl, the reward function alone scores the response.

use std::path::Path;
use std::time::{Duration, Instant};

use reinforge_engine::{Completion, FinishReason, SamplingParams};
use reinforge_retrieval::{RetrievalClient, ScoredDoc};
use reinforge_tokenizer::{repr_json, str_json, ChatTokenizer, RenderOptions};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value as Json};

use crate::error::TrainError;
use crate::multi_turn::{Flavour, Growing, MultiTurnRollout, ToolResults, TurnGenerator};

/// verl's class name of the GSM8K answer-checking tool.
pub const GSM8K_TOOL: &str = "verl.tools.gsm8k_tool.Gsm8kTool";
/// verl's class name of the retrieval tool.
pub const SEARCH_TOOL: &str = "verl.tools.search_tool.SearchTool";
/// verl's class name of the GSM8K simulated user.
pub const GSM8K_INTERACTION: &str = "verl.interactions.gsm8k_interaction.Gsm8kInteraction";

/// A simulated user (verl's interaction), by the name rows pick it with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InteractionSpec {
    /// `name` (default: the class name without `Interaction`, lower-cased).
    pub name: String,
    /// What it does: verl's Gsm8kInteraction (the only kind).
    pub class_name: String,
}

/// Reads verl's interaction config (`multi_turn.interaction_config_path`):
/// `interaction: [{name, class_name, config}]`.
pub fn load_interaction_config(path: &Path) -> Result<Vec<InteractionSpec>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: Json = serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: not YAML: {e}", path.display()))?;
    let items = doc.get("interaction").and_then(Json::as_array).ok_or_else(|| format!("{}: no `interaction:` list (verl's format: interaction: [{{name, class_name, config}}])", path.display()))?;
    let mut out: Vec<InteractionSpec> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let at = |e: String| format!("{}: interaction[{i}]: {e}", path.display());
        let class = it.get("class_name").and_then(Json::as_str).ok_or_else(|| at("no class_name".into()))?;
        if class != GSM8K_INTERACTION {
            return Err(at(format!("`{class}` is a Python interaction class; the one that runs here is {GSM8K_INTERACTION}")));
        }
        let simple = class.rsplit('.').next().unwrap_or(class);
        let name = match it.get("name") {
            Some(Json::String(n)) => n.clone(),
            _ => simple.strip_suffix("Interaction").unwrap_or(simple).to_lowercase(),
        };
        if out.iter().any(|o| o.name == name) {
            return Err(at(format!("Duplicate interaction name '{name}' found. Each interaction must have a unique name.")));
        }
        out.push(InteractionSpec { name, class_name: class.to_string() });
    }
    Ok(out)
}

/// What the tool agent reads of a row's `extra_info`: `{"tools_kwargs", "interaction_kwargs"}`.
pub fn row_kwargs(extra_info: &Json) -> Json {
    json!({
        "tools_kwargs": extra_info.get("tools_kwargs").cloned().unwrap_or_else(|| json!({})),
        "interaction_kwargs": extra_info.get("interaction_kwargs").cloned().unwrap_or(Json::Null),
    })
}

/// Which side of a long tool response is cut (verl's `tool_response_truncate_side`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TruncateSide {
    /// Keep the start: `text[:n] + "...(truncated)"`.
    Left,
    /// Keep the end: `"(truncated)..." + text[-n:]`.
    Right,
    /// Keep both ends: `text[:n/2] + "...(truncated)..." + text[-n/2:]`.
    #[default]
    Middle,
}

/// What a tool does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToolKind {
    /// verl's `Gsm8kTool`: `{"answer": …}` scored against `create_kwargs.ground_truth`.
    Gsm8k,
    /// verl's `SearchTool`: `{"query_list": [...]}` sent to a retrieval server.
    Search {
        /// `config.retrieval_service_url`.
        url: String,
        /// `config.topk` (3).
        topk: usize,
        /// `config.timeout` in seconds (30).
        timeout_s: f64,
    },
}

/// One tool: its name (the schema's function name), what it does and the schema the
/// template shows the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// `tool_schema.function.name`: what calls name.
    pub name: String,
    /// The implementation.
    pub kind: ToolKind,
    /// The OpenAI function schema, as verl passes it to the chat template.
    pub schema: Json,
}

/// Everything a rollout rank needs to run the loop (sent to remote ranks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSettings {
    /// The tools, from verl's tool config.
    pub tools: Vec<ToolSpec>,
    /// The simulated users, from verl's interaction config (empty: none).
    #[serde(default)]
    pub interactions: Vec<InteractionSpec>,
    /// Assistant turns before the trajectory ends (`None`: no limit).
    pub max_assistant_turns: Option<usize>,
    /// Tool turns before the trajectory ends (`None`: no limit).
    pub max_user_turns: Option<usize>,
    /// Calls run per turn; later ones in the same turn are ignored.
    pub max_parallel_calls: usize,
    /// Characters of a tool response kept.
    pub max_tool_response_length: usize,
    /// Which side a long response loses.
    pub truncate_side: TruncateSide,
    /// Tokens in a whole response (`data.max_response_length`).
    pub response_length: usize,
    /// Template variables (`data.apply_chat_template_kwargs`), used for tool messages too.
    pub chat_template_kwargs: Map<String, Json>,
}

impl ToolCallSettings {
    /// The tools' schemas, as the prompt is rendered with them.
    pub fn schemas(&self) -> Vec<Json> {
        self.tools.iter().map(|t| t.schema.clone()).collect()
    }
}

/// Reads verl's tool config (`multi_turn.tool_config_path`): `tools: [{class_name, config,
/// tool_schema}]`. Errors say which entry is wrong and how to fix it.
pub fn load_tool_config(path: &Path) -> Result<Vec<ToolSpec>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: Json = serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: not YAML: {e}", path.display()))?;
    let tools = doc.get("tools").and_then(Json::as_array).ok_or_else(|| format!("{}: no `tools:` list (verl's format: tools: [{{class_name, config, tool_schema}}])", path.display()))?;
    let mut out: Vec<ToolSpec> = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let at = |e: String| format!("{}: tools[{i}]: {e}", path.display());
        let class = t.get("class_name").and_then(Json::as_str).ok_or_else(|| at("no class_name".into()))?;
        let config = t.get("config").cloned().unwrap_or_else(|| json!({}));
        if let Some(kind) = config.get("type").and_then(Json::as_str).filter(|k| *k != "native") {
            return Err(at(format!("config.type = `{kind}`: only native tools run here (MCP servers do not)")));
        }
        let schema = normalize_schema(t.get("tool_schema").ok_or_else(|| at("no tool_schema".into()))?).map_err(|e| at(format!("tool_schema: {e}")))?;
        let name = schema["function"]["name"].as_str().unwrap_or_default().to_string();
        let kind = match class {
            GSM8K_TOOL => ToolKind::Gsm8k,
            SEARCH_TOOL => {
                let url = config.get("retrieval_service_url").and_then(Json::as_str).unwrap_or_default();
                if url.is_empty() {
                    return Err(at("config.retrieval_service_url is not set: give the retrieval server's URL (e.g. http://127.0.0.1:8000/retrieve, `reinforge retrieval serve`)".into()));
                }
                let topk = config.get("topk").map(|v| v.as_u64().filter(|&k| k > 0).ok_or_else(|| at(format!("config.topk = {v}: a positive integer")))).transpose()?.unwrap_or(3);
                let timeout_s = config.get("timeout").map(|v| v.as_f64().filter(|&s| s > 0.0 && s <= 3600.0).ok_or_else(|| at(format!("config.timeout = {v}: seconds in (0, 3600]")))).transpose()?.unwrap_or(30.0);
                ToolKind::Search { url: url.to_string(), topk: topk as usize, timeout_s }
            }
            other => {
                return Err(at(format!(
                    "`{other}` is a Python tool class; the tools that run here are {GSM8K_TOOL} and {SEARCH_TOOL} (serve others behind the search tool's HTTP API, or score answers with reward.kind = \"python\")"
                )))
            }
        };
        if out.iter().any(|o| o.name == name) {
            return Err(at(format!("a second tool named `{name}`: tool names must be unique")));
        }
        out.push(ToolSpec { name, kind, schema });
    }
    Ok(out)
}

/// The schema as verl's `OpenAIFunctionToolSchema.model_dump(exclude_unset=True,
/// exclude_none=True)` gives it to the template: the model's fields in the model's order,
/// unknown keys dropped (pydantic ignores them), required ones checked.
pub fn normalize_schema(v: &Json) -> Result<Json, String> {
    let obj = |v: &Json, at: &str| v.as_object().cloned().ok_or_else(|| format!("{at}: expected a mapping"));
    let text = |m: &Map<String, Json>, k: &str, at: &str| -> Result<String, String> {
        m.get(k).and_then(Json::as_str).map(str::to_string).ok_or_else(|| format!("{at}.{k}: a string is required"))
    };
    let top = obj(v, "tool_schema")?;
    let f = obj(top.get("function").ok_or("function: required")?, "function")?;
    let mut func = Map::new();
    func.insert("name".into(), Json::String(text(&f, "name", "function")?));
    func.insert("description".into(), Json::String(text(&f, "description", "function")?));
    if let Some(p) = f.get("parameters") {
        let p = obj(p, "function.parameters")?;
        let mut params = Map::new();
        params.insert("type".into(), Json::String(text(&p, "type", "function.parameters")?));
        let props = obj(p.get("properties").ok_or("function.parameters.properties: required")?, "function.parameters.properties")?;
        let mut out_props = Map::new();
        for (k, prop) in &props {
            let at = format!("function.parameters.properties.{k}");
            let prop = obj(prop, &at)?;
            let mut o = Map::new();
            o.insert("type".into(), Json::String(text(&prop, "type", &at)?));
            for key in ["description", "enum"] {
                match prop.get(key) {
                    None | Some(Json::Null) => {}
                    Some(x) => {
                        let ok = if key == "description" { x.is_string() } else { x.as_array().is_some_and(|a| a.iter().all(Json::is_string)) };
                        if !ok {
                            return Err(format!("{at}.{key}: expected {}", if key == "description" { "a string" } else { "a list of strings" }));
                        }
                        o.insert(key.into(), x.clone());
                    }
                }
            }
            out_props.insert(k.clone(), Json::Object(o));
        }
        params.insert("properties".into(), Json::Object(out_props));
        let req = p.get("required").and_then(Json::as_array).filter(|a| a.iter().all(Json::is_string));
        params.insert("required".into(), Json::Array(req.ok_or("function.parameters.required: a list of strings is required")?.clone()));
        func.insert("parameters".into(), Json::Object(params));
    }
    match f.get("strict") {
        None | Some(Json::Null) => {}
        Some(Json::Bool(b)) => {
            func.insert("strict".into(), Json::Bool(*b));
        }
        Some(x) => return Err(format!("function.strict = {x}: true or false")),
    }
    Ok(json!({"type": text(&top, "type", "tool_schema")?, "function": func}))
}

/// One parsed call: the function's name and its arguments (any JSON, as the model wrote it).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCall {
    /// The tool named.
    pub name: String,
    /// The arguments.
    pub arguments: Json,
}

/// verl's `HermesToolParser`: every `<tool_call>…</tool_call>` block (non-greedy) whose body
/// is a JSON object with a string `name` and an `arguments` member; other blocks are skipped.
pub fn parse_hermes(text: &str) -> Vec<FunctionCall> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        let body = &rest[i + OPEN.len()..];
        let Some(j) = body.find(CLOSE) else { break };
        if let Ok(Json::Object(m)) = serde_json::from_str::<Json>(&body[..j]) {
            if let (Some(Json::String(name)), Some(arguments)) = (m.get("name"), m.get("arguments")) {
                out.push(FunctionCall { name: name.clone(), arguments: arguments.clone() });
            }
        }
        rest = &body[j + CLOSE.len()..];
    }
    out
}

/// Cuts a tool response longer than `max` characters as verl does (Python slicing included:
/// `text[-0:]` is the whole text).
pub fn truncate_response(text: &str, max: usize, side: TruncateSide) -> String {
    let chars: Vec<char> = text.chars().collect();
    if text.is_empty() || chars.len() <= max {
        return text.to_string();
    }
    let head = |n: usize| chars[..n].iter().collect::<String>();
    let tail = |n: usize| if n == 0 { text.to_string() } else { chars[chars.len() - n..].iter().collect::<String>() };
    match side {
        TruncateSide::Left => format!("{}...(truncated)", head(max)),
        TruncateSide::Right => format!("(truncated)...{}", tail(max)),
        TruncateSide::Middle => format!("{}...(truncated)...{}", head(max / 2), tail(max / 2)),
    }
}

/// Python's type name of a JSON value (for verl's error texts).
fn py_type(v: &Json) -> &'static str {
    match v {
        Json::Null => "NoneType",
        Json::Bool(_) => "bool",
        Json::Number(n) if n.is_f64() => "float",
        Json::Number(_) => "int",
        Json::String(_) => "str",
        Json::Array(_) => "list",
        Json::Object(_) => "dict",
    }
}

/// The last 300 characters, which verl's `gsm8k.extract_solution` reads
/// (`_SOLUTION_CLIP_CHARS`).
fn solution_tail(text: &str) -> &str {
    text.char_indices().rev().nth(299).map_or(text, |(i, _)| &text[i..])
}

/// verl's `gsm8k.extract_solution(method="flexible")`: over the last 300 characters, the last
/// match of `-?[0-9.,]+` that is not `.` (all of them `.`: the first one, as verl's loop
/// leaves it).
pub fn gsm8k_flexible(text: &str) -> Option<String> {
    let s: Vec<char> = solution_tail(text).chars().collect();
    let num = |c: char| c.is_ascii_digit() || c == '.' || c == ',';
    let mut found: Vec<String> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let start = i;
        let signed = s[i] == '-' && s.get(i + 1).is_some_and(|&c| num(c));
        if signed || num(s[i]) {
            i += usize::from(signed);
            while i < s.len() && num(s[i]) {
                i += 1;
            }
            found.push(s[start..i].iter().collect());
        } else {
            i += 1;
        }
    }
    found.iter().rev().find(|a| a.as_str() != ".").or(found.first()).cloned()
}

/// verl's `gsm8k.extract_solution(method="strict")`: over the last 300 characters, the last
/// `#### -?[0-9.,]+`, commas removed. (The reward's `reinforge_reward::gsm8k_strict` reads the
/// whole response and extracts nothing from `#### .`; verl's tools and simulated user clip
/// and keep the `.`.)
pub fn gsm8k_strict(text: &str) -> Option<String> {
    let num = |c: char| c.is_ascii_digit() || c == '.' || c == ',';
    let mut last = None;
    let mut rest = solution_tail(text);
    while let Some(i) = rest.find("#### ") {
        let after = &rest[i + 5..];
        let sign = usize::from(after.starts_with('-'));
        let len = after[sign..].chars().take_while(|&c| num(c)).count();
        if len > 0 {
            last = Some(after[..sign + len].replace([',', '$'], ""));
            rest = &after[sign + len..];
        } else {
            rest = &rest[i + 1..];
        }
    }
    last
}

/// verl's `Gsm8kInteraction.generate_response`: the last assistant message scored with gsm8k
/// strict; `(done, the user's reply, the turn score)` (the score an int 0 when nothing is
/// extracted, as verl's `compute_score` returns it).
pub fn gsm8k_interaction(content: &str, ground_truth: Option<&Json>) -> (bool, &'static str, f64) {
    let score = match gsm8k_strict(content) {
        Some(a) if ground_truth.and_then(Json::as_str) == Some(a.as_str()) => 1.0,
        _ => 0.0,
    };
    match score == 1.0 {
        true => (true, "Your response is correct!", score),
        false => (false, "Your response is incorrect! You need to reflect on your answer and try again.", score),
    }
}

/// verl's `Gsm8kTool.execute` on a fresh instance: the response text and the step reward
/// (0 for a correct answer, -0.05 otherwise: a fresh instance's last reward is 0).
pub fn gsm8k_execute(arguments: &Json, ground_truth: Option<&Json>) -> Result<(String, f64), String> {
    let Json::Object(params) = arguments else {
        return Err(format!("'{}' object has no attribute 'get'", py_type(arguments)));
    };
    let answer = match params.get("answer") {
        None => String::new(),
        Some(v) => str_json(v),
    };
    let response = if answer.starts_with("#### ") { answer.clone() } else { format!("#### {answer}") };
    // gsm8k.compute_score(..., method="flexible", format_score=0.0, score=1.0): an int 0 when
    // nothing is extracted, floats otherwise (Python prints them differently).
    let reward = match gsm8k_flexible(&response) {
        None => json!(0),
        Some(a) if ground_truth.and_then(Json::as_str) == Some(a.as_str()) => json!(1.0),
        Some(_) => json!(0.0),
    };
    let value = reward.as_f64().unwrap_or(0.0);
    let text = format!("Current parsed answer={} reward={}", repr_json(&Json::String(answer)), repr_json(&reward));
    Ok((text, if value > 0.0 { 0.0 } else { -0.05 }))
}

/// verl's `perform_single_search_batch` result text for one call: per query,
/// `Doc i (Title: t)\ntext` blocks, queries joined by `\n---\n`, as `{"result": "…"}`.
pub fn search_result_text(result: Result<&[Vec<ScoredDoc>], String>) -> String {
    let dump = |s: &str| format!("{{\"result\": {}}}", serde_json::to_string(s).unwrap_or_default());
    match result {
        Err(e) => dump(&format!("Search error: {e}")),
        Ok([]) => dump("No search results found."),
        Ok(per_query) => {
            let blocks: Vec<String> = per_query
                .iter()
                .map(|docs| {
                    let mut s = String::new();
                    for (i, d) in docs.iter().enumerate() {
                        let (title, text) = d.document.contents.split_once('\n').unwrap_or((&d.document.contents, ""));
                        s.push_str(&format!("Doc {} (Title: {title})\n{text}\n\n", i + 1));
                    }
                    s.trim().to_string()
                })
                .collect();
            dump(&blocks.join("\n---\n"))
        }
    }
}

/// The loop ready to run on a rollout rank: settings, the policy's chat tokenizer, clients.
pub struct ToolAgent {
    /// The settings.
    pub settings: ToolCallSettings,
    tok: ChatTokenizer,
    /// Tokens of the template's default system prompt, cut from rendered tool messages
    /// (verl's `initialize_system_prompt`).
    system_len: usize,
    /// A retrieval client per search tool (by index in `settings.tools`).
    clients: Vec<Option<RetrievalClient>>,
}

impl ToolAgent {
    /// Builds the agent: measures the template's system prompt and opens retrieval clients.
    pub fn new(settings: ToolCallSettings, tok: ChatTokenizer) -> Result<Self, TrainError> {
        let user = json!({"role": "user", "content": ""});
        let plain = RenderOptions::generation(false);
        let enc = |msgs: &[Json]| tok.encode_chat(msgs, &plain).map_err(|e| TrainError::Other(format!("tools.calls: rendering with the chat template: {e}")));
        let one = enc(std::slice::from_ref(&user))?.len();
        let two = enc(&[user.clone(), user])?.len();
        // verl: token1[: -(len(token2) - len(token1))], Python slicing (`[:-0]` is empty).
        let system_len = match two.saturating_sub(one) {
            0 => 0,
            d => one.saturating_sub(d),
        };
        let clients = settings
            .tools
            .iter()
            .map(|t| match &t.kind {
                ToolKind::Search { url, topk, timeout_s } => RetrievalClient::new(url, *topk, Duration::from_secs_f64(*timeout_s), 2, Duration::from_millis(500))
                    .map(Some)
                    .map_err(|e| TrainError::Other(format!("tools.calls: tool `{}`: {e}", t.name))),
                ToolKind::Gsm8k => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        let agent = Self { settings, tok, system_len, clients };
        // A template that cannot show a tool or user message fails here, not at the first call.
        for role in ["tool", "user"] {
            agent.render_turn(role, &["x"])?;
        }
        Ok(agent)
    }

    /// Token ids of one turn's messages from `role` (tool answers, or the simulated user), as
    /// verl appends them.
    fn render_turn(&self, role: &str, texts: &[&str]) -> Result<Vec<u32>, TrainError> {
        let msgs: Vec<Json> = texts.iter().map(|t| json!({"role": role, "content": t})).collect();
        let opts = RenderOptions { extra: self.settings.chat_template_kwargs.clone(), ..RenderOptions::generation(true) };
        let ids = self.tok.encode_chat(&msgs, &opts).map_err(|e| TrainError::Other(format!("tools.calls: rendering tool messages: {e}")))?;
        Ok(ids.get(self.system_len..).unwrap_or_default().to_vec())
    }
}

/// A trajectory and verl's counts.
struct Row {
    g: Growing,
    assistant_turns: u32,
    user_turns: u32,
    parsed: u32,
    calls: u32,
    tools: ToolResults,
}

/// A call waiting for its tool: which row, which call of the turn.
struct Pending {
    row: usize,
    call: FunctionCall,
}

/// Runs `params.n` trajectories per prompt (`params.max_new_tokens` is ignored: each turn gets
/// what is left of the response budget). `agent_kwargs[p]` is prompt `p`'s [`row_kwargs`]:
/// per-tool arguments (`tools_kwargs: {tool: {"create_kwargs": {...}}}`) and the interaction's
/// (`interaction_kwargs: {"name", "ground_truth", …}`); seeds key each trajectory as [`crate::search::rollout`]
/// does, so a batch split across rollout ranks samples what one engine would.
pub fn rollout(generate: &mut TurnGenerator<'_>, agent: &ToolAgent, prompts: &[Vec<u32>], agent_kwargs: &[Json], params: &SamplingParams) -> Result<MultiTurnRollout, TrainError> {
    let s = &agent.settings;
    if agent_kwargs.len() != prompts.len() {
        return Err(TrainError::Other(format!("tool-calling rollout: {} rows of tools_kwargs for {} prompts", agent_kwargs.len(), prompts.len())));
    }
    let budget = s.response_length;
    let mut rows: Vec<Row> = Growing::batch(prompts.len(), params)
        .into_iter()
        .map(|mut g| {
            g.live = budget > 0;
            Row { g, assistant_turns: 0, user_turns: 0, parsed: 0, calls: 0, tools: ToolResults::default() }
        })
        .collect();
    // Each prompt's interaction ground truth, checked as verl checks it (a bad row stops the run).
    let interacting = !s.interactions.is_empty();
    let truths: Vec<Option<Json>> = match interacting {
        false => vec![None; prompts.len()],
        true => (0..prompts.len()).map(|p| interaction_truth(s, agent_kwargs.get(p))).collect::<Result<_, _>>()?,
    };
    let mut out = MultiTurnRollout { flavour: Flavour::ToolCalls, ..Default::default() };
    let mut turn = 0u64;
    loop {
        let live: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].g.live).collect();
        if live.is_empty() {
            break;
        }
        // One call for all live rows, each capped at what is left of its own budget.
        let contexts: Vec<Vec<u32>> = live.iter().map(|&i| rows[i].g.context(prompts)).collect();
        let caps: Vec<usize> = live.iter().map(|&i| budget - rows[i].g.tokens.len()).collect();
        let turn_params = SamplingParams {
            n: 1,
            max_new_tokens: caps.iter().copied().max().unwrap_or(1),
            max_new_tokens_per_prompt: caps,
            seed: params.seed ^ ((turn + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)),
            first_prompt: 0,
            prompt_keys: live.iter().map(|&i| rows[i].g.key).collect(),
            ..params.clone()
        };
        turn += 1;
        let comps = generate(&contexts, &turn_params)?;
        if comps.len() != live.len() {
            return Err(TrainError::Other(format!("tool-calling rollout: {} completions for {} live trajectories", comps.len(), live.len())));
        }
        let mut answered: Vec<Option<Completion>> = vec![None; live.len()];
        for c in comps {
            let slot = answered.get_mut(c.prompt_index).ok_or_else(|| TrainError::Other("tool-calling rollout: completion for an unknown trajectory".into()))?;
            if slot.replace(c).is_some() {
                return Err(TrainError::Other("tool-calling rollout: two completions for one trajectory".into()));
            }
        }
        let mut pending: Vec<Pending> = Vec::new();
        for (&i, c) in live.iter().zip(answered) {
            let c = c.ok_or_else(|| TrainError::Other("tool-calling rollout: a trajectory got no completion".into()))?;
            let r = &mut rows[i];
            // Engines stop at the cap; a generator that does not is cut to it here.
            let room = budget - r.g.tokens.len();
            let (ids, finish) = if c.token_ids.len() > room { (&c.token_ids[..room], FinishReason::Length) } else { (&c.token_ids[..], c.finish_reason) };
            r.g.sampled(ids, &c.logprobs, finish);
            r.assistant_turns += 1;
            let limit = |max: Option<usize>, n: u32| max.is_some_and(|m| m > 0 && n as usize >= m);
            if r.g.tokens.len() >= budget || limit(s.max_assistant_turns, r.assistant_turns) || limit(s.max_user_turns, r.user_turns) {
                r.g.live = false;
                continue;
            }
            let text = agent.tok.tokenizer().decode(ids, false).map_err(|e| TrainError::Other(e.to_string()))?;
            let calls = parse_hermes(&text);
            r.parsed += calls.len() as u32;
            if calls.is_empty() && interacting {
                // The simulated user reads the turn as the chat shows it (special tokens dropped).
                let content = agent.tok.tokenizer().decode(ids, true).map_err(|e| TrainError::Other(e.to_string()))?;
                let (done, reply, score) = gsm8k_interaction(&content, truths[r.g.prompt].as_ref());
                r.user_turns += 1;
                r.tools.turn_scores.push(score);
                let ids = agent.render_turn("user", &[reply])?;
                // verl appends the reply without a budget check; the response is cut to the
                // budget at the end, so what would not fit is never seen.
                let fits = budget - r.g.tokens.len();
                r.g.observe(&ids[..ids.len().min(fits)]);
                if done || ids.len() >= fits {
                    r.g.live = false;
                    r.g.finished = done;
                    // verl then asks for one more turn past the budget (cut away, but counted
                    // in num_turns); it is not sampled here, only counted.
                    r.assistant_turns += u32::from(!done);
                }
                continue;
            }
            if calls.is_empty() {
                r.g.live = false;
                r.g.finished = true;
                continue;
            }
            pending.extend(calls.into_iter().take(s.max_parallel_calls.max(1)).map(|call| Pending { row: i, call }));
        }
        let answers = run_calls(agent, &pending, &rows, agent_kwargs, &mut out)?;
        // Each row's answers in call order, rendered as one tool turn.
        let mut k = 0;
        while k < pending.len() {
            let i = pending[k].row;
            let mut texts = Vec::new();
            while k < pending.len() && pending[k].row == i {
                let a = &answers[k];
                texts.push(a.text.as_str());
                rows[i].calls += 1;
                rows[i].tools.rewards.push(a.reward);
                rows[i].tools.errors += u32::from(a.error);
                k += 1;
            }
            let ids = agent.render_turn("tool", &texts)?;
            let r = &mut rows[i];
            if r.g.tokens.len() + ids.len() >= budget {
                r.g.live = false;
                continue;
            }
            r.g.observe(&ids);
            r.user_turns += 1;
        }
    }
    out.trajectories = rows.into_iter().map(|r| r.g.into_trajectory(r.assistant_turns + r.user_turns + 1, r.parsed, r.calls, r.tools)).collect();
    Ok(out)
}

/// A tool's answer to one call.
#[derive(Clone)]
struct Answer {
    text: String,
    /// The step reward (verl's `tool_reward`).
    reward: f64,
    /// An error text (unknown tool, bad arguments, a failed request).
    error: bool,
    /// Raised in the tool (verl's `except` in `_call_tool`): its text is not truncated.
    raised: bool,
}

impl Answer {
    fn ok(text: String, reward: f64) -> Self {
        Self { text, reward, error: false, raised: false }
    }

    /// verl's `Error when executing tool: {e}` (reward 0).
    fn raised(e: String) -> Self {
        Self { text: format!("Error when executing tool: {e}"), reward: 0.0, error: true, raised: true }
    }

    /// An error the tool itself words and returns (truncated like any answer).
    fn failed(text: String) -> Self {
        Self { text, reward: 0.0, error: true, raised: false }
    }
}

/// Answers every pending call. Search calls of the turn go to each server in one request
/// (results split back per call).
fn run_calls(agent: &ToolAgent, pending: &[Pending], rows: &[Row], agent_kwargs: &[Json], out: &mut MultiTurnRollout) -> Result<Vec<Answer>, TrainError> {
    let s = &agent.settings;
    let error = Answer::raised;
    let mut answers: Vec<Option<Answer>> = vec![None; pending.len()];
    // Search calls per tool index: (pending index, queries).
    let mut searches: Vec<Vec<(usize, Vec<String>)>> = vec![Vec::new(); s.tools.len()];
    for (k, p) in pending.iter().enumerate() {
        let Some(t) = s.tools.iter().position(|t| t.name == p.call.name) else {
            answers[k] = Some(error(repr_json(&Json::String(p.call.name.clone()))));
            continue;
        };
        // tools_kwargs.get(name, {}).get("create_kwargs", {}), as verl reads them.
        let kwargs = match agent_kwargs.get(rows[p.row].g.prompt).and_then(|m| m.get("tools_kwargs")) {
            None => None,
            Some(Json::Object(m)) => m.get(&p.call.name),
            // A row's tools_kwargs that is not a mapping (null): verl's `.get` raises.
            Some(other) => {
                answers[k] = Some(error(format!("'{}' object has no attribute 'get'", py_type(other))));
                continue;
            }
        };
        let create = match kwargs {
            None => Json::Object(Map::new()),
            Some(Json::Object(m)) => m.get("create_kwargs").cloned().unwrap_or_else(|| json!({})),
            Some(other) => {
                answers[k] = Some(error(format!("'{}' object has no attribute 'get'", py_type(other))));
                continue;
            }
        };
        match &s.tools[t].kind {
            // Gsm8kTool.create reads create_kwargs.get("ground_truth"): not a mapping raises.
            ToolKind::Gsm8k if !create.is_object() => answers[k] = Some(error(format!("'{}' object has no attribute 'get'", py_type(&create)))),
            ToolKind::Gsm8k => {
                let gt = create.get("ground_truth");
                answers[k] = Some(match gsm8k_execute(&p.call.arguments, gt) {
                    Ok((text, reward)) => Answer::ok(text, reward),
                    Err(e) => error(e),
                });
            }
            ToolKind::Search { .. } => match &p.call.arguments {
                Json::Object(m) => match m.get("query_list") {
                    Some(Json::Array(q)) if !q.is_empty() => searches[t].push((k, q.iter().map(str_json).collect())),
                    _ => answers[k] = Some(Answer::failed(search_arg_error())),
                },
                other => answers[k] = Some(error(format!("'{}' object has no attribute 'get'", py_type(other)))),
            },
        }
    }
    for (t, calls) in searches.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
        let client = agent.clients[t].as_ref().ok_or_else(|| TrainError::Other(format!("tools.calls: no client for `{}`", s.tools[t].name)))?;
        let queries: Vec<String> = calls.iter().flat_map(|(_, q)| q.iter().cloned()).collect();
        let t0 = Instant::now();
        let result = client.retrieve(&queries);
        out.retrieval_s.push(t0.elapsed().as_secs_f64());
        out.queries += queries.len();
        let mut at = 0;
        for (k, q) in calls {
            answers[*k] = Some(match &result {
                Ok((hits, _)) => Answer::ok(search_result_text(Ok(hits.get(at..at + q.len()).unwrap_or_default())), 0.0),
                Err(e) => {
                    tracing::warn!(tool = %s.tools[t].name, "retrieval request failed: {e}");
                    Answer::failed(search_result_text(Err(e.to_string())))
                }
            });
            at += q.len();
        }
    }
    let truncate = |a: Answer| match a.raised {
        true => a,
        false => Answer { text: truncate_response(&a.text, s.max_tool_response_length, s.truncate_side), ..a },
    };
    answers.into_iter().map(|a| a.map(truncate).ok_or_else(|| TrainError::Other("tools.calls: a call went unanswered".into()))).collect()
}

/// The ground truth a row gives its interaction; verl's errors for a row without a usable
/// `interaction_kwargs` (they stop its run too).
fn interaction_truth(s: &ToolCallSettings, kwargs: Option<&Json>) -> Result<Option<Json>, TrainError> {
    let ik = kwargs.and_then(|k| k.get("interaction_kwargs")).filter(|v| !v.is_null());
    let name = match ik.and_then(|k| k.get("name")) {
        Some(n) => str_json(n),
        None => return Err(TrainError::Other("tools.calls: a row's extra_info.interaction_kwargs has no 'name' (verl: \"'name' key is required in interaction_kwargs\"); add the interaction's name to every row".into())),
    };
    if !s.interactions.iter().any(|i| i.name == name) {
        let known: Vec<String> = s.interactions.iter().map(|i| repr_json(&Json::String(i.name.clone()))).collect();
        return Err(TrainError::Other(format!(
            "tools.calls: Interaction '{name}' not found in interaction_map. Available interactions: [{}] (a row's extra_info.interaction_kwargs.name must name one in tools.calls.interaction_config_path)",
            known.join(", ")
        )));
    }
    Ok(ik.and_then(|k| k.get("ground_truth")).cloned())
}

/// verl's SearchTool text for a missing or empty `query_list` (`json.dumps`, ASCII-escaped).
fn search_arg_error() -> String {
    "{\"result\": \"Error: 'query_list' is missing, empty, or not a list in parameters.\"}".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_blocks_parse_like_verls_regex() {
        let calls = parse_hermes("a<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call> b <tool_call>{bad}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": \"s\"}</tool_call>");
        assert_eq!(calls, vec![FunctionCall { name: "f".into(), arguments: json!({"x": 1}) }, FunctionCall { name: "g".into(), arguments: json!("s") }]);
        assert!(parse_hermes("<tool_call>{\"name\": \"f\", \"arguments\": {}}").is_empty());
        assert!(parse_hermes("<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>").is_empty());
        assert!(parse_hermes("<tool_call>{\"name\": \"f\"}</tool_call>").is_empty());
        // Non-greedy: the first close ends the first block.
        assert_eq!(parse_hermes("<tool_call> x <tool_call>{\"name\": \"f\", \"arguments\": 1}</tool_call>").len(), 0);
    }

    #[test]
    fn long_responses_are_cut_as_verl_cuts_them() {
        assert_eq!(truncate_response("abcdefghij", 4, TruncateSide::Left), "abcd...(truncated)");
        assert_eq!(truncate_response("abcdefghij", 4, TruncateSide::Right), "(truncated)...ghij");
        assert_eq!(truncate_response("abcdefghij", 4, TruncateSide::Middle), "ab...(truncated)...ij");
        assert_eq!(truncate_response("abcdefghij", 1, TruncateSide::Middle), "...(truncated)...abcdefghij");
        assert_eq!(truncate_response("ééé", 3, TruncateSide::Left), "ééé");
    }

    #[test]
    fn gsm8k_flexible_matches_verls_extractor() {
        assert_eq!(gsm8k_flexible("#### 72").as_deref(), Some("72"));
        assert_eq!(gsm8k_flexible("#### 1,000.").as_deref(), Some("1,000."));
        assert_eq!(gsm8k_flexible("#### -5 and .").as_deref(), Some("-5"));
        assert_eq!(gsm8k_flexible("#### . .").as_deref(), Some("."));
        assert_eq!(gsm8k_flexible("#### ").as_deref(), None);
        assert_eq!(gsm8k_flexible("a-b").as_deref(), None);
    }

    #[test]
    fn schemas_keep_pydantics_fields_in_its_order() {
        let raw = json!({"function": {"parameters": {"required": ["q"], "properties": {"q": {"item": {"type": "string"}, "description": "d", "type": "array"}}, "type": "object"}, "description": "x", "name": "search"}, "type": "function"});
        let s = normalize_schema(&raw).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"type":"function","function":{"name":"search","description":"x","parameters":{"type":"object","properties":{"q":{"type":"array","description":"d"}},"required":["q"]}}}"#);
        assert!(normalize_schema(&json!({"type": "function", "function": {"name": "f"}})).unwrap_err().contains("description"));
    }
}
