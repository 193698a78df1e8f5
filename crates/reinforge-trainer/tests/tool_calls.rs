//! verl's tool agent against verl's own: `tests/data/tool_agent_golden.json` holds what verl's
//! `ToolAgentLoop.run` (b178a3cd, its real tool parser, Gsm8kTool, Gsm8kInteraction and system-prompt stripping;
//! `tests/data/make_tool_agent_golden.py`) made of scripted model turns with Qwen2.5's tokenizer
//! and template. The same turns go through our loop: the prompt with the tools' schemas, every
//! response token, the mask, the log-probs, the turn count, the tool rewards and the turn scores must be equal.
//! Then the search tool's text against verl's formatting, and the loop against a real
//! retrieval server.

use std::path::PathBuf;
use std::sync::Arc;

use reinforge_engine::{Completion, FinishReason, SamplingParams};
use reinforge_retrieval::index::{self, IndexOptions};
use reinforge_retrieval::server::{self, ServeOptions};
use reinforge_retrieval::{Passage, Retriever, RetrieverKind, ScoredDoc};
use reinforge_tokenizer::{ChatTemplate, ChatTokenizer, RenderOptions, Tokenizer};
use reinforge_trainer::tool_calls::{load_interaction_config, load_tool_config, rollout, search_result_text, ToolAgent, ToolCallSettings, ToolKind, ToolSpec, TruncateSide};
use serde_json::{json, Value};

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn qwen() -> ChatTokenizer {
    let fx = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/chat_templates");
    ChatTokenizer::new(Tokenizer::from_file(fx.join("qwen2_5_tokenizer.json")).unwrap(), ChatTemplate::from_file(fx.join("qwen2_5.jinja")).unwrap())
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data().join("tool_agent_golden.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn settings(tools: Vec<ToolSpec>, case: &Value) -> ToolCallSettings {
    let mt = &case["multi_turn"];
    let limit = |v: &Value| v.as_u64().map(|n| n as usize);
    let interactions = match case["interaction"].as_bool() {
        Some(true) => load_interaction_config(&data().join("gsm8k_interaction_config.yaml")).unwrap(),
        _ => Vec::new(),
    };
    ToolCallSettings {
        tools,
        interactions,
        max_assistant_turns: limit(&mt["max_assistant_turns"]),
        max_user_turns: limit(&mt["max_user_turns"]),
        max_parallel_calls: mt["max_parallel_calls"].as_u64().unwrap() as usize,
        max_tool_response_length: mt["max_tool_response_length"].as_u64().unwrap() as usize,
        truncate_side: serde_json::from_value(mt["tool_response_truncate_side"].clone()).unwrap(),
        response_length: case["response_length"].as_u64().unwrap() as usize,
        chat_template_kwargs: Default::default(),
    }
}

/// What the loop reads of a case's row: its tools' and interaction's kwargs.
fn row(case: &Value) -> Value {
    json!({"tools_kwargs": case["tools_kwargs"], "interaction_kwargs": case.get("interaction_kwargs").cloned().unwrap_or(Value::Null)})
}

/// A generator that answers each trajectory's `k`-th call with its `k`-th scripted turn, whole
/// (as verl's scripted server did: the loop must cut to the budget itself).
fn scripted(turns: Vec<Vec<u32>>, eos: u32, calls: &mut usize) -> impl FnMut(&[Vec<u32>], &SamplingParams) -> Result<Vec<Completion>, reinforge_trainer::TrainError> + '_ {
    move |ctx: &[Vec<u32>], p: &SamplingParams| {
        assert_eq!(ctx.len(), 1);
        assert_eq!(p.n, 1);
        let token_ids = turns[*calls].clone();
        *calls += 1;
        let finish = if token_ids.last() == Some(&eos) { FinishReason::StopToken(eos) } else { FinishReason::Length };
        Ok(vec![Completion { prompt_index: 0, sample_index: 0, logprobs: vec![-0.5; token_ids.len()], token_ids, finish_reason: finish }])
    }
}

#[test]
fn trajectories_equal_verls_tool_agent_loop() {
    let g = golden();
    let tok = qwen();
    let tools = load_tool_config(&data().join("gsm8k_tool_config.yaml")).unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].kind, ToolKind::Gsm8k);
    assert_eq!(tools[0].schema, g["tool_schemas"][0], "the schema the template sees");
    let eos = g["eos_id"].as_u64().unwrap() as u32;
    let mut checked = 0;
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        // verl's own bug: an empty generation makes `prompt_ids[-0:]` the whole prompt.
        if name == "empty_generation" {
            continue;
        }
        let agent = ToolAgent::new(settings(tools.clone(), case), tok.clone()).unwrap();
        let opts = RenderOptions { tools: Some(agent.settings.schemas()), ..RenderOptions::generation(true) };
        let messages: Vec<Value> = case["messages"].as_array().unwrap().clone();
        let prompt = tok.encode_chat(&messages, &opts).unwrap();

        if let Some(e) = case["error"].as_str() {
            // verl stops the run on such a row; so do we, with its words.
            let mut calls = 0;
            let mut generate = scripted(Vec::new(), eos, &mut calls);
            let err = rollout(&mut generate, &agent, &[prompt], &[row(case)], &SamplingParams::default()).unwrap_err().to_string();
            assert!(err.contains(e), "{name}: {err} vs {e}");
            checked += 1;
            continue;
        }
        assert_eq!(prompt, ids(&case["prompt_ids"]), "{name}: the prompt with the tools' schemas");
        let turns: Vec<Vec<u32>> = case["turns"].as_array().unwrap().iter().map(ids).collect();
        let mut calls = 0;
        let out = {
            let mut generate = scripted(turns, eos, &mut calls);
            let params = SamplingParams { n: 1, seed: 3, ..Default::default() };
            rollout(&mut generate, &agent, &[prompt], &[row(case)], &params).unwrap()
        };
        let t = &out.trajectories[0];
        let budget = case["response_length"].as_u64().unwrap() as usize;
        match case["generate_calls"].as_u64().unwrap() as usize {
            // verl samples one turn past a simulated user's reply that spent the budget, all of
            // it cut; it is counted here, not sampled.
            want if want == calls + 1 && case["interaction"] == json!(true) => assert_eq!(t.completion.token_ids.len(), budget, "{name}"),
            want => assert_eq!(calls, want, "{name}: generate calls"),
        }
        assert_eq!(t.completion.token_ids, ids(&case["response_ids"]), "{name}: response ids");
        let mask: Vec<bool> = case["response_mask"].as_array().unwrap().iter().map(|m| m.as_u64() == Some(1)).collect();
        assert_eq!(t.model_mask, mask, "{name}: mask");
        let lp: Vec<f32> = case["response_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        // After an empty first turn verl stops padding log-probs (its list is still empty, so
        // falsy): its log-probs no longer line up with its tokens. Ours do.
        if lp.len() == t.completion.token_ids.len() {
            assert_eq!(t.completion.logprobs, lp, "{name}: log-probs");
        } else {
            assert!(name.contains("empty"), "{name}: verl's log-probs are out of step");
            assert_eq!(t.completion.logprobs.len(), t.completion.token_ids.len());
        }
        assert_eq!(t.turns as u64, case["num_turns"].as_u64().unwrap(), "{name}: num_turns");
        let rewards: Vec<f64> = case["tool_rewards"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(t.tool_rewards, rewards, "{name}: tool rewards");
        let scores: Vec<f64> = case.get("turn_scores").and_then(Value::as_array).map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect()).unwrap_or_default();
        assert_eq!(t.turn_scores, scores, "{name}: turn scores");
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} cases");
}

#[test]
fn tool_texts_equal_verls() {
    // The texts verl appended (its _call_tool results), through our tools and truncation.
    let g = golden();
    let tok = qwen();
    let tools = load_tool_config(&data().join("gsm8k_tool_config.yaml")).unwrap();
    let eos = g["eos_id"].as_u64().unwrap() as u32;
    for case in g["cases"].as_array().unwrap().iter().filter(|c| c["tool_texts"].as_array().is_some_and(|t| !t.is_empty())) {
        let name = case["name"].as_str().unwrap();
        let agent = ToolAgent::new(settings(tools.clone(), case), tok.clone()).unwrap();
        let turns: Vec<Vec<u32>> = case["turns"].as_array().unwrap().iter().map(ids).collect();
        let mut calls = 0;
        let mut generate = scripted(turns, eos, &mut calls);
        let out = rollout(&mut generate, &agent, &[vec![1]], &[row(case)], &SamplingParams::default()).unwrap();
        // Each appended tool block decodes to verl's texts inside <tool_response> tags.
        let t = &out.trajectories[0];
        let mut shown = String::new();
        for (i, &m) in t.model_mask.iter().enumerate() {
            if !m {
                shown.push_str(&tok.tokenizer().decode(&t.completion.token_ids[i..i + 1], false).unwrap());
            }
        }
        let appended: Vec<&str> = shown.split("<tool_response>\n").skip(1).map(|s| s.split("\n</tool_response>").next().unwrap()).collect();
        let want: Vec<&str> = case["tool_texts"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
        assert_eq!(appended, want[..appended.len()], "{name}");
        assert!(!appended.is_empty() || name.contains("overflows") || name.contains("fills"), "{name}: no tool text appended");
    }
}

#[test]
fn search_texts_equal_verls() {
    let g = golden();
    for case in g["search_texts"].as_array().unwrap() {
        let got = match case["error"].as_str() {
            Some(e) => search_result_text(Err(e.to_string())),
            None => {
                let per_query: Vec<Vec<ScoredDoc>> = case["api_response"]["result"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|docs| docs.as_array().unwrap().iter().map(|d| ScoredDoc { document: Passage { id: "0".into(), contents: d["document"]["contents"].as_str().unwrap().into() }, score: 1.0 }).collect())
                    .collect();
                search_result_text(Ok(&per_query))
            }
        };
        assert_eq!(got, case["result_text"].as_str().unwrap(), "{:?}", case["queries"]);
    }
}

#[test]
fn search_calls_reach_a_real_retrieval_server() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = [Passage { id: "0".into(), contents: "\"Quenul\"\nThe quenul is blue.".into() }, Passage { id: "1".into(), contents: "\"Velkov\"\nThe velkov is green.".into() }];
    let corpus = tmp.path().join("corpus.jsonl");
    std::fs::write(&corpus, rows.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect::<String>()).unwrap();
    index::build(&corpus, &tmp.path().join("idx"), &IndexOptions { threads: 1, ..Default::default() }, &|_| {}).unwrap();
    let r = Arc::new(Retriever::open(&tmp.path().join("idx"), RetrieverKind::Bm25).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || server::serve(r, ServeOptions { host: "127.0.0.1".into(), port: 0, ..Default::default() }, move |a| tx.send(a).unwrap(), None));
    let url = format!("http://{}/retrieve", rx.recv().unwrap());

    let yaml = format!(
        "tools:\n  - class_name: verl.tools.search_tool.SearchTool\n    config:\n      retrieval_service_url: {url}\n      topk: 1\n      type: native\n    tool_schema:\n      type: function\n      function:\n        name: search\n        description: Searches.\n        parameters:\n          type: object\n          properties:\n            query_list:\n              type: array\n              item:\n                type: string\n              description: queries\n          required: [query_list]\n"
    );
    std::fs::write(tmp.path().join("tools.yaml"), yaml).unwrap();
    let tools = load_tool_config(&tmp.path().join("tools.yaml")).unwrap();
    // pydantic drops the misspelt `item`, so the template never sees it.
    assert_eq!(tools[0].schema["function"]["parameters"]["properties"]["query_list"], json!({"type": "array", "description": "queries"}));
    let tok = qwen();
    let agent = ToolAgent::new(
        ToolCallSettings { tools, interactions: Vec::new(), max_assistant_turns: Some(3), max_user_turns: None, max_parallel_calls: 1, max_tool_response_length: 1000, truncate_side: TruncateSide::Middle, response_length: 400, chat_template_kwargs: Default::default() },
        tok.clone(),
    )
    .unwrap();
    let enc = |s: &str| tok.tokenizer().encode(s, false).unwrap();
    let eos = tok.tokenizer().token_to_id("<|im_end|>").unwrap();
    // Two trajectories: one searches (two queries in one call) then answers; one answers at once.
    let mut generate = |ctx: &[Vec<u32>], p: &SamplingParams| -> Result<Vec<Completion>, reinforge_trainer::TrainError> {
        Ok(ctx
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let searching = p.prompt_keys[i] == 0 && c.len() < 10;
                let text = if searching { "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query_list\": [\"quenul\", \"velkov\"]}}\n</tool_call>" } else { "blue" };
                let mut token_ids = enc(text);
                token_ids.push(eos);
                Completion { prompt_index: i, sample_index: 0, logprobs: vec![-1.0; token_ids.len()], token_ids, finish_reason: FinishReason::StopToken(eos) }
            })
            .collect())
    };
    let params = SamplingParams { n: 1, ..Default::default() };
    let out = rollout(&mut generate, &agent, &[vec![9], vec![9]], &[json!({}), json!({})], &params).unwrap();
    assert_eq!(out.queries, 2);
    let t = &out.trajectories[0];
    assert_eq!((t.turns, t.tool_calls, t.finished), (4, 1, true));
    let obs: Vec<u32> = t.completion.token_ids.iter().zip(&t.model_mask).filter(|(_, m)| !**m).map(|(x, _)| *x).collect();
    let shown = tok.tokenizer().decode(&obs, false).unwrap();
    assert!(
        shown.contains(r#"{"result": "Doc 1 (Title: \"Quenul\")\nThe quenul is blue.\n---\nDoc 1 (Title: \"Velkov\")\nThe velkov is green."}"#),
        "{shown}"
    );
    assert_eq!((out.trajectories[1].turns, out.trajectories[1].tool_calls), (2, 0));
}

#[test]
fn a_grpo_run_calls_the_tool_and_reads_its_answers() {
    // tests/data/tiny-tools: one token per whole call (see its make_tiny_tools.py) and verl's
    // gsm8k_multiturn_w_tool rows (the ground truth for the reward and for the tool).
    let tmp = tempfile::tempdir().unwrap();
    let model = data().join("tiny-tools");
    // A verl reward function that reports the turn count verl gives it (extra_info["num_turns"]).
    std::fs::write(tmp.path().join("reward.py"), "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {'score': float(ground_truth in solution_str), 'turns': extra_info['num_turns']}\n").unwrap();
    let run = tmp.path().join("run");
    let text = format!(
        r#"
[data]
train_files = ["{data}"]
max_prompt_length = 32
max_response_length = 48
train_batch_size = 4
[actor]
model = "{model}"
init = "random"
init_seed = 3
lr = 1e-3
ppo_mini_batch_size = 4
ppo_micro_batch_size = 16
[rollout]
n = 4
[reward]
kind = "python"
params = {{ path = "{reward}" }}
[tools.calls]
enable = true
tool_config_path = "{tools}"
max_assistant_turns = 3
[trainer]
default_local_dir = "{run}"
total_steps = 3
test_freq = 0
save_freq = 0
log_train_samples = 16
logger = ["jsonl"]
"#,
        data = model.join("train.jsonl").display(),
        model = model.display(),
        tools = data().join("gsm8k_tool_config.yaml").display(),
        run = run.display(),
        reward = tmp.path().join("reward.py").display(),
    );
    let cfg = reinforge_trainer::TrainConfig::from_str_with(&text, "test", &[]).unwrap();
    let summary = reinforge_trainer::train(&cfg, &reinforge_checkpoint::Resume::None, Arc::new(std::sync::atomic::AtomicBool::new(false))).unwrap();
    assert_eq!(summary.steps, 3);
    let calls: f64 = summary.history.iter().map(|m| m.get("tool_calls/mean").unwrap()).sum();
    assert!(calls > 0.0, "no tool was called in three steps");
    for m in &summary.history {
        assert!(m.get("num_turns/max").unwrap() >= m.get("num_turns/min").unwrap() && m.get("num_turns/min").unwrap() >= 2.0);
        assert!(m.get("actor/pg_loss").is_some());
        assert_eq!(m.get("reward/turns/mean"), m.get("num_turns/mean"), "the reward function saw each trajectory's turns");
    }
    // The prompt shows the tools; the tool's answers sit in the responses as observations.
    let samples: Vec<Value> = std::fs::read_to_string(run.join("samples.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(samples.iter().all(|s| s["prompt"].as_str().unwrap().starts_with("tools : calc_gsm8k_reward what is")), "{}", samples[0]["prompt"]);
    let observed: Vec<&str> = samples.iter().flat_map(|s| s["turns"].as_array().unwrap().iter()).filter(|t| t["role"] == "observation").map(|t| t["text"].as_str().unwrap()).collect();
    assert!(!observed.is_empty(), "no tool answer in the logged samples");
    assert!(observed.iter().all(|o| o.starts_with("<tool_response> current parsed answer =' ") && o.ends_with("</tool_response> assistant :")), "{observed:?}");
    // Some guess was right and the tool said so (reward=1.0), some wrong (0.0).
    let right = observed.iter().filter(|o| o.contains("reward = 1 . 0")).count();
    assert!(right > 0 && right < observed.len(), "{right} of {} tool answers say right", observed.len());
}

#[test]
fn each_row_is_capped_at_its_own_budget_and_raised_errors_are_not_cut() {
    let tok = qwen();
    let tools = load_tool_config(&data().join("gsm8k_tool_config.yaml")).unwrap();
    let budget = 200;
    let settings = ToolCallSettings {
        tools,
        interactions: Vec::new(),
        max_assistant_turns: Some(3),
        max_user_turns: None,
        max_parallel_calls: 1,
        max_tool_response_length: 12,
        truncate_side: TruncateSide::Middle,
        response_length: budget,
        chat_template_kwargs: Default::default(),
    };
    let agent = ToolAgent::new(settings, tok.clone()).unwrap();
    let eos = tok.tokenizer().token_to_id("<|im_end|>").unwrap();
    let enc = |s: &str| {
        let mut ids = tok.tokenizer().encode(s, false).unwrap();
        ids.push(eos);
        ids
    };
    let call = "<tool_call>\n{\"name\": \"calc_gsm8k_reward\", \"arguments\": {\"answer\": \"72\"}}\n</tool_call>";
    let unknown = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    // Row 0: a long prompt and a long first turn; row 1: a short prompt and a short turn. They
    // share each round's call, each capped at its own budget left (row 1's, applied to row 0,
    // would take it past prompt + data.max_response_length).
    let script: Vec<Vec<Vec<u32>>> = vec![vec![enc(&format!("{}{call}", "step ".repeat(80))), enc("#### 72")], vec![enc(unknown), enc("#### 72")]];
    let prompts = vec![vec![100u32; 100], vec![100u32; 5]];
    let prompts_len = [100, 5];
    let limit = 100 + budget;
    let mut turn_of = [0usize; 2];
    let mut calls = 0;
    let mut generate = |ctx: &[Vec<u32>], p: &SamplingParams| -> Result<Vec<Completion>, reinforge_trainer::TrainError> {
        calls += 1;
        assert_eq!(p.max_new_tokens_per_prompt.len(), ctx.len());
        assert_eq!(p.max_new_tokens, *p.max_new_tokens_per_prompt.iter().max().unwrap());
        Ok(ctx
            .iter()
            .enumerate()
            .map(|(i, c)| {
                assert_eq!(c.len() + p.max_new_for(i), prompts_len[p.prompt_keys[i] as usize] + budget, "row {i}: capped at its own budget left");
                assert!(c.len() + p.max_new_for(i) <= limit);
                let row = p.prompt_keys[i] as usize;
                let token_ids = script[row][turn_of[row]].clone();
                turn_of[row] += 1;
                Completion { prompt_index: i, sample_index: 0, logprobs: vec![-0.5; token_ids.len()], token_ids, finish_reason: FinishReason::StopToken(eos) }
            })
            .collect())
    };
    let out = rollout(&mut generate, &agent, &prompts, &[json!({}), json!({})], &SamplingParams { n: 1, ..Default::default() }).unwrap();
    assert_eq!(turn_of, [2, 2]);
    assert_eq!(calls, 2, "one call per round for both rows");
    let shown = |t: &reinforge_trainer::multi_turn::Trajectory| {
        let obs: Vec<u32> = t.completion.token_ids.iter().zip(&t.model_mask).filter(|(_, m)| !**m).map(|(x, _)| *x).collect();
        tok.tokenizer().decode(&obs, false).unwrap()
    };
    // A tool's own answer is cut to max_tool_response_length; verl's raised errors are not.
    assert!(shown(&out.trajectories[0]).contains("<tool_response>\nCurren...(truncated)...rd=0.0\n</tool_response>"), "{}", shown(&out.trajectories[0]));
    assert!(shown(&out.trajectories[1]).contains("<tool_response>\nError when executing tool: 'calculator'\n</tool_response>"), "{}", shown(&out.trajectories[1]));
    assert_eq!(out.trajectories[1].tool_errors, 1);
}
